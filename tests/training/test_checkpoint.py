"""Orbax checkpoints: save -> restore -> continue equals an uninterrupted run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_llama, toy_trajectories
from spa_jax.sharding import make_mesh, shard_model
from spa_jax.training import steps
from spa_jax.training.checkpoint import Checkpointer, abstract_like, config_hash
from spa_jax.training.optim import OptimizerConfig, make_optimizer
from spa_jax.training.train_state import abstract_train_state, create_train_state

TX = make_optimizer(OptimizerConfig(3e-3, schedule="warmup_cosine", warmup_steps=1,
                                    total_steps=6, weight_decay=0.01))


def test_resume_matches_uninterrupted_run(tmp_path):
  mesh = make_mesh()
  batches = [{k: jnp.asarray(v) for k, v in toy_trajectories(seed=s).items()} for s in range(4)]
  state = create_train_state(shard_model(tiny_llama(), mesh), TX, seed=7)
  sft_step = steps.make_sft_step(state)
  run_config = {"lr": 3e-3, "preset": "tiny"}

  with Checkpointer(tmp_path, save_every=2, keep=2) as checkpointer:
    for i, batch in enumerate(batches):
      state, _ = sft_step(state, batch)
      checkpointer.save(int(state.step), state,
                        {"data_position": i + 1, "config_hash": config_hash(run_config)})
    uninterrupted = jax.tree.map(np.array, state)
    assert checkpointer.all_steps() == [2, 4]  # saves at 2 and 4, keep 2

  with Checkpointer(tmp_path, save_every=2, keep=2) as checkpointer:
    assert checkpointer.latest_step() == 4
    target = abstract_train_state(lambda: tiny_llama(seed=123), TX, trainable="full", mesh=mesh)
    resumed, metadata = checkpointer.restore(target, step=2)
  assert metadata == {"layer_layout": "unscanned", "data_position": 2,
                      "config_hash": config_hash(run_config)}
  assert int(resumed.step) == 2
  np.testing.assert_array_equal(resumed.rng, uninterrupted.rng)
  for batch in batches[metadata["data_position"]:]:
    resumed, _ = sft_step(resumed, batch)
  for a, b in zip(jax.tree.leaves(uninterrupted), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(a, b)


def test_restore_errors(tmp_path):
  with Checkpointer(tmp_path, save_every=1) as checkpointer:
    assert checkpointer.latest_step() is None
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
      checkpointer.restore({"x": jax.ShapeDtypeStruct((1,), jnp.float32)})
    checkpointer.save(1, {"x": jnp.ones(3)}, {"layer_layout": "scanned"})
    checkpointer.wait_until_finished()
    with pytest.raises(ValueError, match="layer layout"):
      checkpointer.restore(abstract_like({"x": jnp.ones(3)}))
  with pytest.raises(ValueError, match="save_every"):
    Checkpointer(tmp_path, save_every=0)


def test_config_hash_is_stable_and_sensitive():
  assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
  assert config_hash({"a": 1}) != config_hash({"a": 2})
