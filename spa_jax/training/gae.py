"""Generalised advantage estimation over action steps (not tokens).

Every episode is treated as terminal after its last real step: the value after it is 0. This holds
for purchases and also for truncation at `max_steps` or the context limit, which WebShop ends with
reward 0 and no continuation, so bootstrapping from a critic value there would invent return.
Padding steps (mask 0) are skipped: they neither carry TD errors nor pass on values, so credit
flows directly between consecutive real steps.
"""

import jax
import jax.numpy as jnp


def gae_over_steps(rewards_bs: jax.Array, values_bs: jax.Array, step_mask_bs: jax.Array, *,
                   gamma: float, lam: float) -> tuple[jax.Array, jax.Array]:
  """Advantages and returns [B, S] (0 on padding steps) by a reverse scan over steps.

  delta_s = r_s + gamma V_{s+1} - V_s (V after the last step = 0), A_s = delta_s + gamma lam A_{s+1},
  returns G_s = A_s + V_s.
  """
  rewards_sb = jnp.swapaxes(rewards_bs, 0, 1).astype(jnp.float32)
  values_sb = jnp.swapaxes(values_bs, 0, 1).astype(jnp.float32)
  mask_sb = jnp.swapaxes(step_mask_bs, 0, 1) > 0

  def backward(carry, step):
    next_value_b, next_adv_b = carry
    reward_b, value_b, mask_b = step
    delta_b = reward_b + gamma * next_value_b - value_b
    adv_b = delta_b + gamma * lam * next_adv_b
    carry = (jnp.where(mask_b, value_b, next_value_b), jnp.where(mask_b, adv_b, next_adv_b))
    return carry, jnp.where(mask_b, adv_b, 0.0)

  zeros_b = jnp.zeros(rewards_sb.shape[1], jnp.float32)
  _, advantages_sb = jax.lax.scan(backward, (zeros_b, zeros_b), (rewards_sb, values_sb, mask_sb),
                                  reverse=True)
  advantages_bs = jnp.swapaxes(advantages_sb, 0, 1)
  returns_bs = jnp.where(step_mask_bs > 0, advantages_bs + values_bs, 0.0)
  return advantages_bs, returns_bs
