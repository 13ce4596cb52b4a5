"""Masked statistics: mean, variance, whitening, Pearson correlation."""

import jax
import jax.numpy as jnp


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of `x` over entries where `mask` is 1 (0 when the mask is empty)."""
  mask = mask.astype(jnp.float32)
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def masked_var(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Population variance of `x` over the masked entries."""
  centred = x - masked_mean(x, mask)
  return masked_mean(centred * centred, mask)


def masked_whiten(x: jax.Array, mask: jax.Array, *, shift_mean: bool = True,
                  eps: float = 1e-8) -> jax.Array:
  """(x - mean) / std over the masked entries (mean added back if not `shift_mean`); 0 off the mask."""
  mean = masked_mean(x, mask)
  whitened = (x - mean) * jax.lax.rsqrt(masked_var(x, mask) + eps)
  if not shift_mean:
    whitened = whitened + mean
  return jnp.where(mask > 0, whitened, 0.0)


def pearson(x: jax.Array, y: jax.Array, mask: jax.Array) -> jax.Array:
  """Pearson correlation of x and y over the masked entries (0 when either is constant)."""
  x_c, y_c = x - masked_mean(x, mask), y - masked_mean(y, mask)
  cov = masked_mean(x_c * y_c, mask)
  denom = jnp.sqrt(masked_mean(x_c * x_c, mask) * masked_mean(y_c * y_c, mask))
  return jnp.where(denom > 0, cov / jnp.maximum(denom, 1e-12), 0.0)
