"""Fixed-size key/value cache for incremental decoding.

Invariant: cache slot index == token position. A token at position p of row b is stored in
slot p of row b, and a query at position q attends to slots 0..q of its row. Callers therefore
write each row contiguously from position 0 (padding only at the right end of a chunk); slots
beyond a row's last written position hold stale data that the position mask hides. Writes at
positions >= max_len are dropped (useful to park padding tokens). Within one call, each row's
positions must increase along time (parked padding = max_len only at the end): the write is a
scatter declared sorted with unique in-range indices, which GPUs may rely on.

Layout: one array per layer, [batch, kv_heads, max_len, head_dim]. Separate per-layer buffers
let attention take its layer's cache as a matmul operand directly (a slice of one stacked
[layers, ...] buffer is copied out first: on an H200 that copy tripled decode's KV traffic), and
kv_heads before max_len makes each (row, kv head) a contiguous [max_len, head_dim] matrix, so both
attention matmuls read the cache as stored (see `llama.cached_attention`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from spa_jax.models.config import LlamaConfig

# each layer's k / v: [batch, kv_heads, max_len, head_dim]
CACHE_LOGICAL_AXES = ("batch", "act_kv_heads", "length", "head_dim")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Pytree holding the per-layer keys and values of every row."""

  k: tuple[jax.Array, ...]  # per layer: [batch, kv_heads, max_len, head_dim]
  v: tuple[jax.Array, ...]  # per layer: [batch, kv_heads, max_len, head_dim]

  @classmethod
  def init(cls, cfg: LlamaConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """Zero cache for `batch` rows of up to `max_len` positions (dtype defaults to cfg.dtype)."""
    dtype = cfg.compute_jnp_dtype if dtype is None else dtype
    shape = cls.layer_shape(cfg, batch, max_len)
    zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))  # noqa: E731
    return cls(k=zeros(), v=zeros())

  @staticmethod
  def layer_shape(cfg: LlamaConfig, batch: int, max_len: int) -> tuple[int, ...]:
    """Shape of each layer's k and v (axes named by CACHE_LOGICAL_AXES); use it instead of spelling it out."""
    return (batch, cfg.num_kv_heads, max_len, cfg.head_dim)

  @property
  def batch(self) -> int:
    return self.k[0].shape[0]

  @property
  def max_len(self) -> int:
    return self.k[0].shape[2]

  @property
  def nbytes(self) -> int:
    return sum(x.nbytes for x in self.k + self.v)

  def write_layer(
      self, layer: int, positions_bt: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array
  ) -> KVCache:
    """Cache with layer `layer`'s new keys/values stored at each row's `positions_bt` slots."""
    batch_idx_b1 = jnp.arange(self.batch)[:, None]
    # [row, :, position] selects a [batch, time, kv_heads, head_dim] block: k_btkh as given.
    # Declaring the (row, position) indices unique and sorted lets XLA GPU update the donated
    # cache in place: decode of a 3B model, 8 layers, B=32, S=2048 on an H200 went 8.6 -> 4.8 ms.
    update = dict(mode="drop", unique_indices=True, indices_are_sorted=True)

    def write(layers: tuple[jax.Array, ...], new_btkh: jax.Array) -> tuple[jax.Array, ...]:
      old = layers[layer]
      written = old.at[batch_idx_b1, :, positions_bt].set(new_btkh.astype(old.dtype), **update)
      return layers[:layer] + (written,) + layers[layer + 1:]

    return KVCache(k=write(self.k, k_btkh), v=write(self.v, v_btkh))
