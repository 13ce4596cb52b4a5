"""Losses, stats and reward labelling pinned against hand-computed values."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from spa_jax.training import losses, rewards, stats


def test_sft_loss_counts_only_agent_tokens():
  # V = 2, tokens [0, 1, 0]. logits[0] = [0, 0] scores token 1: -log 1/2 = log 2.
  # logits[1] = [ln 3, 0] scores token 2 (id 0): -log 3/4 = log 4/3.
  logits_btv = jnp.array([[[0.0, 0.0], [math.log(3.0), 0.0], [5.0, -5.0]]])
  tokens_bt = jnp.array([[0, 1, 0]])
  both = losses.sft_loss(logits_btv, tokens_bt, jnp.array([[0.0, 1.0, 1.0]]))
  np.testing.assert_allclose(both.total, math.log(2.0) + math.log(4.0 / 3.0), rtol=1e-6)
  assert float(both.count) == 2.0
  last_only = losses.sft_loss(logits_btv, tokens_bt, jnp.array([[0.0, 0.0, 1.0]]))
  np.testing.assert_allclose(last_only.total, math.log(4.0 / 3.0), rtol=1e-6)
  np.testing.assert_allclose(last_only.mean(), math.log(4.0 / 3.0), rtol=1e-6)


def test_progress_loss_with_one_step_trajectory_and_padding():
  # row 0: c = (0.2, 0.3, [9 padding]), R = 1   -> (1 - 0.5)^2 = 0.25
  # row 1: one step c = 0.7, R = 0.5             -> (0.5 - 0.7)^2 = 0.04
  # row 2: no steps at all (not counted)
  values_bs = jnp.array([[0.2, 0.3, 9.0], [0.7, 9.0, 9.0], [9.0, 9.0, 9.0]])
  mask_bs = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
  reward_b = jnp.array([1.0, 0.5, 0.3])
  loss = losses.progress_loss(values_bs, mask_bs, reward_b)
  np.testing.assert_allclose(loss.total, 0.29, rtol=1e-6)
  assert float(loss.count) == 2.0
  np.testing.assert_allclose(losses.predicted_returns(values_bs, mask_bs), [0.5, 0.7, 0.0],
                             rtol=1e-6)


def test_progress_metrics():
  # sums: row 0 = 0.5 (R 1), row 1 = 0.7 (R 0.5), row 2 = 0.1 (R 0), row 3 has no steps (ignored)
  # MSE = (0.25 + 0.04 + 0.01) / 3 = 0.1
  # Pearson: pred (0.5, 0.7, 0.1) - 0.4333 = (0.0667, 0.2667, -0.3333);
  #          R (1, 0.5, 0) - 0.5 = (0.5, 0, -0.5); cov*3 = 0.0333 + 0.1667 = 0.2;
  #          |pred|^2 = 0.004444 + 0.071111 + 0.111111 = 0.186667, |R|^2 = 0.5
  #          r = 0.2 / sqrt(0.186667 * 0.5) = 0.654654
  values_bs = jnp.array([[0.2, 0.3], [0.7, 9.0], [0.1, 9.0], [9.0, 9.0]])
  mask_bs = jnp.array([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
  metrics = losses.progress_metrics(values_bs, mask_bs, jnp.array([1.0, 0.5, 0.0, 0.7]))
  np.testing.assert_allclose(metrics["mse"], 0.1, rtol=1e-5)
  np.testing.assert_allclose(metrics["pearson"], 0.654654, rtol=1e-5)
  np.testing.assert_allclose(metrics["mean_predicted"], 1.3 / 3, rtol=1e-5)
  np.testing.assert_allclose(metrics["mean_reward"], 0.5, rtol=1e-5)


def test_ppo_policy_loss_hand_cases():
  # eps = 0.2; per token (ratio, A) -> max(-A r, -A clip(r)):
  #  (1.5, +1): max(-1.5, -1.2) = -1.2 (clipped)   (0.5, +1): max(-0.5, -0.8) = -0.5
  #  (1.5, -1): max( 1.5,  1.2) =  1.5             (0.5, -1): max( 0.5,  0.8) =  0.8 (clipped)
  #  last token is masked out (huge ratio and advantage).
  # sum = -1.2 - 0.5 + 1.5 + 0.8 = 0.6 over 4 tokens; clip fraction 2 / 4.
  log_ratio = jnp.array([[math.log(1.5), math.log(0.5), math.log(1.5), math.log(0.5), 5.0]])
  logp_old_bt = jnp.full((1, 5), -2.0)
  advantages_bt = jnp.array([[1.0, 1.0, -1.0, -1.0, 100.0]])
  mask_bt = jnp.array([[1.0, 1.0, 1.0, 1.0, 0.0]])
  out = losses.ppo_policy_loss(logp_old_bt + log_ratio, logp_old_bt, advantages_bt, mask_bt,
                               clip_eps=0.2)
  np.testing.assert_allclose(out["policy_loss"].total, 0.6, rtol=1e-5)
  assert float(out["policy_loss"].count) == 4.0
  np.testing.assert_allclose(out["clip_frac"].mean(), 0.5)
  # approx KL = 0.5 (log r)^2 summed: 2 * 0.5 (ln 1.5)^2 + 2 * 0.5 (ln 0.5)^2
  np.testing.assert_allclose(out["approx_kl"].total, math.log(1.5) ** 2 + math.log(2.0) ** 2,
                             rtol=1e-5)
  np.testing.assert_allclose(out["ratio"].mean(), (1.5 + 0.5 + 1.5 + 0.5) / 4, rtol=1e-5)


def test_value_loss_clipping():
  # step 0: V_old 0.5, V 0.9, G 1, eps 0.2: unclipped (0.9-1)^2 = 0.01, clipped V = 0.7 ->
  #   (0.7-1)^2 = 0.09; 0.5 * max = 0.045 (clipped branch).
  # step 1: V_old 0.5, V 0.6, G 0: both 0.36 -> 0.18.   step 2 is padding.
  out = losses.value_loss(jnp.array([[0.9, 0.6, 4.0]]), jnp.array([[0.5, 0.5, 0.0]]),
                          jnp.array([[1.0, 0.0, 0.0]]), jnp.array([[1.0, 1.0, 0.0]]),
                          clip_eps=0.2)
  np.testing.assert_allclose(out["value_loss"].total, 0.225, rtol=1e-5)
  assert float(out["value_loss"].count) == 2.0
  np.testing.assert_allclose(out["value_clip_frac"].mean(), 0.5)


def test_masked_whiten_and_pearson():
  # x = (1, 2, 3) on the mask: mean 2, var 2/3 -> (-sqrt(3/2), 0, sqrt(3/2)); masked entry -> 0
  whitened = stats.masked_whiten(jnp.array([1.0, 2.0, 3.0, 100.0]),
                                 jnp.array([1.0, 1.0, 1.0, 0.0]))
  np.testing.assert_allclose(whitened, [-math.sqrt(1.5), 0.0, math.sqrt(1.5), 0.0], rtol=1e-5)
  kept_mean = stats.masked_whiten(jnp.array([1.0, 2.0, 3.0]), jnp.ones(3), shift_mean=False)
  np.testing.assert_allclose(kept_mean, [2.0 - math.sqrt(1.5), 2.0, 2.0 + math.sqrt(1.5)],
                             rtol=1e-5)
  x, mask = jnp.array([1.0, 2.0, 3.0, 50.0]), jnp.array([1.0, 1.0, 1.0, 0.0])
  np.testing.assert_allclose(stats.pearson(x, 2 * x + 1, mask), 1.0, rtol=1e-6)
  np.testing.assert_allclose(stats.pearson(x, -x, mask), -1.0, rtol=1e-6)
  # y = (1, 3, 2): centred x (-1, 0, 1), y (-1, 1, 0): cov 1/3, var_x 2/3, var_y 2/3 -> 0.5
  np.testing.assert_allclose(stats.pearson(x, jnp.array([1.0, 3.0, 2.0, 0.0]), mask), 0.5,
                             rtol=1e-6)


REWARD_INPUTS = dict(
    # row 0: three steps, the middle one an invalid action (g = 0); R = 0.8
    # row 1: one-step trajectory with an invalid action; R = 1
    progress_bs=jnp.array([[0.2, -0.1, 0.5], [0.3, 9.0, 9.0]]),
    grounding_bs=jnp.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]),
    step_mask_bs=jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]),
    final_reward_b=jnp.array([0.8, 1.0]),
    alpha=1.0, beta=0.5)


@pytest.mark.parametrize("mode, expected", [
    # alpha c + beta g: (0.2 + 0.5, -0.1 + 0, 0.5 + 0.5) and (0.3 + 0)
    ("spa", [[0.7, -0.1, 1.0], [0.3, 0.0, 0.0]]),
    # R on the last real step only
    ("sparse", [[0.0, 0.0, 0.8], [1.0, 0.0, 0.0]]),
    # beta g + R at the last step: (0.5, 0, 0.5 + 0.8) and (0 + 1)
    ("grounding_only", [[0.5, 0.0, 1.3], [1.0, 0.0, 0.0]]),
])
def test_step_rewards_modes(mode, expected):
  np.testing.assert_allclose(rewards.step_rewards(mode, **REWARD_INPUTS), expected, rtol=1e-6)


def test_step_rewards_rejects_unknown_mode():
  with pytest.raises(ValueError, match="reward_mode"):
    rewards.step_rewards("leave_one_out", **REWARD_INPUTS)


@pytest.mark.parametrize("mode, expected", [
    # alpha c + beta (g - 1): (0.2, -0.1 - 0.5, 0.5) and (0.3 - 0.5)
    ("spa", [[0.2, -0.6, 0.5], [-0.2, 0.0, 0.0]]),
    # beta (g - 1) + R at the last step: (0, -0.5, 0.8) and (-0.5 + 1)
    ("grounding_only", [[0.0, -0.5, 0.8], [0.5, 0.0, 0.0]]),
    ("sparse", [[0.0, 0.0, 0.8], [1.0, 0.0, 0.0]]),  # no grounding term
])
def test_step_rewards_penalty_form(mode, expected):
  np.testing.assert_allclose(rewards.step_rewards(mode, **REWARD_INPUTS, grounding_form="penalty"), expected,
                             rtol=1e-6, atol=1e-7)


def test_only_the_bonus_form_pays_a_policy_for_never_buying():
  # ten valid steps without a purchase (R = 0) against a perfect four-step purchase (R = 1), with an
  # estimator whose sums equal R (c_t = R / T): the bonus form's return prefers stalling (5.0 > 3.0),
  # the penalty form's the purchase (0.0 < 1.0)
  stall = dict(progress=np.zeros(10), grounding=np.ones(10), reward=0.0)
  buy = dict(progress=np.full(4, 0.25), grounding=np.ones(4), reward=1.0)

  def episode_return(episode, form):
    steps = episode["progress"].size
    pad = lambda x: jnp.asarray(np.pad(x, (0, 10 - steps)), jnp.float32)[None]  # noqa: E731
    r = rewards.step_rewards("spa", progress_bs=pad(episode["progress"]), grounding_bs=pad(episode["grounding"]),
                             step_mask_bs=pad(np.ones(steps)), final_reward_b=jnp.asarray([episode["reward"]]),
                             alpha=1.0, beta=0.5, grounding_form=form)
    return float(r.sum())
  assert episode_return(stall, "bonus") == pytest.approx(5.0) and episode_return(buy, "bonus") == pytest.approx(3.0)
  assert episode_return(stall, "penalty") == pytest.approx(0.0) and episode_return(buy, "penalty") == pytest.approx(1.0)
  with pytest.raises(ValueError, match="grounding_form"):
    rewards.step_rewards("spa", **REWARD_INPUTS, grounding_form="bonuses")
