"""Run in a subprocess with 8 forced CPU devices (see test_sharded.py): a sharded SFT step equals
the single-device step, a sharded PPO update over micro-batches of different lengths equals the
single-device one, and a checkpoint saved on 8 devices restores onto 1 device."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from conftest import tiny_llama, toy_trajectories
from flax import nnx

from spa_jax.models import ValueModel
from spa_jax.sharding import make_mesh, shard_model
from spa_jax.training import steps
from spa_jax.training.checkpoint import Checkpointer
from spa_jax.training.batch import trim_to_steps
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


def ppo_update(mesh):
  """One PPO update on 8 trajectories as two length-sorted micro-batches of 4, each cut to its own steps."""
  local = toy_trajectories(num_rows=8)
  rng = np.random.default_rng(0)
  with jax.set_mesh(mesh):
    policy = create_train_state(shard_model(tiny_llama(0), mesh), TX)
    critic = create_train_state(shard_model(ValueModel(tiny_llama(1), nnx.Rngs(101), init_std=0.1), mesh), TX)
    whole = to_global_batch(local, mesh)
    old_logp_bt = np.asarray(steps.forward_logprobs(policy, whole))
    old_values_bs = np.asarray(steps.forward_step_values(critic, whole, at="start"))
  host = {key: np.asarray(x) for key, x in local.items()} | {
      "old_logp_bt": old_logp_bt, "old_values_bs": old_values_bs,
      "advantages_bt": rng.normal(size=old_logp_bt.shape).astype(np.float32),
      "returns_bs": rng.uniform(size=old_values_bs.shape).astype(np.float32)}
  order = np.argsort(host["step_end_idx_bs"].max(axis=1), kind="stable")
  micros = [trim_to_steps({key: x[rows] for key, x in host.items()}, length_bucket=4) for rows in (order[:4], order[4:])]
  assert micros[0]["tokens_bt"].shape[1] < micros[1]["tokens_bt"].shape[1]
  state = steps.PPOState(policy=policy, critic=critic)
  with jax.set_mesh(mesh):
    state, metrics = steps.make_ppo_step(state, steps.PPOConfig())(state, [to_global_batch(m, mesh) for m in micros])
  return state, metrics


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

  sharded_ppo, sharded_ppo_metrics = ppo_update(mesh8)
  single_ppo, single_ppo_metrics = ppo_update(mesh1)
  for name, value in single_ppo_metrics.items():
    np.testing.assert_allclose(sharded_ppo_metrics[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
  kernel = sharded_ppo.policy.params["layers"][0]["mlp"]["gate_proj"]["kernel"].get_value()
  assert kernel.sharding.spec == P("fsdp", "tensor"), kernel.sharding
  for a, b in zip(jax.tree.leaves(sharded_ppo), jax.tree.leaves(single_ppo)):
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
