"""KL to the reference policy: per-step estimates, reward shaping and the KL-coefficient controllers.

The KL penalty enters as step reward shaping r_s - kl_coef * KL_s, with KL_s summed over the
tokens of action s from per-token log-probs of the sampling policy and the frozen reference.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from spa_jax.training.batch import sum_tokens_per_step

KL_ESTIMATORS = ("kl", "k3")


def token_kl(logp_policy_bt: jax.Array, logp_ref_bt: jax.Array, estimator: str) -> jax.Array:
  """Per-token KL(pi || ref) estimate from samples of pi.

  "kl": log pi - log ref (unbiased, can be negative); "k3": exp(d) - 1 - d with d = log ref - log pi
  (unbiased, non-negative, lower variance).
  """
  if estimator == "kl":
    return logp_policy_bt - logp_ref_bt
  if estimator == "k3":
    log_ratio_bt = logp_ref_bt - logp_policy_bt
    return jnp.expm1(log_ratio_bt) - log_ratio_bt
  raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


def step_kl(logp_policy_bt: jax.Array, logp_ref_bt: jax.Array, step_id_bt: jax.Array,
            num_steps: int, *, estimator: str = "kl") -> jax.Array:
  """KL_s = sum over the tokens of action s of the per-token estimate: [B, S]."""
  kl_bt = token_kl(logp_policy_bt, logp_ref_bt, estimator)
  return sum_tokens_per_step(jnp.where(step_id_bt >= 0, kl_bt, 0.0), step_id_bt, num_steps)


def kl_shaped_rewards(rewards_bs: jax.Array, kl_bs: jax.Array, step_mask_bs: jax.Array, *,
                      kl_coef: float | jax.Array) -> jax.Array:
  """r_s - kl_coef * KL_s on real steps, 0 on padding."""
  return (rewards_bs - kl_coef * kl_bs) * step_mask_bs


@dataclasses.dataclass(frozen=True)
class FixedKLController:
  """A constant KL coefficient."""

  coef: float

  def initial(self) -> float:
    return self.coef

  def update(self, coef: float, current_kl: float, num_samples: int) -> float:
    del current_kl, num_samples
    return coef


@dataclasses.dataclass(frozen=True)
class AdaptiveKLController:
  """Ziegler et al. (2019) proportional controller driving the observed KL towards `target`.

  coef <- coef * (1 + clip(KL / target - 1, -0.2, 0.2) * num_samples / horizon), where KL is the
  mean per-trajectory KL of the batch and num_samples the trajectories it was measured on.
  """

  init: float
  target: float
  horizon: int

  def initial(self) -> float:
    return self.init

  def update(self, coef: float, current_kl: float, num_samples: int) -> float:
    error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
    return coef * (1.0 + error * num_samples / self.horizon)


def make_kl_controller(kind: str, *, init: float, target: float | None = None,
                       horizon: int | None = None) -> FixedKLController | AdaptiveKLController:
  """Controller from config: kind "fixed" (coef = init) or "adaptive" (needs target and horizon)."""
  if kind == "fixed":
    return FixedKLController(init)
  if kind == "adaptive":
    if target is None or horizon is None:
      raise ValueError("adaptive KL control needs kl_target and kl_horizon in the config")
    return AdaptiveKLController(init, target, horizon)
  raise ValueError(f"unknown KL controller {kind!r}; choose 'fixed' or 'adaptive'")
