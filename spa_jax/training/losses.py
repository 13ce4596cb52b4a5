"""Pure losses over the trajectory layout of `batch.py`; each returns `SumCount` terms.

Means are taken by the caller as (sum over all micro-batches and hosts) / (total count), which is
exact however the batch is split.
"""

import jax
import jax.numpy as jnp

from spa_jax.training.batch import token_logprobs
from spa_jax.training.stats import masked_mean, pearson
from spa_jax.training.sum_count import SumCount, masked_sum_count


def sft_loss(logits_btv: jax.Array, tokens_bt: jax.Array, loss_mask_bt: jax.Array) -> SumCount:
  """Token cross-entropy on the agent's action tokens: (sum of -log pi(token), #agent tokens).

  `logits_btv[:, t]` scores token t+1 (see `token_logprobs`); `loss_mask_bt` is token-aligned.
  Batches without agent tokens must be rejected by the caller (`check_has_agent_tokens`).
  """
  return masked_sum_count(-token_logprobs(logits_btv, tokens_bt), loss_mask_bt)


def predicted_returns(step_values_bs: jax.Array, step_mask_bs: jax.Array) -> jax.Array:
  """The progress estimator's prediction of R per trajectory: sum_s c_s over real steps, [B]."""
  return jnp.sum(step_values_bs.astype(jnp.float32) * step_mask_bs, axis=-1)


def progress_loss(step_values_bs: jax.Array, step_mask_bs: jax.Array,
                  final_reward_b: jax.Array) -> SumCount:
  """Squared error (R - sum_s c_s)^2 summed over trajectories, and the trajectory count.

  Only the per-trajectory sum is supervised; padding steps (mask 0) do not contribute.
  """
  error_b = final_reward_b - predicted_returns(step_values_bs, step_mask_bs)
  has_steps_b = jnp.any(step_mask_bs > 0, axis=-1)
  return masked_sum_count(error_b * error_b, has_steps_b)


def progress_metrics(step_values_bs: jax.Array, step_mask_bs: jax.Array,
                     final_reward_b: jax.Array) -> dict[str, jax.Array]:
  """Held-out quality of the estimator over trajectories with steps: MSE of sum_s c_s against R,
  their Pearson correlation, and the mean prediction and outcome."""
  predicted_b = predicted_returns(step_values_bs, step_mask_bs)
  has_steps_b = jnp.any(step_mask_bs > 0, axis=-1)
  return {
      "mse": masked_mean(jnp.square(final_reward_b - predicted_b), has_steps_b),
      "pearson": pearson(predicted_b, final_reward_b, has_steps_b),
      "mean_predicted": masked_mean(predicted_b, has_steps_b),
      "mean_reward": masked_mean(final_reward_b, has_steps_b),
  }


def ppo_policy_loss(logp_new_bt: jax.Array, logp_old_bt: jax.Array, advantages_bt: jax.Array,
                    loss_mask_bt: jax.Array, *, clip_eps: float) -> dict[str, SumCount]:
  """Token-level clipped surrogate: max(-A r, -A clip(r, 1-eps, 1+eps)), r = pi_new / pi_old.

  Returns SumCounts over agent tokens: `policy_loss`, `clip_frac` (tokens where the clipped
  branch is active), `approx_kl` (0.5 (log r)^2) and `ratio`.
  """
  log_ratio_bt = logp_new_bt - logp_old_bt
  ratio_bt = jnp.exp(log_ratio_bt)
  unclipped_bt = -advantages_bt * ratio_bt
  clipped_bt = -advantages_bt * jnp.clip(ratio_bt, 1.0 - clip_eps, 1.0 + clip_eps)
  return {
      "policy_loss": masked_sum_count(jnp.maximum(unclipped_bt, clipped_bt), loss_mask_bt),
      "clip_frac": masked_sum_count((clipped_bt > unclipped_bt).astype(jnp.float32), loss_mask_bt),
      "approx_kl": masked_sum_count(0.5 * log_ratio_bt * log_ratio_bt, loss_mask_bt),
      "ratio": masked_sum_count(ratio_bt, loss_mask_bt),
  }


def value_loss(values_new_bs: jax.Array, values_old_bs: jax.Array, returns_bs: jax.Array,
               step_mask_bs: jax.Array, *, clip_eps: float) -> dict[str, SumCount]:
  """Clipped value loss 0.5 max((V - G)^2, (V_old + clip(V - V_old, -eps, eps) - G)^2) per step.

  Returns SumCounts over real steps: `value_loss` and `value_clip_frac`.
  """
  clipped_bs = values_old_bs + jnp.clip(values_new_bs - values_old_bs, -clip_eps, clip_eps)
  loss_unclipped_bs = jnp.square(values_new_bs - returns_bs)
  loss_clipped_bs = jnp.square(clipped_bs - returns_bs)
  return {
      "value_loss": masked_sum_count(0.5 * jnp.maximum(loss_unclipped_bs, loss_clipped_bs),
                                     step_mask_bs),
      "value_clip_frac": masked_sum_count(
          (loss_clipped_bs > loss_unclipped_bs).astype(jnp.float32), step_mask_bs),
  }
