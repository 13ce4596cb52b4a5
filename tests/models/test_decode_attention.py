"""Ragged decode attention (the Pallas split-K kernel, interpreted on CPU) against the dense masked
`cached_attention`: same outputs for every row length, GQA group size and cache dtype; its block
choice and the errors that name the fix. The sharded case runs in tests/models/test_sharding.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spa_jax.models.decode_attention import kernel_blocks, ragged_decode_attention
from spa_jax.models.llama import cached_attention


def random_case(batch, heads, kv_heads, slots, head_dim, cache_dtype, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  q_bnh = jax.random.normal(keys[0], (batch, heads, head_dim), jnp.float32)
  k_bksh = jax.random.normal(keys[1], (batch, kv_heads, slots, head_dim), jnp.float32).astype(cache_dtype)
  v_bksh = jax.random.normal(keys[2], (batch, kv_heads, slots, head_dim), jnp.float32).astype(cache_dtype)
  return q_bnh, k_bksh, v_bksh


@pytest.mark.parametrize("heads,kv_heads,cache_dtype,atol", [
    (4, 2, jnp.float32, 2e-6),  # the micro model's groups of 2
    (6, 2, jnp.bfloat16, 2e-2),  # groups of 3 (the 3B shape's ratio), bfloat16 cache as on the GPU
    (4, 4, jnp.float32, 2e-6),  # plain multi-head
])
def test_ragged_equals_dense_masked_attention_for_every_row_length(heads, kv_heads, cache_dtype, atol):
  slots = 96  # 3 key blocks of 32, 3 splits: rows end inside the first, at a split boundary, in the last
  positions_b = np.array([0, 5, 31, 32, 63, 70, 95])
  q_bnh, k_bksh, v_bksh = random_case(len(positions_b), heads, kv_heads, slots, 16, cache_dtype)
  want_bnh = cached_attention(q_bnh[:, None], k_bksh, v_bksh, jnp.asarray(positions_b)[:, None])[:, 0]
  got_bnh = jax.jit(ragged_decode_attention)(q_bnh, k_bksh, v_bksh, jnp.asarray(positions_b + 1))
  assert got_bnh.shape == q_bnh.shape and got_bnh.dtype == q_bnh.dtype
  np.testing.assert_allclose(np.asarray(got_bnh), np.asarray(want_bnh), atol=atol)


def test_key_blocks_past_a_rows_length_are_never_read():
  q_bnh, k_bksh, v_bksh = random_case(2, 4, 2, 96, 16, jnp.float32)  # 3 splits of one 32-slot key block
  lengths_b = jnp.array([10, 40])
  before = ragged_decode_attention(q_bnh, k_bksh, v_bksh, lengths_b)
  # NaN in every block after each row's last one (row 0: slots 32..95, row 1: 64..95) changes nothing
  poisoned = lambda x: x.at[0, :, 32:].set(jnp.nan).at[1, :, 64:].set(jnp.nan)  # noqa: E731
  after = ragged_decode_attention(q_bnh, poisoned(k_bksh), poisoned(v_bksh), lengths_b)
  np.testing.assert_array_equal(np.asarray(after), np.asarray(before))
  empty = ragged_decode_attention(q_bnh, k_bksh, v_bksh, jnp.array([0, 40]))  # a parked row reads nothing
  np.testing.assert_array_equal(np.asarray(empty[0]), 0.0)
  np.testing.assert_array_equal(np.asarray(empty[1]), np.asarray(before[1]))


def test_block_choice_and_a_cache_the_kernel_cannot_tile():
  assert kernel_blocks(4096) == (128, 16)  # 32 blocks of 128 in 16 splits of 256 slots
  assert kernel_blocks(1088) == (64, 1)  # 17 blocks of 64: one split
  assert kernel_blocks(96) == (32, 3)
  with pytest.raises(ValueError, match=r"multiple of 16 slots, got 100: set config.agent.max_context=112"):
    kernel_blocks(100)
