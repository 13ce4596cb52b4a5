"""Step-level reward labelling: SPA (progress + grounding) and the two baselines.

Every step keeps its own reward (no leave-one-out, no (T - t - 1) factor); the reward of step s is
delivered at the end of action s. Modes (config string `reward_mode`):

- `"spa"`:            r_s = alpha * c_s + beta * g_s
- `"sparse"`:         r_s = R on the last real step, 0 elsewhere
- `"grounding_only"`: r_s = beta * g_s, plus R on the last real step

The grounding term's form (`grounding_form`): "bonus" pays beta * g_s (the paper's r = alpha c +
beta g), so its sum grows with the number of valid steps and ten valid steps without a purchase
out-earn a perfect short one; "penalty" charges beta * (g_s - 1): nothing for a valid step, -beta
for an invalid one. Both rank the actions available at a step the same way; only "bonus" pays for
episode length.
"""

import math

import jax
import jax.numpy as jnp

REWARD_MODES = ("spa", "sparse", "grounding_only")
GROUNDING_FORMS = {"bonus": 0.0, "penalty": 1.0}  # form -> what g_s is offset by


def last_step_onehot(step_mask_bs: jax.Array) -> jax.Array:
  """1 at each trajectory's last real step, 0 elsewhere (all 0 for a trajectory with no steps)."""
  num_steps = step_mask_bs.shape[-1]
  last_idx_b = jnp.sum(step_mask_bs > 0, axis=-1) - 1
  return (jnp.arange(num_steps)[None, :] == last_idx_b[:, None]).astype(jnp.float32)


def step_rewards(mode: str, *, progress_bs: jax.Array, grounding_bs: jax.Array,
                 step_mask_bs: jax.Array, final_reward_b: jax.Array, alpha: float,
                 beta: float, grounding_form: str = "bonus") -> jax.Array:
  """Per-step rewards [B, S] for `mode` and `grounding_form` (see the module doc); 0 on padding steps."""
  if grounding_form not in GROUNDING_FORMS:
    raise ValueError(f"unknown grounding_form {grounding_form!r}; choose one of {tuple(GROUNDING_FORMS)}")
  step_mask_bs = step_mask_bs.astype(jnp.float32)
  outcome_bs = last_step_onehot(step_mask_bs) * final_reward_b[:, None]
  grounding_term_bs = beta * (grounding_bs - GROUNDING_FORMS[grounding_form])
  if mode == "spa":
    rewards_bs = alpha * progress_bs + grounding_term_bs
  elif mode == "sparse":
    rewards_bs = outcome_bs
  elif mode == "grounding_only":
    rewards_bs = grounding_term_bs + outcome_bs
  else:
    raise ValueError(f"unknown reward_mode {mode!r}; choose one of {REWARD_MODES}")
  return rewards_bs * step_mask_bs


def purchases_a_stall_outearns(grounding_coef: float, max_steps: int, grounding_form: str) -> int:
  """The last purchase step k that an episode of `max_steps` valid steps without a purchase out-earns
  under the grounding term alone (0: none). With the "bonus" form each valid step pays beta, so the stall
  earns beta * max_steps and a purchase at step k at most 1 + beta * k: the stall wins for every
  k < max_steps - 1 / beta (before the progress terms, whose sum follows the final reward). The
  "penalty" form pays nothing for valid steps: no stall out-earns a purchase."""
  if grounding_form != "bonus" or grounding_coef <= 0:
    return 0
  return max(0, math.ceil(max_steps - 1.0 / grounding_coef) - 1)
