"""Step-level reward labelling: SPA (progress + grounding) and the two baselines.

Every step keeps its own reward (no leave-one-out, no (T - t - 1) factor); the reward of step s is
delivered at the end of action s. Modes (config string `reward_mode`):

- `"spa"`:            r_s = alpha * c_s + beta * g_s
- `"sparse"`:         r_s = R on the last real step, 0 elsewhere
- `"grounding_only"`: r_s = beta * g_s, plus R on the last real step
"""

import jax
import jax.numpy as jnp

REWARD_MODES = ("spa", "sparse", "grounding_only")


def last_step_onehot(step_mask_bs: jax.Array) -> jax.Array:
  """1 at each trajectory's last real step, 0 elsewhere (all 0 for a trajectory with no steps)."""
  num_steps = step_mask_bs.shape[-1]
  last_idx_b = jnp.sum(step_mask_bs > 0, axis=-1) - 1
  return (jnp.arange(num_steps)[None, :] == last_idx_b[:, None]).astype(jnp.float32)


def step_rewards(mode: str, *, progress_bs: jax.Array, grounding_bs: jax.Array,
                 step_mask_bs: jax.Array, final_reward_b: jax.Array, alpha: float,
                 beta: float) -> jax.Array:
  """Per-step rewards [B, S] for `mode` (see the module doc); 0 on padding steps."""
  step_mask_bs = step_mask_bs.astype(jnp.float32)
  outcome_bs = last_step_onehot(step_mask_bs) * final_reward_b[:, None]
  if mode == "spa":
    rewards_bs = alpha * progress_bs + beta * grounding_bs
  elif mode == "sparse":
    rewards_bs = outcome_bs
  elif mode == "grounding_only":
    rewards_bs = beta * grounding_bs + outcome_bs
  else:
    raise ValueError(f"unknown reward_mode {mode!r}; choose one of {REWARD_MODES}")
  return rewards_bs * step_mask_bs
