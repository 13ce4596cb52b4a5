"""GAE over steps and the KL pieces, against hand-computed values and a Python reference loop."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from spa_jax.training import gae, kl
from spa_jax.training.ppo_targets import ppo_targets


def _reference_gae(rewards, values, mask, gamma, lam):
  """Plain loop over one trajectory's real steps; terminal after the last one."""
  real = [s for s in range(len(rewards)) if mask[s]]
  advantages, returns = np.zeros(len(rewards)), np.zeros(len(rewards))
  next_value, next_adv = 0.0, 0.0
  for s in reversed(real):
    delta = rewards[s] + gamma * next_value - values[s]
    next_adv = delta + gamma * lam * next_adv
    next_value = values[s]
    advantages[s], returns[s] = next_adv, next_adv + values[s]
  return advantages, returns


def test_gae_hand_computed_with_one_step_row():
  # gamma = lam = 0.5. row 0: r = (1, 0, 2), V = (0.5, 1, 1), terminal after step 2:
  #   s2: delta = 2 - 1 = 1                      A = 1
  #   s1: delta = 0 + 0.5 * 1 - 1 = -0.5         A = -0.5 + 0.25 * 1 = -0.25
  #   s0: delta = 1 + 0.5 * 1 - 0.5 = 1          A = 1 + 0.25 * (-0.25) = 0.9375
  #   returns = A + V = (1.4375, 0.75, 2)
  # row 1: one step r = 0.7, V = 0.2: A = 0.5, G = 0.7; padding steps stay 0.
  adv_bs, ret_bs = gae.gae_over_steps(
      jnp.array([[1.0, 0.0, 2.0], [0.7, 3.0, 3.0]]), jnp.array([[0.5, 1.0, 1.0], [0.2, 5.0, 5.0]]),
      jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]), gamma=0.5, lam=0.5)
  np.testing.assert_allclose(adv_bs, [[0.9375, -0.25, 1.0], [0.5, 0.0, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(ret_bs, [[1.4375, 0.75, 2.0], [0.7, 0.0, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("gamma, lam", [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0)])
def test_gae_matches_python_loop(gamma, lam):
  rng = np.random.default_rng(0)
  rewards_bs = rng.normal(size=(6, 10)).astype(np.float32)
  values_bs = rng.normal(size=(6, 10)).astype(np.float32)
  lengths = [1, 3, 10, 5, 7, 2]
  mask_bs = (np.arange(10)[None, :] < np.array(lengths)[:, None]).astype(np.float32)
  mask_bs[4, 2] = 0.0  # a gap: the scan must skip it as the loop does
  adv_bs, ret_bs = gae.gae_over_steps(jnp.asarray(rewards_bs), jnp.asarray(values_bs),
                                      jnp.asarray(mask_bs), gamma=gamma, lam=lam)
  for row in range(6):
    ref_adv, ref_ret = _reference_gae(rewards_bs[row], values_bs[row], mask_bs[row], gamma, lam)
    np.testing.assert_allclose(adv_bs[row], ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret_bs[row], ref_ret, rtol=1e-5, atol=1e-5)


def test_step_kl_estimators():
  # tokens 1-2 are action 0, token 3 is action 1, token 4 is an observation (ignored).
  # "kl": log pi - log ref = (0.5, -1 | 0.5)          -> step 0: -0.5, step 1: 0.5
  # "k3": d = log ref - log pi = (-0.5, 1 | -0.5); e^d - 1 - d
  #       = (e^-0.5 - 0.5, e - 2 | e^-0.5 - 0.5)       -> step 0: e^-0.5 + e - 2.5, step 1: e^-0.5 - 0.5
  logp_policy = jnp.array([[0.0, -1.0, -2.0, -0.5, -1.0]])
  logp_ref = jnp.array([[0.0, -1.5, -1.0, -1.0, -3.0]])
  step_id = jnp.array([[-1, 0, 0, 1, -1]])
  np.testing.assert_allclose(kl.step_kl(logp_policy, logp_ref, step_id, 3, estimator="kl"),
                             [[-0.5, 0.5, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(
      kl.step_kl(logp_policy, logp_ref, step_id, 3, estimator="k3"),
      [[math.exp(-0.5) + math.e - 2.5, math.exp(-0.5) - 0.5, 0.0]], rtol=1e-5)
  with pytest.raises(ValueError, match="KL estimator"):
    kl.step_kl(logp_policy, logp_ref, step_id, 3, estimator="mse")


def test_kl_shaped_rewards():
  # r - 0.1 * KL = (1 - 0.1 * 2, 0 - 0.1 * (-1)) and 0 on padding
  shaped = kl.kl_shaped_rewards(jnp.array([[1.0, 0.0, 4.0]]), jnp.array([[2.0, -1.0, 7.0]]),
                                jnp.array([[1.0, 1.0, 0.0]]), kl_coef=0.1)
  np.testing.assert_allclose(shaped, [[0.8, 0.1, 0.0]], rtol=1e-6)


def test_kl_controllers():
  ctl = kl.make_kl_controller("adaptive", init=0.3, target=6.0, horizon=10_000)
  coef = ctl.initial()
  assert coef == 0.3
  # KL 9: error = clip(9/6 - 1) = clip(0.5) = 0.2; 32 samples: 0.3 (1 + 0.2 * 32 / 1e4) = 0.300192
  np.testing.assert_allclose(ctl.update(coef, 9.0, 32), 0.300192, rtol=1e-9)
  # KL 3: error clip(-0.5) = -0.2 -> 0.3 (1 - 0.00064) = 0.299808
  np.testing.assert_allclose(ctl.update(coef, 3.0, 32), 0.299808, rtol=1e-9)
  # KL 6.6: error 0.1 (inside the clip) -> 0.3 (1 + 0.00032) = 0.300096
  np.testing.assert_allclose(ctl.update(coef, 6.6, 32), 0.300096, rtol=1e-9)
  fixed = kl.make_kl_controller("fixed", init=0.05)
  assert fixed.update(fixed.initial(), 100.0, 32) == 0.05
  with pytest.raises(ValueError, match="kl_target"):
    kl.make_kl_controller("adaptive", init=0.3)


def test_ppo_targets_hand_computed():
  # tokens 1-2 = action 0, token 4 = action 1. Per-token log pi - log ref = (0.5, -1 | 0.5):
  # KL = (-0.5, 0.5). Task rewards (0.2, 1.0), kl_coef 0.2 -> shaped (0.2 + 0.1, 1.0 - 0.1)
  # = (0.3, 0.9). V = (0.5, 0.4), gamma = lam = 1: A1 = 0.9 - 0.4 = 0.5,
  # delta0 = 0.3 + 0.4 - 0.5 = 0.2, A0 = 0.2 + 0.5 = 0.7; returns (1.2, 0.9).
  batch = {"step_id_bt": jnp.array([[-1, 0, 0, -1, 1]]),
           "loss_mask_bt": jnp.array([[0.0, 1.0, 1.0, 0.0, 1.0]]),
           "step_mask_bs": jnp.array([[1.0, 1.0, 0.0]])}
  out = ppo_targets(batch, old_logp_bt=jnp.array([[0.0, -1.0, -2.0, 0.0, -0.5]]),
                    ref_logp_bt=jnp.array([[0.0, -1.5, -1.0, 0.0, -1.0]]),
                    old_values_bs=jnp.array([[0.5, 0.4, 9.0]]),
                    task_rewards_bs=jnp.array([[0.2, 1.0, 0.0]]), kl_coef=jnp.float32(0.2),
                    gamma=1.0, lam=1.0, whiten_advantages=False)
  np.testing.assert_allclose(out["kl_bs"], [[-0.5, 0.5, 0.0]], atol=1e-6)
  np.testing.assert_allclose(out["rewards_bs"], [[0.3, 0.9, 0.0]], atol=1e-6)
  np.testing.assert_allclose(out["returns_bs"], [[1.2, 0.9, 0.0]], atol=1e-6)
  np.testing.assert_allclose(out["advantages_bt"], [[0.0, 0.7, 0.7, 0.0, 0.5]], atol=1e-6)
  np.testing.assert_allclose(out["mean_kl"], 0.0, atol=1e-6)
