"""Ragged attention over the KV cache (the Pallas split-K kernel, interpreted on CPU, for the slots
before a chunk; a dense causal part for the chunk itself) against the dense masked
`cached_attention` over the cache with the chunk written in: same outputs for decode steps and
prefill chunks at every row start, GQA group size and cache dtype; key blocks past a row never read;
the kernel's block choice and the errors that name the fix. The sharded case runs in
tests/models/test_sharding.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spa_jax.models.decode_attention import kernel_blocks, ragged_cached_attention
from spa_jax.models.llama import cached_attention


def random_case(batch, chunk, heads, kv_heads, slots, head_dim, cache_dtype, seed=0):
  keys = jax.random.split(jax.random.key(seed), 5)
  normal = lambda key, shape: jax.random.normal(key, shape, jnp.float32)  # noqa: E731
  q_btnh = normal(keys[0], (batch, chunk, heads, head_dim))
  k_btkh, v_btkh = normal(keys[1], (batch, chunk, kv_heads, head_dim)), normal(keys[2], (batch, chunk, kv_heads, head_dim))
  cache_k = normal(keys[3], (batch, kv_heads, slots, head_dim)).astype(cache_dtype)
  cache_v = normal(keys[4], (batch, kv_heads, slots, head_dim)).astype(cache_dtype)
  return q_btnh, k_btkh, v_btkh, cache_k, cache_v


def written(cache, new_btkh, starts_b):
  """The cache with each row's chunk stored at starts_b + i (as KVCache.write_layer does)."""
  t = new_btkh.shape[1]
  for row, start in enumerate(np.asarray(starts_b)):
    cache = cache.at[row, :, start:start + t].set(jnp.swapaxes(new_btkh[row], 0, 1).astype(cache.dtype))
  return cache


@pytest.mark.parametrize("chunk", [1, 5])  # a decode step; a prefill chunk
@pytest.mark.parametrize("heads,kv_heads,cache_dtype,atol", [
    (4, 2, jnp.float32, 2e-6),  # the micro model's groups of 2
    (6, 2, jnp.bfloat16, 3e-2),  # groups of 3 (the 3B shape's ratio), bfloat16 cache as on the GPU
    (4, 4, jnp.float32, 2e-6),  # plain multi-head
])
def test_ragged_equals_dense_masked_attention_for_every_row_start(chunk, heads, kv_heads, cache_dtype, atol):
  slots = 96  # 3 key blocks of 32, 3 splits: rows start inside the first, at a split boundary, in the last
  starts_b = np.array([0, 5, 31, 32, 63, 70, 96 - chunk])
  q_btnh, k_btkh, v_btkh, cache_k, cache_v = random_case(len(starts_b), chunk, heads, kv_heads, slots, 16, cache_dtype)
  cache_k, cache_v = written(cache_k, k_btkh, starts_b), written(cache_v, v_btkh, starts_b)
  positions_bt = jnp.asarray(starts_b)[:, None] + jnp.arange(chunk)
  want_btnh = cached_attention(q_btnh, cache_k, cache_v, positions_bt)
  got_btnh = jax.jit(ragged_cached_attention)(q_btnh, k_btkh, v_btkh, cache_k, cache_v, jnp.asarray(starts_b))
  assert got_btnh.shape == q_btnh.shape and got_btnh.dtype == q_btnh.dtype
  np.testing.assert_allclose(np.asarray(got_btnh), np.asarray(want_btnh), atol=atol)


def test_key_blocks_past_a_rows_start_are_never_read():
  q_btnh, k_btkh, v_btkh, cache_k, cache_v = random_case(3, 2, 4, 2, 96, 16, jnp.float32)  # 3 splits of one 32-slot block
  starts_b = jnp.array([10, 40, 96])  # row 2 is parked (start = slots): it reads no slot
  before = ragged_cached_attention(q_btnh, k_btkh, v_btkh, cache_k, cache_v, starts_b)
  # NaN in every block after each row's last one (row 0: slots 32..95, row 1: 64..95, row 2: all) changes nothing
  poisoned = lambda x: x.at[0, :, 32:].set(jnp.nan).at[1, :, 64:].set(jnp.nan).at[2].set(jnp.nan)  # noqa: E731
  after = ragged_cached_attention(q_btnh, k_btkh, v_btkh, poisoned(cache_k), poisoned(cache_v), starts_b)
  np.testing.assert_array_equal(np.asarray(after), np.asarray(before))
  # the parked row attends to its chunk alone: its first query sees only its own value
  np.testing.assert_allclose(np.asarray(before[2, 0]), np.repeat(np.asarray(v_btkh[2, 0]), 2, axis=0), atol=1e-6)


def test_block_choice_and_a_cache_the_kernel_cannot_tile():
  assert kernel_blocks(4096) == (128, 16)  # 32 blocks of 128 in 16 splits of 256 slots
  assert kernel_blocks(1088) == (64, 1)  # 17 blocks of 64: one split
  assert kernel_blocks(96) == (32, 3)
  with pytest.raises(ValueError, match=r"multiple of 16 slots, got 100: set config.agent.max_context=112"):
    kernel_blocks(100)
