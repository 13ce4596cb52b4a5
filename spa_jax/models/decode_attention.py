"""Attention over the KV cache that reads only the slots each row holds (model.decode_attention="ragged").

`llama.cached_attention` hides the slots past each query's position with a mask, so every decode
step and every prefill chunk reads all `max_len` slots of every row (and a prefill chunk writes
float32 logits for all of them): its traffic grows with agent.max_context (4,096 for the pretrained
presets), not with the tokens the rows hold (WebShop episodes: about 1.1k prompt tokens plus the
turns so far). Here a chunk of t new tokens per row (t = 1 when decoding) at positions
starts_b + i attends to

  * the cache slots before the chunk, 0 .. starts_b - 1, through JAX's Pallas split-K decode kernel
    (`jax.experimental.pallas.ops.gpu.decode_attention.gqa`), which loops over each row's first
    starts_b slots only; the chunk's t queries of a kv head are the kernel's query rows;
  * the chunk's own keys, causally: a dense t x t attention on the new keys and values;

and the two softmax parts are merged by their maxima and sums (`_merge`). The kernel is a Triton
kernel for NVIDIA GPUs; on CPU it runs in Pallas's interpret mode (correct but slow: for tests);
TPUs need model.decode_attention="dense".

A Pallas call is not partitioned by XLA, so under a mesh (`jax.set_mesh`) it runs in `shard_map`
over the cache's batch and kv-head shards; query head n reads kv head n // (heads per kv head), so
the query heads are split by the kv heads' mesh axes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import decode_attention as pallas_decode

from spa_jax.models.kv_cache import CACHE_LOGICAL_AXES
from spa_jax.sharding import current_axis_sizes, logical_to_spec

SLOT_MULTIPLE = 16  # the kernel's smallest key block
_MAX_SPLITS = 16  # split-K parallelism per (row, kv head) of a decode step: the kernel's default
_QUERY_BLOCK = 64  # query rows per program for a prefill chunk (a decode step's 16: the kernel's default)


def kernel_blocks(slots: int) -> tuple[int, int]:
  """(block_k, k_splits) for a cache of `slots` slots: the largest key block of 128/64/32/16 slots
  that divides it, and the most splits (<= 16) that divide its blocks. ValueError when `slots` is
  not a multiple of 16."""
  block_k = next((b for b in (128, 64, 32, SLOT_MULTIPLE) if slots % b == 0), None)
  if block_k is None:
    fix = -(-slots // SLOT_MULTIPLE) * SLOT_MULTIPLE
    raise ValueError(f"ragged decode attention needs a KV cache of a multiple of {SLOT_MULTIPLE} slots, got {slots}: "
                     f"set config.agent.max_context={fix} or config.model.decode_attention='dense'")
  blocks = slots // block_k
  return block_k, max(d for d in range(1, _MAX_SPLITS + 1) if blocks % d == 0)


def ragged_cached_attention(q_btnh, k_btkh, v_btkh, keys_bksh, values_bksh, starts_b) -> jax.Array:
  """Each row's chunk of t queries at positions starts_b + i over its cache slots 0 .. starts_b - 1 and,
  causally, the chunk's own keys/values `k_btkh`, `v_btkh` (its slots in the cache are not read).

  Keys/values as `KVCache` stores a layer ([batch, kv_heads, slots, head_dim]); starts_b >= slots (a
  row parked at max_len) reads no slot. The query is cast to the cache dtype (as
  `llama.cached_attention` does); logits and softmax statistics are float32. Returns
  [batch, t, heads, head_dim] in the query dtype.
  """
  b, t, n, h = q_btnh.shape
  kv, slots = keys_bksh.shape[1], keys_bksh.shape[2]
  dtype = keys_bksh.dtype
  q_bkgth = q_btnh.reshape(b, t, kv, n // kv, h).transpose(0, 2, 3, 1, 4).astype(dtype)
  lengths_b = jnp.where(starts_b < slots, starts_b, 0)
  cached = _cached_part(q_bkgth.reshape(b, kv * (n // kv) * t, h), keys_bksh, values_bksh, lengths_b, t)
  cached = tuple(x.reshape(q_bkgth.shape[:4] + x.shape[2:]) for x in cached)

  logits_bkgtj = jnp.einsum("bkgth,bjkh->bkgtj", q_bkgth, k_btkh.astype(dtype),
                            preferred_element_type=jnp.float32) * (h**-0.5)
  causal_tj = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
  logits_bkgtj = jnp.where(causal_tj, logits_bkgtj, jnp.finfo(jnp.float32).min)
  max_bkgt = logits_bkgtj.max(axis=-1)
  weights_bkgtj = jnp.exp(logits_bkgtj - max_bkgt[..., None])
  sum_bkgt = weights_bkgtj.sum(axis=-1)
  own_bkgth = jnp.einsum("bkgtj,bjkh->bkgth", weights_bkgtj.astype(dtype), v_btkh.astype(dtype),
                         preferred_element_type=jnp.float32)
  out_bkgth = _merge(cached, (own_bkgth, sum_bkgt, max_bkgt))
  return out_bkgth.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h).astype(q_btnh.dtype)


def _merge(cached, own) -> jax.Array:
  """One softmax from two parts over disjoint keys: (normalised output, sum, max) of the cached part
  (an empty part has sum 0) and (unnormalised output, sum, max) of the chunk's own keys."""
  out_c, sum_c, max_c = cached
  out_o, sum_o, max_o = own
  top = jnp.maximum(max_c, max_o)
  scale_c, scale_o = sum_c * jnp.exp(max_c - top), jnp.exp(max_o - top)
  total = scale_c + sum_o * scale_o
  return (out_c.astype(jnp.float32) * scale_c[..., None] + out_o * scale_o[..., None]) / total[..., None]


def _cached_part(q_bqh, keys_bksh, values_bksh, lengths_b, t: int):
  """The kernel over each row's first lengths_b slots for the rows' query rows [b, kv * g * t, h]
  (kv-head major): (normalised output [b, q, h] in the cache dtype, softmax sum [b, q], max [b, q])."""
  backend = jax.default_backend()
  if backend == "tpu":
    raise ValueError("ragged decode attention is a Pallas GPU (Triton) kernel; on TPU set "
                     "config.model.decode_attention='dense'")
  block_k, k_splits = kernel_blocks(keys_bksh.shape[2])

  def attend(q_bqh, keys_bksh, values_bksh, lengths_b):
    # gqa takes keys as [batch, slots, kv_heads, head_dim] and swaps them back to the cache's layout
    # for the kernel; XLA's simplifier folds the pair of transposes (whether the GPU program then
    # reads the cache in place is for bench/model_bench.py --decode-attention dense,ragged to show).
    # A decode step splits each row's slots 16 ways for parallelism; a prefill chunk has its query
    # rows for that (one split: every split's partial output would be a [b, q, h] array).
    out_bqh, (sum_bq, max_bq) = pallas_decode.gqa(
        q_bqh, jnp.swapaxes(keys_bksh, 1, 2), jnp.swapaxes(values_bksh, 1, 2), kv_seq_len=lengths_b,
        block_k=block_k, k_splits=k_splits if t == 1 else 1, block_h=16 if t == 1 else _QUERY_BLOCK,
        interpret=backend == "cpu", return_residuals=True,
    )
    return out_bqh, sum_bq, max_bq

  axis_sizes = current_axis_sizes()
  if not axis_sizes or all(size == 1 for size in axis_sizes.values()):
    return attend(q_bqh, keys_bksh, values_bksh, lengths_b)
  cache_spec = logical_to_spec(CACHE_LOGICAL_AXES, axis_sizes, keys_bksh.shape)
  rows, heads = cache_spec[0], cache_spec[1]
  query_spec = jax.P(rows, heads, None)
  return jax.shard_map(
      attend, in_specs=(query_spec, cache_spec, cache_spec, jax.P(rows)),
      out_specs=(query_spec, jax.P(rows, heads), jax.P(rows, heads)), check_vma=False,
  )(q_bqh, keys_bksh, values_bksh, lengths_b)
