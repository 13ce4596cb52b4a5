"""PPO targets for one rollout batch: KL-shaped step rewards -> GAE over steps -> token advantages.

Computed once per rollout batch (before the PPO epochs) from the sampling policy's log-probs,
the reference policy's log-probs and the critic's values at the rollout.
"""

import jax
import jax.numpy as jnp

from spa_jax.training.batch import steps_to_tokens
from spa_jax.training.gae import gae_over_steps
from spa_jax.training.kl import kl_shaped_rewards, step_kl
from spa_jax.training.stats import masked_mean, masked_whiten


def ppo_targets(batch: dict[str, jax.Array], *, old_logp_bt: jax.Array, ref_logp_bt: jax.Array,
                old_values_bs: jax.Array, task_rewards_bs: jax.Array, kl_coef: jax.Array,
                gamma: float, lam: float, kl_estimator: str = "kl",
                whiten_advantages: bool = True) -> dict[str, jax.Array]:
  """Returns `advantages_bt` (token-aligned, whitened over agent tokens if asked), `returns_bs`,
  `rewards_bs` (shaped), `kl_bs`, and `mean_kl` (mean per-trajectory KL, for the controller)."""
  step_mask_bs = batch["step_mask_bs"]
  kl_bs = step_kl(old_logp_bt, ref_logp_bt, batch["step_id_bt"], step_mask_bs.shape[1],
                  estimator=kl_estimator) * step_mask_bs
  rewards_bs = kl_shaped_rewards(task_rewards_bs, kl_bs, step_mask_bs, kl_coef=kl_coef)
  advantages_bs, returns_bs = gae_over_steps(rewards_bs, old_values_bs, step_mask_bs,
                                             gamma=gamma, lam=lam)
  advantages_bt = steps_to_tokens(advantages_bs, batch["step_id_bt"])
  if whiten_advantages:
    advantages_bt = masked_whiten(advantages_bt, batch["loss_mask_bt"])
  has_steps_b = jnp.any(step_mask_bs > 0, axis=-1)
  return {
      "advantages_bt": advantages_bt,
      "returns_bs": returns_bs,
      "rewards_bs": rewards_bs,
      "kl_bs": kl_bs,
      "mean_kl": masked_mean(jnp.sum(kl_bs, axis=-1), has_steps_b),
  }
