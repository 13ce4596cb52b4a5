"""Low-rank adapters on Llama projections, trainable/frozen filters, and merging for export.

Typical LoRA training split (only adapters get gradients / optimizer state):

    apply_lora(model, rank=16, alpha=32, rngs=nnx.Rngs(1))
    graphdef, trainable, frozen = nnx.split(model, trainable_filter(model), ...)

Without `apply_lora` the model is fully fine-tuned (`trainable_filter` is then `nnx.Param`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from spa_jax.models.llama import Linear

DEFAULT_TARGETS = ("q_proj", "v_proj")
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")

FROZEN_BASE_FILTER = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))


class LoRAAdapter(nnx.Module):
  """`(x @ a) @ b * alpha / rank` with a: [in, rank] (random), b: [rank, out] (zeros)."""

  def __init__(
      self, in_features: int, out_features: int, rank: int, alpha: float,
      logical_axes: tuple[str, str], dtype, *, rngs: nnx.Rngs,
  ):
    init_a = jax.nn.initializers.he_uniform()
    self.a = nnx.LoRAParam(
        init_a(rngs.params(), (in_features, rank), jnp.float32),
        logical_axes=(logical_axes[0], "lora_rank"),
    )
    self.b = nnx.LoRAParam(
        jnp.zeros((rank, out_features), jnp.float32), logical_axes=("lora_rank", logical_axes[1])
    )
    self.scale = alpha / rank
    self.dtype = dtype

  def __call__(self, x_bti: jax.Array) -> jax.Array:
    h_btr = x_bti @ self.a[...].astype(self.dtype)
    return (h_btr @ self.b[...].astype(self.dtype)) * jnp.asarray(self.scale, self.dtype)

  def delta_kernel(self) -> jax.Array:
    """The dense `[in, out]` update this adapter adds to its base kernel (float32)."""
    return (self.a[...] @ self.b[...]) * self.scale


def _target_linears(model: nnx.Module, targets) -> list[tuple[tuple, Linear]]:
  return [
      (path, module) for path, module in nnx.iter_modules(model)
      if isinstance(module, Linear) and path and path[-1] in targets
  ]


def apply_lora(
    model: nnx.Module, rank: int, alpha: float, targets=DEFAULT_TARGETS, *, rngs: nnx.Rngs
) -> nnx.Module:
  """Attach LoRA adapters (B = 0, so outputs are unchanged) to the named projections, in place."""
  if rank <= 0:
    raise ValueError(f"LoRA rank must be positive, got {rank}.")
  unknown = set(targets) - set(ALL_TARGETS)
  if unknown:
    raise ValueError(f"Unknown LoRA targets {sorted(unknown)}; choose from {ALL_TARGETS}.")
  found = _target_linears(model, targets)
  missing = set(targets) - {path[-1] for path, _ in found}
  if missing:
    raise ValueError(
        f"No projection named {sorted(missing)} in the model (a tied lm_head has none); drop it from targets."
    )
  for _, linear in found:
    if linear.lora is not None:
      raise ValueError("apply_lora called twice on the same projection; merge_lora first.")
    in_features, out_features = linear.kernel.shape
    linear.lora = LoRAAdapter(
        in_features, out_features, rank, alpha, linear.kernel.get_metadata()["logical_axes"],
        linear.dtype, rngs=rngs,
    )
  return model


def has_lora(model: nnx.Module) -> bool:
  return any(isinstance(m, LoRAAdapter) for _, m in nnx.iter_modules(model))


def trainable_filter(model: nnx.Module):
  """`nnx.LoRAParam` when the model has adapters (base frozen), else every `nnx.Param`."""
  return nnx.LoRAParam if has_lora(model) else nnx.Param


def merged_kernel(linear: Linear) -> jax.Array:
  """The projection's kernel with its adapter folded in (the kernel itself if none)."""
  kernel = linear.kernel[...]
  if linear.lora is None:
    return kernel
  return (kernel.astype(jnp.float32) + linear.lora.delta_kernel()).astype(kernel.dtype)


def merge_lora(model: nnx.Module) -> nnx.Module:
  """Fold every adapter into its base kernel and remove the adapters, in place."""
  for _, linear in _target_linears(model, ALL_TARGETS):
    if linear.lora is not None:
      linear.kernel[...] = merged_kernel(linear)
      linear.lora = None
  return model
