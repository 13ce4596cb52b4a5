"""Llama forward: cache consistency, padding, remat, scanned layers, jit split/merge, config presets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spa_jax.models import KVCache, Llama, LlamaConfig, apply_lora
from spa_jax.sharding import create_sharded

VOCAB = 97  # tests/conftest.py micro_cfg


@nnx.jit(static_argnames="compute_logits")
def jit_call(model, tokens_bt, positions_bt, cache=None, attn_mask_bt=None, compute_logits=True):
  return model(tokens_bt, positions_bt, cache=cache, attn_mask_bt=attn_mask_bt,
               compute_logits=compute_logits)


def _forward_fn(graphdef):
  @jax.jit
  def forward(state, tokens_bt, positions_bt, cache=None):
    model = nnx.merge(graphdef, state)
    logits_btv, _, cache = model(tokens_bt, positions_bt, cache=cache)
    return logits_btv, cache

  return forward


def _make(cfg, seed=0):
  return create_sharded(lambda: Llama(cfg, rngs=nnx.Rngs(seed)))


def _random_tokens(batch, length, seed=0):
  return jax.random.randint(jax.random.key(seed), (batch, length), 0, VOCAB)


def test_forward_shapes_and_hidden_to_logits(micro_model, micro_cfg):
  tokens_bt = _random_tokens(2, 7)
  positions_bt = jnp.broadcast_to(jnp.arange(7), (2, 7))
  logits_btv, hidden_btd, cache = jit_call(micro_model, tokens_bt, positions_bt)
  assert logits_btv.shape == (2, 7, micro_cfg.vocab_size)
  assert hidden_btd.shape == (2, 7, micro_cfg.hidden_size)
  assert cache is None
  np.testing.assert_allclose(micro_model.logits_from_hidden(hidden_btd), logits_btv, atol=1e-6)
  no_logits, hidden_again, _ = jit_call(micro_model, tokens_bt, positions_bt, compute_logits=False)
  assert no_logits is None
  np.testing.assert_array_equal(hidden_again, hidden_btd)


def test_causality(micro_model, micro_cfg):
  tokens_bt = _random_tokens(1, 8)
  positions_bt = jnp.arange(8)[None]
  changed_bt = tokens_bt.at[0, 5].set((tokens_bt[0, 5] + 1) % micro_cfg.vocab_size)
  logits_a, _, _ = jit_call(micro_model, tokens_bt, positions_bt)
  logits_b, _, _ = jit_call(micro_model, changed_bt, positions_bt)
  np.testing.assert_array_equal(logits_a[:, :5], logits_b[:, :5])
  assert not np.allclose(logits_a[:, 5:], logits_b[:, 5:])


def test_prefill_extend_decode_matches_full_forward(micro_model, micro_cfg):
  """Per-row offsets: row 0 has a 5-token prompt, row 1 a 3-token prompt (right-padded)."""
  full_len, max_len = 12, 16
  tokens_bt = _random_tokens(2, full_len, seed=1)
  graphdef, state = nnx.split(micro_model)
  forward = _forward_fn(graphdef)
  full_logits_btv, _ = forward(state, tokens_bt, jnp.broadcast_to(jnp.arange(full_len), (2, full_len)))

  lengths = np.array([5, 3])
  cached_logits = np.zeros((2, full_len, micro_cfg.vocab_size), np.float32)

  def run_chunk(cache, starts, chunk_len, real_lens):
    offsets_t = np.arange(chunk_len)
    positions_bt = starts[:, None] + offsets_t[None]
    real_bt = offsets_t[None] < real_lens[:, None]
    idx_bt = np.minimum(positions_bt, full_len - 1)
    chunk_tokens_bt = jnp.take_along_axis(tokens_bt, jnp.asarray(idx_bt), axis=1)
    logits_btv, cache = forward(state, chunk_tokens_bt, jnp.asarray(positions_bt, jnp.int32), cache)
    for row in range(2):
      for j in range(real_lens[row]):
        cached_logits[row, positions_bt[row, j]] = logits_btv[row, j]
    return cache

  cache = KVCache.init(micro_cfg, 2, max_len, jnp.float32)
  cache = run_chunk(cache, np.array([0, 0]), 5, lengths)  # prefill (row 1 padded)
  cache = run_chunk(cache, lengths, 4, np.array([4, 4]))  # extend: an "observation"
  lengths = lengths + 4
  while (lengths < full_len).any():  # token-by-token decode; finished rows park at max_len
    real = (lengths < full_len).astype(int)
    starts = np.where(real == 1, lengths, max_len)
    cache = run_chunk(cache, starts, 1, real)
    lengths = lengths + real
  np.testing.assert_allclose(cached_logits, full_logits_btv, atol=2e-5, rtol=1e-5)


def test_left_padding_mask_matches_unpadded(micro_model):
  tokens_t = _random_tokens(1, 6, seed=2)[0]
  pad = 3
  padded_bt = jnp.concatenate([jnp.zeros((pad,), jnp.int32), tokens_t])[None]
  mask_bt = (jnp.arange(pad + 6) >= pad)[None]
  positions_bt = jnp.maximum(jnp.cumsum(mask_bt, axis=1) - 1, 0)
  padded_logits, _, _ = jit_call(micro_model, padded_bt, positions_bt, attn_mask_bt=mask_bt)
  plain_logits, _, _ = jit_call(micro_model, tokens_t[None], jnp.arange(6)[None])
  assert np.isfinite(np.asarray(padded_logits)).all()
  np.testing.assert_allclose(padded_logits[:, pad:], plain_logits, atol=2e-5)


def test_right_padding_needs_no_mask(micro_model):
  tokens_bt = _random_tokens(2, 8, seed=4)
  positions_bt = jnp.broadcast_to(jnp.arange(8), (2, 8))
  mask_bt = jnp.arange(8)[None] < jnp.array([[8], [5]])
  masked, _, _ = jit_call(micro_model, tokens_bt, positions_bt, attn_mask_bt=mask_bt)
  unmasked, _, _ = jit_call(micro_model, tokens_bt, positions_bt)
  np.testing.assert_allclose(unmasked[1, :5], masked[1, :5], atol=1e-6)
  np.testing.assert_allclose(unmasked[0], masked[0], atol=1e-6)


def test_remat_gives_same_values_and_grads(micro_model, micro_cfg):
  tokens_bt = _random_tokens(2, 6, seed=3)
  positions_bt = jnp.broadcast_to(jnp.arange(6), (2, 6))
  graphdef, state = nnx.split(micro_model)
  remat_graphdef = nnx.graphdef(nnx.eval_shape(lambda: Llama(micro_cfg.replace(remat_policy="dots"), rngs=nnx.Rngs(0))))

  def loss(state, graphdef):
    logits_btv, _, _ = nnx.merge(graphdef, state)(tokens_bt, positions_bt)
    return jnp.mean(jax.nn.logsumexp(logits_btv, axis=-1))

  value, grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)(state, graphdef)
  remat_value, remat_grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)(state, remat_graphdef)
  np.testing.assert_allclose(remat_value, value, rtol=1e-6)
  for g, rg in zip(jax.tree.leaves(grads), jax.tree.leaves(remat_grads)):
    np.testing.assert_allclose(rg, g, atol=1e-6)


def test_bf16_compute_path(micro_cfg):
  cfg = micro_cfg.replace(param_dtype="bfloat16", dtype="bfloat16", num_layers=1)
  model = _make(cfg)
  logits_btv, hidden_btd, _ = jit_call(model, _random_tokens(1, 5), jnp.arange(5)[None])
  assert logits_btv.dtype == jnp.bfloat16 and hidden_btd.dtype == jnp.bfloat16
  assert all(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_bad_inputs_raise_clear_errors(micro_model, micro_cfg):
  with pytest.raises(ValueError, match="positions_bt"):
    micro_model(jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 3), jnp.int32))
  with pytest.raises(ValueError, match="attn_mask_bt is not used with a KV cache"):
    micro_model(jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32),
                cache=KVCache.init(micro_cfg, 1, 8), attn_mask_bt=jnp.ones((1, 4)))
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    micro_cfg.replace(num_kv_heads=3)
  with pytest.raises(ValueError, match="Unknown Llama preset"):
    LlamaConfig.preset("llama9")


@pytest.mark.parametrize("name,params_b", [("llama3.2-1b", 1.236), ("llama3.2-3b", 3.213), ("llama3.1-8b", 8.030),
                                            ("smollm2-135m", 0.1345)])
def test_presets_have_published_parameter_counts(name, params_b):
  cfg = LlamaConfig.preset(name)
  abstract = nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0)))
  count = sum(x.size for x in jax.tree.leaves(nnx.state(abstract)))
  assert count / 1e9 == pytest.approx(params_b, abs=0.001)


def test_hf_dict_round_trip():
  cfg = LlamaConfig.preset("llama3.2-3b")
  assert LlamaConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


@pytest.mark.parametrize("with_padding", [False, True])
def test_query_blocked_xla_attention_equals_plain_softmax_attention(micro_cfg, with_padding):
  """Sequences longer than XLA_QUERY_BLOCK (here 2.3 blocks) against einsum + softmax over
  every key at or before the query (and not padding)."""
  from spa_jax.models.llama import XLA_QUERY_BLOCK, causal_attention
  b, t, n, h = 2, int(2.3 * XLA_QUERY_BLOCK), 2, 8
  q, k, v = (jax.random.normal(jax.random.key(i), (b, t, n, h)) for i in range(3))
  keys_bt = jnp.arange(t)[None] >= jnp.array([[0], [37]]) if with_padding else None  # row 1: 37 left pads
  allowed_bts = jnp.tril(jnp.ones((t, t), bool))[None]
  if with_padding:
    allowed_bts = allowed_bts & keys_bt[:, None, :]
  scores_bnts = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(h)
  scores_bnts = jnp.where(allowed_bts[:, None], scores_bnts, -jnp.inf)
  expected = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores_bnts, axis=-1), v)
  got = causal_attention(q, k, v, keys_bt, micro_cfg.replace(attention_impl="xla"))
  rows = slice(None) if not with_padding else (1, slice(37, None))  # fully masked pad queries: any value
  np.testing.assert_allclose(got[rows], expected[rows], atol=2e-5)
  if with_padding:
    np.testing.assert_allclose(got[0], expected[0], atol=2e-5)


def _loss_and_grads(model, tokens_bt, positions_bt, mask_bt):
  graphdef, state = nnx.split(model)

  def loss(state):
    logits_btv, _, _ = nnx.merge(graphdef, state)(tokens_bt, positions_bt, attn_mask_bt=mask_bt)
    return jnp.mean(jax.nn.logsumexp(logits_btv.astype(jnp.float32), axis=-1)), logits_btv

  (value, logits_btv), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
  return value, logits_btv, grads, jax.make_jaxpr(loss)(state)


@pytest.mark.parametrize("remat_policy", ["none", "full", "dots"])
@pytest.mark.parametrize("masked", [False, True])
def test_scanned_layers_equal_unrolled_values_and_grads(micro_cfg, remat_policy, masked):
  cfg = micro_cfg.replace(num_layers=3, remat_policy=remat_policy)
  tokens_bt = _random_tokens(2, 9, seed=5)
  positions_bt = jnp.broadcast_to(jnp.arange(9), (2, 9))
  mask_bt = (jnp.arange(9)[None] >= jnp.array([[0], [3]])) if masked else None
  results = []
  for scan in (False, True):
    model = _make(cfg.replace(scan_layers=scan))
    apply_lora(model, 2, 4.0, ("q_proj", "v_proj"), rngs=nnx.Rngs(1))
    for _, adapter in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):  # B = 0: give LoRA a say
      adapter.set_value(adapter.get_value() + 0.05)
    results.append(_loss_and_grads(model, tokens_bt, positions_bt, mask_bt))
  (value, logits_btv, grads, jaxpr), (scan_value, scan_logits_btv, scan_grads, scan_jaxpr) = results
  assert "length=3" in str(scan_jaxpr) and "length=3" not in str(jaxpr)  # one scan over the 3 layers
  np.testing.assert_allclose(scan_logits_btv, logits_btv, atol=1e-5)
  np.testing.assert_allclose(scan_value, value, rtol=1e-6)
  flat, scan_flat = nnx.to_flat_state(grads), nnx.to_flat_state(scan_grads)
  assert [path for path, _ in flat] == [path for path, _ in scan_flat]
  for (path, g), (_, sg) in zip(flat, scan_flat):
    assert sg.get_value().shape == g.get_value().shape, path  # per-layer layout kept
    np.testing.assert_allclose(sg.get_value(), g.get_value(), atol=1e-6, err_msg=str(path))


def test_scanned_layers_refuse_layers_of_different_structure(micro_cfg):
  model = _make(micro_cfg.replace(scan_layers=True))
  apply_lora(model.layers[0], 2, 4.0, ("q_proj",), rngs=nnx.Rngs(1))  # LoRA on the first layer only
  with pytest.raises(ValueError, match="scan_layers=False"):
    model(_random_tokens(1, 4), jnp.arange(4)[None])
