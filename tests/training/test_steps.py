"""Jitted update/forward steps on the tiny Llama: SFT, LoRA, progress estimator, PPO."""

import dataclasses
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from conftest import tiny_config, tiny_llama, toy_trajectories
from spa_jax.models import Llama, ValueModel, apply_lora
from spa_jax.training import steps
from spa_jax.sharding import make_mesh, shard_model
from spa_jax.training.batch import sum_tokens_per_step, trim_to_steps
from spa_jax.training.global_batch import global_batch_shapes, to_global_batch
from spa_jax.training.optim import OptimizerConfig, make_optimizer
from spa_jax.training.ppo_targets import ppo_targets
from spa_jax.training.rewards import step_rewards
from spa_jax.training.train_state import count_params, create_train_state


def lora_llama(seed=0):
  return apply_lora(tiny_llama(seed), rank=4, alpha=8, rngs=nnx.Rngs(seed + 1))


def value_model(seed=0):
  # a random head (C's default is zero) so that values differ per token from the start
  return ValueModel(tiny_llama(seed), nnx.Rngs(seed + 100), init_std=0.1)


def as_jnp(batch):
  return {k: jnp.asarray(v) for k, v in batch.items()}


def adamw(lr):
  return make_optimizer(OptimizerConfig(lr))


def test_sft_loss_decreases_and_micro_batching_is_exact():
  batch = as_jnp(toy_trajectories())
  full = create_train_state(tiny_llama(), adamw(3e-3))
  micro = create_train_state(tiny_llama(), adamw(3e-3))
  full_step = steps.make_sft_step(full, num_micro_batches=1)
  micro_step = steps.make_sft_step(micro, num_micro_batches=2)
  losses = []
  for _ in range(4):
    full, full_metrics = full_step(full, batch)
    micro, micro_metrics = micro_step(micro, batch)
    losses.append(float(full_metrics["sft_loss"]))
    np.testing.assert_allclose(micro_metrics["sft_loss"], full_metrics["sft_loss"], rtol=1e-5)
  assert losses[-1] < losses[0] - 0.3, losses
  assert int(full.step) == 4
  assert float(full_metrics["num_tokens"]) == float(batch["loss_mask_bt"].sum())
  for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(micro.params)):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)


def test_sft_steps_compiled_ahead_for_two_lengths_equal_the_jitted_step():
  """The SFT stage's path: one executable per padded length, compiled side by side before the loop,
  called in turn on the donated state; it gives the jitted step's losses and parameters."""
  mesh = make_mesh()  # every device: under --xla_force_host_platform_device_count=8, sharded
  lengths = (32, 48)
  local = {seq_len: {key: value for key, value in toy_trajectories(num_rows=8, seq_len=seq_len, seed=seq_len).items()
                     if key in ("tokens_bt", "positions_bt", "loss_mask_bt")} for seq_len in lengths}
  with jax.set_mesh(mesh):
    jitted_state = create_train_state(shard_model(tiny_llama(), mesh), adamw(3e-3))
    ahead_state = create_train_state(shard_model(tiny_llama(), mesh), adamw(3e-3))
    jitted_step = steps.make_sft_step(jitted_state, num_micro_batches=2)
    ahead_step = steps.make_sft_step(ahead_state, num_micro_batches=2)
  compiled = steps.compile_ahead(ahead_step, ahead_state,
                                 {seq_len: global_batch_shapes(local[seq_len], mesh) for seq_len in lengths}, mesh)
  assert sorted(compiled) == list(lengths)
  for seq_len in (32, 48, 48, 32):
    batch = to_global_batch(local[seq_len], mesh)
    with jax.set_mesh(mesh):
      jitted_state, jitted_metrics = jitted_step(jitted_state, batch)
    ahead_state, ahead_metrics = compiled[seq_len](ahead_state, batch)
    np.testing.assert_allclose(ahead_metrics["sft_loss"], jitted_metrics["sft_loss"], rtol=1e-6)
  assert int(ahead_state.step) == 4
  for a, b in zip(jax.tree.leaves(ahead_state.params), jax.tree.leaves(jitted_state.params), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  with pytest.raises(Exception, match="(?i)shape|sharding|argument"):  # another length: no silent compile
    compiled[32](ahead_state, to_global_batch(local[48], mesh))


def test_lora_step_leaves_base_weights_bit_identical():
  state = create_train_state(lora_llama(), adamw(1e-2), trainable="lora")
  base_before = jax.tree.map(np.array, state.frozen)
  lora_before = jax.tree.map(np.array, state.params)
  # 1 layer x (q: A 64x4 + B 4x64, v: A 64x4 + B 4x32 with 2 kv heads of 16)
  assert count_params(state.params) == ((64 * 4 + 4 * 64) + (64 * 4 + 4 * 32))
  sft_step = steps.make_sft_step(state)
  batch = as_jnp(toy_trajectories())
  for _ in range(2):
    state, _ = sft_step(state, batch)
  for before, after in zip(jax.tree.leaves(base_before), jax.tree.leaves(state.frozen)):
    np.testing.assert_array_equal(before, after)
  changed = [not np.array_equal(b, a) for b, a in
             zip(jax.tree.leaves(lora_before), jax.tree.leaves(state.params))]
  assert all(changed)
  # zeroed adapters reproduce the base model exactly
  ref_logp = steps.forward_logprobs(steps.lora_reference(state), batch)
  base_state = create_train_state(tiny_llama(), optax.set_to_zero())
  np.testing.assert_allclose(ref_logp, steps.forward_logprobs(base_state, batch), atol=1e-6)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_lora_step_through_rematerialised_layers_equals_plain(scan_layers):
  """The real presets' setting: adapters trained through remat layers over a frozen base (nnx.remat
  on the layer modules once failed here: base and adapters live at different trace levels)."""
  batch = as_jnp(toy_trajectories())
  results = {}
  for remat in ("none", "full", "dots"):
    cfg = tiny_config().replace(num_layers=2, remat_policy=remat, scan_layers=scan_layers)
    state = create_train_state(apply_lora(Llama(cfg, rngs=nnx.Rngs(0)), rank=4, alpha=8, rngs=nnx.Rngs(1)),
                               adamw(1e-2), trainable="lora")
    sft_step = steps.make_sft_step(state, num_micro_batches=2)
    for _ in range(2):
      state, metrics = sft_step(state, batch)
    results[remat] = (float(metrics["sft_loss"]), state.params)
  plain_loss, plain_params = results.pop("none")
  for remat, (loss, params) in results.items():
    assert loss == pytest.approx(plain_loss, rel=1e-5), remat
    for a, b in zip(jax.tree.leaves(plain_params), jax.tree.leaves(params), strict=True):
      np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6, err_msg=remat)


def test_lora_and_head_filter_trains_adapters_and_head_only():
  critic = ValueModel(lora_llama(), nnx.Rngs(5))
  state = create_train_state(critic, adamw(1e-3), trainable="lora_and_head")
  trainable = {"/".join(map(str, path)) for path, _ in nnx.to_flat_state(state.params)}
  assert {"head/kernel", "head/bias", "backbone/layers/0/self_attn/q_proj/lora/a"} <= trainable
  assert not any(name.endswith("kernel") and "head" not in name for name in trainable)
  frozen = {"/".join(map(str, path)) for path, _ in nnx.to_flat_state(state.frozen)}
  assert "backbone/layers/0/self_attn/q_proj/kernel" in frozen and "backbone/embed" in frozen


def test_trainable_filter_errors():
  with pytest.raises(ValueError, match="apply LoRA first"):
    create_train_state(tiny_llama(), adamw(1e-3), trainable="lora")
  with pytest.raises(ValueError, match="trainable"):
    create_train_state(tiny_llama(), adamw(1e-3), trainable="adapters")
  with pytest.raises(ValueError, match="trainable='lora'"):
    steps.lora_reference(create_train_state(tiny_llama(), optax.set_to_zero()))


def test_progress_step_fits_trajectory_returns():
  batch = as_jnp(toy_trajectories())
  state = create_train_state(value_model(), adamw(3e-3))
  step = steps.make_progress_step(state, num_micro_batches=2)
  losses = []
  for _ in range(8):
    state, metrics = step(state, batch)
    losses.append(float(metrics["progress_loss"]))
  assert losses[-1] < 0.5 * losses[0], losses
  # the loss reported is the mean squared error of the per-trajectory sums before the update
  values_bs = steps.forward_step_values(state, batch, at="end")
  np.testing.assert_array_equal(np.asarray(values_bs)[batch["step_mask_bs"] == 0], 0.0)
  sums_b = values_bs.sum(-1)
  assert float(jnp.mean((sums_b - batch["final_reward_b"]) ** 2)) < losses[0]


PPO_CONFIG = steps.PPOConfig(entropy_coef=0.01)
PPO_TX = adamw(1e-3)  # shared so that fresh states hit the compiled step's cache


def _ppo_setup():
  batch = as_jnp(toy_trajectories())
  policy = create_train_state(tiny_llama(0), PPO_TX)
  critic = create_train_state(value_model(1), PPO_TX)
  reference = create_train_state(tiny_llama(0), optax.set_to_zero())
  old_logp_bt = steps.forward_logprobs(policy, batch, num_micro_batches=2)
  ref_logp_bt = steps.forward_logprobs(reference, batch)
  old_values_bs = steps.forward_step_values(critic, batch, at="start")
  grounding_bs = jnp.ones_like(batch["step_mask_bs"]).at[0, 0].set(0.0)  # one invalid action
  task_rewards_bs = step_rewards("grounding_only", progress_bs=jnp.zeros_like(grounding_bs),
                                 grounding_bs=grounding_bs, step_mask_bs=batch["step_mask_bs"],
                                 final_reward_b=batch["final_reward_b"], alpha=1.0, beta=0.5)
  targets = ppo_targets(batch, old_logp_bt=old_logp_bt, ref_logp_bt=ref_logp_bt,
                        old_values_bs=old_values_bs, task_rewards_bs=task_rewards_bs,
                        kl_coef=jnp.float32(0.1), gamma=0.99, lam=0.95)
  ppo_batch = batch | {"old_logp_bt": old_logp_bt, "old_values_bs": old_values_bs,
                       "advantages_bt": targets["advantages_bt"],
                       "returns_bs": targets["returns_bs"]}
  return steps.PPOState(policy=policy, critic=critic), ppo_batch, targets


@pytest.fixture(scope="module")
def ppo_step():
  """One compiled PPO step shared by the PPO tests (fresh states come from `_ppo_setup`)."""
  state, _, _ = _ppo_setup()
  return steps.make_ppo_step(state, PPO_CONFIG)


def test_ppo_step_improves_advantaged_tokens_and_fits_critic(ppo_step):
  state, batch, targets = _ppo_setup()
  # same policy as the reference: every KL term is 0, rewards are the task rewards
  np.testing.assert_allclose(targets["kl_bs"], 0.0, atol=1e-6)
  mask = batch["loss_mask_bt"]
  adv_sum = float(jnp.sum(targets["advantages_bt"] * mask))
  np.testing.assert_allclose(adv_sum, 0.0, atol=1e-4)  # whitened over agent tokens
  state, first = ppo_step(state, batch)
  np.testing.assert_allclose(first["ratio"], 1.0, rtol=1e-5)  # old log-probs = current policy
  assert float(first["clip_frac"]) == 0.0 and float(first["skipped"]) == 0.0
  for _ in range(3):
    state, metrics = ppo_step(state, batch)
  assert float(metrics["value_loss"]) < float(first["value_loss"])
  assert float(metrics["policy_loss"]) < float(first["policy_loss"])
  new_logp_bt = steps.forward_logprobs(state.policy, batch)
  gain_b = sum_tokens_per_step((new_logp_bt - batch["old_logp_bt"]) * batch["advantages_bt"],
                               batch["step_id_bt"], 4).sum(-1)
  assert float(gain_b.sum()) > 0.0  # probability moved towards positive-advantage tokens
  assert int(state.policy.step) == 4 and int(state.critic.step) == 4


def test_ppo_step_on_a_batch_trimmed_to_its_steps_is_the_same_update():
  state, batch, _ = _ppo_setup()
  trimmed = trim_to_steps(batch, length_bucket=8)
  assert trimmed["tokens_bt"].shape[1] < batch["tokens_bt"].shape[1]
  full_state, full_metrics = steps.make_ppo_step(state, PPO_CONFIG)(state, batch)
  state, _, _ = _ppo_setup()
  trimmed_state, trimmed_metrics = steps.make_ppo_step(state, PPO_CONFIG)(state, trimmed)
  for name, value in full_metrics.items():
    np.testing.assert_allclose(trimmed_metrics[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
  for a, b in zip(jax.tree.leaves(full_state), jax.tree.leaves(trimmed_state), strict=True):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)  # AdamW at lr 1e-3: float noise of 1% of a step


def test_ppo_step_on_micro_batches_cut_to_their_own_lengths_is_the_mini_batch_update():
  """`PPOStep` sums the micro-batches' unnormalised gradients and divides by the mini-batch's counts:
  the rows of one padded mini-batch, sorted by length into micro-batches of one and two rows each cut
  after its own steps, give the update of the whole padded mini-batch, on fewer tokens."""
  state, batch, _ = _ppo_setup()
  host = {key: np.asarray(x) for key, x in batch.items()}
  order = np.argsort(host["step_end_idx_bs"].max(axis=1), kind="stable")
  parts = [order[:1], order[1:3], order[3:]]
  micros = [trim_to_steps({key: x[rows] for key, x in host.items()}, length_bucket=1) for rows in parts]
  assert len({m["tokens_bt"].shape[1] for m in micros}) == 3  # three lengths
  assert sum(m["tokens_bt"].size for m in micros) < host["tokens_bt"].size
  whole_state, whole = steps.make_ppo_step(state, PPO_CONFIG)(state, batch)
  state, _, _ = _ppo_setup()
  parts_state, by_parts = steps.make_ppo_step(state, PPO_CONFIG)(state, [as_jnp(m) for m in micros])
  for name, value in whole.items():
    np.testing.assert_allclose(by_parts[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
  for a, b in zip(jax.tree.leaves(whole_state), jax.tree.leaves(parts_state), strict=True):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
  # the loss is the mini-batch's mean, not a mean of micro-batch means: a per-micro-batch normalisation
  # would weight the one-row micro-batch's tokens as much as the others together
  mean_of_means = np.mean([float(steps.make_ppo_step(_ppo_setup()[0], PPO_CONFIG)(_ppo_setup()[0], as_jnp(m))[1]["policy_loss"])
                           for m in micros])
  assert not np.isclose(mean_of_means, float(whole["policy_loss"]), rtol=1e-3)


def test_critic_warmup_step_trains_the_critic_alone(ppo_step):
  state, batch, _ = _ppo_setup()
  before = jax.tree.map(np.array, state)
  warm, metrics = ppo_step(state, batch, np.asarray(False))
  assert float(metrics["skipped"]) == 0.0
  for a, b in zip(jax.tree.leaves(before.policy), jax.tree.leaves(warm.policy), strict=True):
    np.testing.assert_array_equal(a, b)  # parameters, optimizer moments and step count as they came
  changed = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before.critic.params),
                                                       jax.tree.leaves(warm.critic.params), strict=True)]
  assert any(changed) and int(warm.critic.step) == 1
  trained, _ = ppo_step(warm, batch, np.asarray(True))  # the same compiled step, policy on
  assert int(trained.policy.step) == 1


def test_ppo_step_skips_batch_with_large_ratio(ppo_step):
  state, batch, _ = _ppo_setup()
  # old log-probs 5 nats below the current policy: ratio e^5 = 148 > max_mean_ratio 10
  batch = batch | {"old_logp_bt": batch["old_logp_bt"] - 5.0}
  before = jax.tree.map(np.array, state)
  state, metrics = ppo_step(state, batch)
  assert float(metrics["skipped"]) == 1.0
  np.testing.assert_allclose(metrics["ratio"], np.exp(5.0), rtol=1e-4)
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state)):
    np.testing.assert_array_equal(a, b)


def test_ppo_step_beyond_its_kl_limit_updates_the_critic_alone():
  """max_update_kl: a mini-batch whose approx KL to the sampling policy (at the current parameters)
  exceeds the limit leaves the policy, its optimizer state included, as it came; the critic updates."""
  state, batch, _ = _ppo_setup()
  # old log-probs 0.5 nats below the current policy: approx KL 0.5 * 0.5^2 = 0.125, ratio e^0.5 (no skip)
  batch = batch | {"old_logp_bt": batch["old_logp_bt"] - 0.5}
  gated = steps.make_ppo_step(state, dataclasses.replace(PPO_CONFIG, max_update_kl=0.1))
  before = jax.tree.map(np.array, state)
  state, metrics = gated(state, batch)
  np.testing.assert_allclose(metrics["approx_kl"], 0.125, rtol=1e-4)
  assert float(metrics["beyond_kl"]) == 1.0 and float(metrics["policy_updated"]) == 0.0
  assert float(metrics["skipped"]) == 0.0
  for a, b in zip(jax.tree.leaves(before.policy), jax.tree.leaves(state.policy), strict=True):
    np.testing.assert_array_equal(a, b)
  assert int(state.critic.step) == 1
  # under a limit above it, the same mini-batch updates both
  state, batch, _ = _ppo_setup()
  batch = batch | {"old_logp_bt": batch["old_logp_bt"] - 0.5}
  state, metrics = steps.make_ppo_step(state, dataclasses.replace(PPO_CONFIG, max_update_kl=0.2))(state, batch)
  assert float(metrics["beyond_kl"]) == 0.0 and float(metrics["policy_updated"]) == 1.0
  assert int(state.policy.step) == 1 and int(state.critic.step) == 1


def test_ppo_step_skips_batch_with_non_finite_gradients(ppo_step):
  state, batch, _ = _ppo_setup()
  # a NaN advantage on one agent token: the ratio stays finite (no skip by ratio), the gradients do not
  mask = np.asarray(batch["loss_mask_bt"]) > 0
  row, col = np.argwhere(mask)[0]
  batch = batch | {"advantages_bt": batch["advantages_bt"].at[row, col].set(jnp.nan)}
  before = jax.tree.map(np.array, state)
  state, metrics = ppo_step(state, batch)
  assert float(metrics["skipped"]) == 1.0 and np.isfinite(float(metrics["ratio"]))
  assert not np.isfinite(float(metrics["policy_grad_norm"]))
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state)):
    np.testing.assert_array_equal(a, b)
