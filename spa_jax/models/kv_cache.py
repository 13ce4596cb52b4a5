"""Fixed-size key/value cache for incremental decoding.

Invariant: cache slot index == token position. A token at position p of row b is stored in
slot p of row b, and a query at position q attends to slots 0..q of its row. Callers therefore
write each row contiguously from position 0 (padding only at the right end of a chunk); slots
beyond a row's last written position hold stale data that the position mask hides. Writes at
positions >= max_len are dropped (useful to park padding tokens). Within one call, each row's
positions must increase along time (parked padding = max_len only at the end): the write is a
scatter declared sorted with unique in-range indices, which GPUs may rely on.

Layout: kv_heads before max_len, so that attention reads each (row, kv head) as a contiguous
[max_len, head_dim] matrix: both attention matmuls then consume the cache as stored, with no
transposed copy of it (see `llama.cached_attention`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from spa_jax.models.config import LlamaConfig

# k / v: [layers, batch, kv_heads, max_len, head_dim]
CACHE_LOGICAL_AXES = ("layers", "batch", "act_kv_heads", "length", "head_dim")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Pytree holding the per-layer keys and values of every row."""

  k: jax.Array  # [layers, batch, kv_heads, max_len, head_dim]
  v: jax.Array  # [layers, batch, kv_heads, max_len, head_dim]

  @classmethod
  def init(cls, cfg: LlamaConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """Zero cache for `batch` rows of up to `max_len` positions (dtype defaults to cfg.dtype)."""
    dtype = cfg.compute_jnp_dtype if dtype is None else dtype
    shape = cls.array_shape(cfg, batch, max_len)
    return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))

  @staticmethod
  def array_shape(cfg: LlamaConfig, batch: int, max_len: int) -> tuple[int, ...]:
    """Shape of `k` and `v` (axes named by CACHE_LOGICAL_AXES); use it instead of spelling it out."""
    return (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)

  @property
  def batch(self) -> int:
    return self.k.shape[1]

  @property
  def max_len(self) -> int:
    return self.k.shape[3]

  def write_layer(
      self, layer: int, positions_bt: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array
  ) -> KVCache:
    """Cache with layer `layer`'s new keys/values stored at each row's `positions_bt` slots."""
    batch_idx_b1 = jnp.arange(self.batch)[:, None]
    # [layer, row, :, position] selects a [batch, time, kv_heads, head_dim] block: k_btkh as given.
    # Declaring the (row, position) indices unique and sorted lets XLA GPU update the donated
    # cache in place: decode of a 3B model, 8 layers, B=32, S=2048 on an H200 went 8.6 -> 4.8 ms.
    update = dict(mode="drop", unique_indices=True, indices_are_sorted=True)
    k = self.k.at[layer, batch_idx_b1, :, positions_bt].set(k_btkh.astype(self.k.dtype), **update)
    v = self.v.at[layer, batch_idx_b1, :, positions_bt].set(v_btkh.astype(self.v.dtype), **update)
    return KVCache(k=k, v=v)
