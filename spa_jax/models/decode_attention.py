"""Decode attention that reads only the cache slots each row holds (model.decode_attention="ragged").

`llama.cached_attention` hides the slots past each query's position with a mask, so every decode
step reads all `max_len` slots of every row: its KV traffic grows with agent.max_context (4,096 for
the pretrained presets), not with the tokens the rows hold (WebShop episodes: about 1.1k prompt
tokens plus the turns so far). JAX's Pallas split-K decode kernel
(`jax.experimental.pallas.ops.gpu.decode_attention.gqa`) loops over each row's first `lengths_b`
slots only and skips the splits past them. It is a Triton kernel for NVIDIA GPUs; on CPU it runs
in Pallas's interpret mode (correct but slow: for tests); TPUs need model.decode_attention="dense".

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
_MAX_SPLITS = 16  # split-K parallelism per (row, kv head): the kernel's default


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


def ragged_decode_attention(q_bnh, keys_bksh, values_bksh, lengths_b) -> jax.Array:
  """One query per row over its cache slots 0 .. lengths_b - 1 (0: no slot read, a zero output).

  q_bnh: [batch, heads, head_dim]; keys/values as `KVCache` stores a layer ([batch, kv_heads, slots,
  head_dim]). The query is cast to the cache dtype (as `llama.cached_attention` does); logits and the
  softmax statistics are float32. Returns [batch, heads, head_dim] in the query dtype.
  """
  backend = jax.default_backend()
  if backend == "tpu":
    raise ValueError("ragged decode attention is a Pallas GPU (Triton) kernel; on TPU set "
                     "config.model.decode_attention='dense'")
  block_k, k_splits = kernel_blocks(keys_bksh.shape[2])
  dtype = q_bnh.dtype

  def attend(q_bnh, keys_bksh, values_bksh, lengths_b):
    # gqa takes keys as [batch, slots, kv_heads, head_dim] and swaps them back to the cache's layout
    # for the kernel; XLA's simplifier folds the pair of transposes (whether the GPU program then
    # reads the cache in place is for bench/model_bench.py --decode-attention dense,ragged to show)
    return pallas_decode.gqa(
        q_bnh.astype(keys_bksh.dtype), jnp.swapaxes(keys_bksh, 1, 2), jnp.swapaxes(values_bksh, 1, 2),
        kv_seq_len=lengths_b, block_k=block_k, k_splits=k_splits, interpret=backend == "cpu",
    )

  axis_sizes = current_axis_sizes()
  if not axis_sizes or all(size == 1 for size in axis_sizes.values()):
    return attend(q_bnh, keys_bksh, values_bksh, lengths_b).astype(dtype)
  cache_spec = logical_to_spec(CACHE_LOGICAL_AXES, axis_sizes, keys_bksh.shape)
  rows, heads = cache_spec[0], cache_spec[1]
  query_spec = jax.P(rows, heads, None)
  out_bnh = jax.shard_map(
      attend, in_specs=(query_spec, cache_spec, cache_spec, jax.P(rows)), out_specs=query_spec, check_vma=False,
  )(q_bnh, keys_bksh, values_bksh, lengths_b)
  return out_bnh.astype(dtype)
