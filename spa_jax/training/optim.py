"""Optimizer from config: AdamW with a constant or warmup+cosine schedule and global-norm clipping.

Gradient accumulation happens inside the update steps (`steps.py` sums gradients of micro-batches
in a `lax.scan` before one optimizer update), so the optimizer itself is never wrapped.
"""

import dataclasses

import jax
import optax

SCHEDULES = ("constant", "warmup_cosine")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW hyper-parameters. `warmup_steps` ramp linearly from 0; cosine decays to 0 at
  `total_steps` (required for "warmup_cosine"). Weight decay applies to matrices only."""

  learning_rate: float
  schedule: str = "constant"
  warmup_steps: int = 0
  total_steps: int | None = None
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  grad_clip_norm: float | None = 1.0

  def __post_init__(self):
    if self.schedule not in SCHEDULES:
      raise ValueError(f"unknown schedule {self.schedule!r}; choose one of {SCHEDULES}")
    if self.schedule == "warmup_cosine" and not self.total_steps:
      raise ValueError("schedule 'warmup_cosine' needs total_steps (the number of updates)")
    if self.total_steps is not None and self.warmup_steps > self.total_steps:
      raise ValueError(f"warmup_steps={self.warmup_steps} exceeds total_steps={self.total_steps}")


def learning_rate_schedule(cfg: OptimizerConfig) -> optax.Schedule:
  """Learning rate as a function of the update count."""
  if cfg.schedule == "warmup_cosine":
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.total_steps, end_value=0.0)
  if cfg.warmup_steps == 0:
    return optax.constant_schedule(cfg.learning_rate)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps),
       optax.constant_schedule(cfg.learning_rate)], boundaries=[cfg.warmup_steps])


def _decay_mask(params):
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  """clip_by_global_norm (if set) followed by AdamW on the schedule."""
  adamw = optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                      weight_decay=cfg.weight_decay, mask=_decay_mask)
  if cfg.grad_clip_norm is None:
    return adamw
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), adamw)
