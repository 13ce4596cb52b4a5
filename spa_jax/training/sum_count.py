"""`SumCount`: an unreduced loss or metric, exact under micro-batching and multi-host reduction."""

from typing import NamedTuple

import jax
import jax.numpy as jnp


class SumCount(NamedTuple):
  """A sum over elements and the number of elements; `mean()` = total / count (0 when count is 0).

  A pytree: accumulate with `jax.tree.map(jnp.add, a, b)`.
  """

  total: jax.Array
  count: jax.Array

  def mean(self) -> jax.Array:
    return self.total / jnp.maximum(self.count, 1)


def masked_sum_count(x: jax.Array, mask: jax.Array) -> SumCount:
  """Sum of `x` weighted by `mask` (0/1, or weights), and the sum of the weights: with a 0/1 mask,
  the number of elements counted (both float32 scalars)."""
  mask = mask.astype(jnp.float32)
  return SumCount(jnp.sum(x.astype(jnp.float32) * mask), jnp.sum(mask))
