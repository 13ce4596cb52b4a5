"""Sharding rules table, and sharded vs unsharded Llama on 8 fake CPU devices (in a subprocess).

Run directly (`python tests/models/test_sharding.py`) with
XLA_FLAGS=--xla_force_host_platform_device_count=8 to execute the multi-device checks.
"""

import os
import subprocess
import sys
import tempfile

import pytest
from jax.sharding import PartitionSpec as P

from spa_jax.sharding import LOGICAL_AXIS_RULES, logical_to_spec, make_mesh

SIZES = {"data": 2, "fsdp": 2, "tensor": 2}


def test_rules_map_logical_axes_to_mesh_axes():
  assert logical_to_spec(("embed", "heads"), SIZES) == P("fsdp", "tensor")
  assert logical_to_spec(("vocab", "embed"), SIZES) == P("tensor", "fsdp")
  assert logical_to_spec(("batch", "length", "act_embed"), SIZES) == P(("data", "fsdp"), None, None)
  assert logical_to_spec(("norm",), SIZES) == P(None)


def test_rules_drop_reused_trivial_and_non_dividing_axes():
  # "batch" takes fsdp first, so "embed" cannot reuse it.
  assert logical_to_spec(("batch", "embed"), SIZES) == P(("data", "fsdp"), None)
  assert logical_to_spec(("embed", "mlp"), {"data": 8, "fsdp": 1, "tensor": 1}) == P(None, None)
  assert logical_to_spec(("vocab", "embed"), SIZES, shape=(97, 64)) == P(None, "fsdp")
  assert logical_to_spec(("batch",), SIZES, shape=(6,)) == P(None)


def test_unknown_logical_axis_and_bad_mesh_are_explained():
  with pytest.raises(KeyError, match="no rule"):
    logical_to_spec(("embedding",), SIZES)
  with pytest.raises(ValueError, match="needs 4 devices"):
    make_mesh(data=2, fsdp=2, tensor=1)
  assert all(isinstance(name, str) for name, _ in LOGICAL_AXIS_RULES)


@pytest.mark.slow
def test_sharded_forward_matches_unsharded_on_8_devices():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert "SHARDED CHECKS PASSED" in result.stdout


def _multi_device_checks():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from spa_jax.models import KVCache, Llama, LlamaConfig, load_hf, save_hf
  from spa_jax.sharding import create_sharded, logical_to_sharding, variable_logical_axes

  assert jax.device_count() == 8, jax.devices()
  cfg = LlamaConfig(
      vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
      num_kv_heads=2, head_dim=16, tie_embeddings=False,
  )
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  make = lambda: Llama(cfg, rngs=nnx.Rngs(0))  # noqa: E731
  plain = create_sharded(make)
  sharded = create_sharded(make, mesh)

  # Parameter shardings are what the table says.
  expected = {
      "embed": P(None, "fsdp"),  # vocab 97 is not divisible by tensor=2: replicated
      "q_proj": P("fsdp", "tensor"), "k_proj": P("fsdp", "tensor"), "v_proj": P("fsdp", "tensor"),
      "o_proj": P("tensor", "fsdp"), "gate_proj": P("fsdp", "tensor"), "up_proj": P("fsdp", "tensor"),
      "down_proj": P("tensor", "fsdp"),
      "lm_head": P("fsdp", None), "scale": P(None),
  }
  seen = set()
  for path, var in nnx.to_flat_state(nnx.state(sharded)):
    value = var.get_value()
    table = logical_to_sharding(variable_logical_axes(var), mesh, value.shape)
    assert value.sharding.is_equivalent_to(table, value.ndim), (path, value.sharding, table)
    name = next(p for p in reversed(path) if p in expected)
    assert value.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, expected[name]), value.ndim), path
    seen.add(name)
  assert seen == set(expected)
  for a, b in zip(jax.tree.leaves(nnx.state(plain)), jax.tree.leaves(nnx.state(sharded))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  tokens_bt = jax.random.randint(jax.random.key(0), (4, 12), 0, cfg.vocab_size)
  positions_bt = jnp.broadcast_to(jnp.arange(12), (4, 12))

  def forward_fn(graphdef):
    @jax.jit
    def forward(state, tokens_bt, positions_bt, cache):
      logits_btv, _, cache = nnx.merge(graphdef, state)(tokens_bt, positions_bt, cache=cache)
      return logits_btv, cache
    return forward

  graphdef, plain_state = nnx.split(plain)
  want_btv, _ = forward_fn(graphdef)(plain_state, tokens_bt, positions_bt, None)
  want_cached_btv, want_cache = forward_fn(graphdef)(plain_state, tokens_bt, positions_bt, KVCache.init(cfg, 4, 16))
  # one decode step after the 12 prefilled tokens (rows 1 and 3 parked: their positions are max_len)
  step_b1, step_positions_b1 = tokens_bt[:, :1], jnp.array([[12], [16], [12], [16]])
  want_step_b1v, _ = forward_fn(graphdef)(plain_state, step_b1, step_positions_b1, want_cache)

  batch_sharding = logical_to_sharding(("batch", "length"), mesh)
  with jax.set_mesh(mesh):
    graphdef, state = nnx.split(sharded)
    forward = forward_fn(graphdef)
    tokens_sharded = jax.device_put(tokens_bt, batch_sharding)
    positions_sharded = jax.device_put(positions_bt, batch_sharding)
    got_btv, _ = forward(state, tokens_sharded, positions_sharded, None)
    got_cached_btv, cache = forward(state, tokens_sharded, positions_sharded, KVCache.init(cfg, 4, 16))
  np.testing.assert_allclose(np.asarray(got_btv), np.asarray(want_btv), atol=1e-5)
  # The scanned layer stack (stacked on the fly, sharded like the layers) agrees, value and gradient.
  scanned = create_sharded(lambda: Llama(cfg.replace(scan_layers=True), rngs=nnx.Rngs(0)), mesh)
  scanned_graphdef, scanned_state = nnx.split(scanned)

  def mean_logsumexp(graphdef, state, tokens_bt, positions_bt):
    logits_btv, _, _ = nnx.merge(graphdef, state)(tokens_bt, positions_bt)
    return jnp.mean(jax.nn.logsumexp(logits_btv, axis=-1))

  grad_fn = jax.jit(jax.value_and_grad(mean_logsumexp, argnums=1), static_argnums=0)
  want_value, want_grads = grad_fn(graphdef, plain_state, tokens_bt, positions_bt)
  with jax.set_mesh(mesh):
    got_scanned_btv, _ = forward_fn(scanned_graphdef)(scanned_state, tokens_sharded, positions_sharded, None)
    got_value, got_grads = grad_fn(scanned_graphdef, scanned_state, tokens_sharded, positions_sharded)
  np.testing.assert_allclose(np.asarray(got_scanned_btv), np.asarray(want_btv), atol=1e-5)
  np.testing.assert_allclose(float(got_value), float(want_value), rtol=1e-6)
  for (path, want), (_, got) in zip(nnx.to_flat_state(want_grads), nnx.to_flat_state(got_grads)):
    np.testing.assert_allclose(np.asarray(got.get_value()), np.asarray(want.get_value()), atol=1e-6, err_msg=str(path))
  np.testing.assert_allclose(np.asarray(got_cached_btv), np.asarray(want_cached_btv), atol=1e-5)
  # Ragged attention over the cache (a Pallas call in shard_map over the cache's batch and kv-head
  # shards): the prefill's and the decode step's logits equal the dense masked read's, and the cache
  # keeps its sharding.
  cache_spec = cache.k[0].sharding.spec
  assert tuple(cache_spec[:2]) == (("data", "fsdp"), "tensor"), cache_spec
  ragged = create_sharded(lambda: Llama(cfg.replace(decode_attention="ragged"), rngs=nnx.Rngs(0)), mesh)
  with jax.set_mesh(mesh):
    ragged_graphdef, ragged_state = nnx.split(ragged)
    ragged_forward = forward_fn(ragged_graphdef)
    got_prefill_btv, _ = ragged_forward(ragged_state, tokens_sharded, positions_sharded, KVCache.init(cfg, 4, 16))
    got_step_b1v, step_cache = ragged_forward(
        ragged_state, jax.device_put(step_b1, batch_sharding), jax.device_put(step_positions_b1, batch_sharding), cache)
  assert step_cache.k[0].sharding.spec == cache_spec
  np.testing.assert_allclose(np.asarray(got_prefill_btv), np.asarray(want_cached_btv), atol=1e-5)
  np.testing.assert_allclose(np.asarray(got_step_b1v)[::2], np.asarray(want_step_b1v)[::2], atol=1e-5)
  assert len(got_btv.sharding.device_set) == 8

  # load_hf streams each tensor onto its shards.
  with tempfile.TemporaryDirectory() as tmp:
    save_hf(sharded, cfg, tmp)  # gathers the shards
    _, loaded = load_hf(tmp, mesh=mesh)
  for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(sharded)), nnx.to_flat_state(nnx.state(loaded))):
    assert b.get_value().sharding.is_equivalent_to(a.get_value().sharding, a.get_value().ndim), path
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))
  print("SHARDED CHECKS PASSED")


if __name__ == "__main__":
  _multi_device_checks()
