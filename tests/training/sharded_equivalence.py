"""Run in a subprocess with 8 forced CPU devices (see test_sharded.py): a sharded SFT step equals
the single-device step, and a checkpoint saved on 8 devices restores onto 1 device."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from conftest import tiny_llama, toy_trajectories
from spa_jax.sharding import make_mesh, shard_model
from spa_jax.training import steps
from spa_jax.training.checkpoint import Checkpointer
from spa_jax.training.global_batch import to_global_batch
from spa_jax.training.optim import OptimizerConfig, make_optimizer
from spa_jax.training.train_state import abstract_train_state, create_train_state

TX = make_optimizer(OptimizerConfig(3e-3, weight_decay=0.01))


def train_two_steps(mesh):
  local_batch = toy_trajectories(num_rows=8)
  with jax.set_mesh(mesh):
    state = create_train_state(shard_model(tiny_llama(), mesh), TX)
    batch = to_global_batch(local_batch, mesh)
    sft_step = steps.make_sft_step(state, num_micro_batches=2)
    for _ in range(2):
      state, metrics = sft_step(state, batch)
  return state, metrics, batch


def main(checkpoint_dir: str) -> None:
  assert jax.device_count() == 8, jax.devices()
  mesh8 = make_mesh(data=2, fsdp=2, tensor=2)
  mesh1 = make_mesh(devices=jax.devices()[:1])
  sharded, sharded_metrics, batch = train_two_steps(mesh8)
  single, single_metrics, _ = train_two_steps(mesh1)

  assert batch["tokens_bt"].sharding.spec[0] == ("data", "fsdp"), batch["tokens_bt"].sharding
  kernel = sharded.params["layers"][0]["mlp"]["gate_proj"]["kernel"].get_value()
  assert kernel.sharding.spec == P("fsdp", "tensor"), kernel.sharding
  moment = sharded.opt_state[1][0].mu["layers"][0]["mlp"]["gate_proj"]["kernel"].get_value()
  assert moment.sharding == kernel.sharding, moment.sharding
  np.testing.assert_allclose(sharded_metrics["sft_loss"], single_metrics["sft_loss"], rtol=1e-5)
  # different reduction orders; Adam turns tiny gradient differences into < 1% of one update (3e-3)
  for a, b in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(single.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)

  with Checkpointer(checkpoint_dir, save_every=1) as checkpointer:
    checkpointer.save(int(sharded.step), sharded, {"data_position": 2})
  with Checkpointer(checkpoint_dir, save_every=1) as checkpointer:
    target = abstract_train_state(tiny_llama, TX, trainable="full", mesh=mesh1)
    restored, _ = checkpointer.restore(target)
  restored_kernel = restored.params["layers"][0]["mlp"]["gate_proj"]["kernel"].get_value()
  assert restored_kernel.sharding.device_set == {jax.devices()[0]}
  for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(a, b)
  print("SHARDED_OK")


if __name__ == "__main__":
  main(sys.argv[1])
