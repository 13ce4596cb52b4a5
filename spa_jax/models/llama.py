"""Llama decoder (Flax NNX): RMSNorm, half-split RoPE with Llama-3 scaling, GQA, SwiGLU.

Parameters carry logical axis names as `logical_axes` metadata (see `spa_jax.sharding`).
Projection kernels are `[in, out]` matrices, i.e. the transpose of HF's `Linear.weight`.

Jitted callers avoid NNX dispatch overhead by splitting outside and merging inside:

    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, tokens_bt, positions_bt):
      model = nnx.merge(graphdef, state)
      logits_btv, hidden_btd, _ = model(tokens_bt, positions_bt)
      return logits_btv

Parameters are stored per layer (a list of `DecoderLayer`s); checkpoints use that layout. With
`cfg.scan_layers`, cache-free forwards (training, scoring) stack them on the fly and run the stack
as one `lax.scan`, so XLA compiles one layer body instead of `num_layers` copies; decoding with a
KV cache runs the layers one by one (per-layer cache buffers: see `kv_cache.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spa_jax.models.config import LlamaConfig
from spa_jax.models.decode_attention import ragged_cached_attention
from spa_jax.models.kv_cache import KVCache
from spa_jax.sharding import constrain, variable_logical_axes

_ACT_BTD = ("batch", "length", "act_embed")


class Linear(nnx.Module):
  """Bias-free `x @ kernel` with an optional LoRA adapter (set by `spa_jax.models.lora`)."""

  def __init__(
      self, in_features: int, out_features: int, logical_axes: tuple[str, str], cfg: LlamaConfig,
      *, rngs: nnx.Rngs, init_std: float = 0.02,
  ):
    init = jax.nn.initializers.normal(init_std)
    self.kernel = nnx.Param(
        init(rngs.params(), (in_features, out_features), cfg.param_jnp_dtype),
        logical_axes=logical_axes,
    )
    self.lora = nnx.data(None)  # a LoRAAdapter once `apply_lora` attaches one
    self.dtype = cfg.compute_jnp_dtype

  def __call__(self, x_bti: jax.Array) -> jax.Array:
    y_bto = x_bti @ self.kernel[...].astype(self.dtype)
    if self.lora is not None:
      y_bto = y_bto + self.lora(x_bti).astype(y_bto.dtype)
    return y_bto


class RMSNorm(nnx.Module):
  """Root-mean-square norm computed in float32 (as HF Llama)."""

  def __init__(self, dim: int, cfg: LlamaConfig):
    self.scale = nnx.Param(jnp.ones((dim,), cfg.param_jnp_dtype), logical_axes=("norm",))
    self.eps = cfg.rms_norm_eps
    self.dtype = cfg.compute_jnp_dtype

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    x32 = x_btd.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return normed.astype(self.dtype) * self.scale[...].astype(self.dtype)


def rope_inv_freq(cfg: LlamaConfig) -> np.ndarray:
  """Per-pair inverse frequencies [head_dim // 2], with Llama-3 scaling when configured."""
  exponents = np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim
  inv_freq = 1.0 / (cfg.rope_theta**exponents)
  s = cfg.rope_scaling
  if s is None:
    return inv_freq.astype(np.float32)
  low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
  high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
  wavelen = 2 * np.pi / inv_freq
  scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
  smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
      s.high_freq_factor - s.low_freq_factor
  )
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
  return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(positions_bt: jax.Array, cfg: LlamaConfig) -> tuple[jax.Array, jax.Array]:
  """Half-split RoPE tables cos_bth, sin_bth (float32) for the given positions."""
  freqs_bth2 = positions_bt.astype(jnp.float32)[..., None] * rope_inv_freq(cfg)
  angles_bth = jnp.concatenate([freqs_bth2, freqs_bth2], axis=-1)
  return jnp.cos(angles_bth), jnp.sin(angles_bth)


def apply_rope(x_btnh: jax.Array, cos_bth: jax.Array, sin_bth: jax.Array) -> jax.Array:
  """Rotate pairs (i, i + head_dim/2), HF's `rotate_half` layout."""
  half = x_btnh.shape[-1] // 2
  rotated = jnp.concatenate([-x_btnh[..., half:], x_btnh[..., :half]], axis=-1)
  cos = cos_bth[:, :, None, :].astype(x_btnh.dtype)
  sin = sin_bth[:, :, None, :].astype(x_btnh.dtype)
  return x_btnh * cos + rotated * sin


def _attention_impl(cfg: LlamaConfig, has_mask: bool) -> str:
  """"auto": cuDNN flash attention on GPU for bf16/fp16 without a padding mask, else XLA."""
  if cfg.attention_impl != "auto":
    return cfg.attention_impl
  fast_dtype = cfg.compute_jnp_dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  return "cudnn" if jax.default_backend() == "gpu" and fast_dtype and not has_mask else "xla"


# XLA attention materialises [t, s] scores: queries go in blocks of this many, each against the keys
# up to its own end only, which skips most of the masked upper triangle (same result, less work:
# bench/sft_step_bench.py).
XLA_QUERY_BLOCK = 512


def causal_attention(q_btnh, k_btkh, v_btkh, attn_mask_bt, cfg: LlamaConfig) -> jax.Array:
  """Causal GQA over one sequence chunk; `attn_mask_bt` (1 = real token) hides padding keys."""
  impl = _attention_impl(cfg, attn_mask_bt is not None)
  keys_b11s = None if attn_mask_bt is None else attn_mask_bt.astype(bool)[:, None, None, :]
  if impl == "cudnn":
    mask = None
    if keys_b11s is not None:  # cuDNN wants the mask's sequence dims in full
      b, t = attn_mask_bt.shape
      mask = jnp.broadcast_to(keys_b11s, (b, 1, t, t))
    return jax.nn.dot_product_attention(q_btnh, k_btkh, v_btkh, mask=mask, is_causal=True, implementation=impl)
  t = q_btnh.shape[1]
  out_blocks = []
  for start in range(0, t, XLA_QUERY_BLOCK):
    stop = min(t, start + XLA_QUERY_BLOCK)
    mask_11qs = (jnp.arange(stop)[None, :] <= jnp.arange(start, stop)[:, None])[None, None]
    mask = mask_11qs if keys_b11s is None else mask_11qs & keys_b11s[..., :stop]
    out_blocks.append(jax.nn.dot_product_attention(
        q_btnh[:, start:stop], k_btkh[:, :stop], v_btkh[:, :stop], mask=mask, implementation=impl))
  return jnp.concatenate(out_blocks, axis=1) if len(out_blocks) > 1 else out_blocks[0]


def cached_attention(q_btnh, keys_bksh, values_bksh, positions_bt) -> jax.Array:
  """GQA of each query over the cache slots at positions <= its own (slot index == position).

  Query head n reads kv head n // (heads per kv head). Both matmuls take the cache layer as
  stored ([batch, kv_heads, slots, head_dim], in its dtype); only the small query/output tensors
  are rearranged or cast. Logits and softmax are float32; returns [b, t, n, h] in the query dtype.
  """
  b, t, n, h = q_btnh.shape
  kv = keys_bksh.shape[1]
  q_bkgth = q_btnh.reshape(b, t, kv, n // kv, h).transpose(0, 2, 3, 1, 4).astype(keys_bksh.dtype)
  logits_bkgts = jnp.einsum(
      "bkgth,bksh->bkgts", q_bkgth, keys_bksh, preferred_element_type=jnp.float32
  ) * (h**-0.5)
  slots_s = jnp.arange(keys_bksh.shape[2])
  visible_bts = slots_s[None, None, :] <= positions_bt[:, :, None]
  logits_bkgts = jnp.where(visible_bts[:, None, None], logits_bkgts, jnp.finfo(jnp.float32).min)
  probs_bkgts = jax.nn.softmax(logits_bkgts, axis=-1).astype(values_bksh.dtype)
  out_bkgth = jnp.einsum(
      "bkgts,bksh->bkgth", probs_bkgts, values_bksh, preferred_element_type=jnp.float32
  )
  return out_bkgth.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h).astype(q_btnh.dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE, optionally reading/writing a KV cache."""

  def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.q_proj = Linear(d, n * h, ("embed", "heads"), cfg, rngs=rngs)
    self.k_proj = Linear(d, k * h, ("embed", "kv_heads"), cfg, rngs=rngs)
    self.v_proj = Linear(d, k * h, ("embed", "kv_heads"), cfg, rngs=rngs)
    self.o_proj = Linear(n * h, d, ("heads", "embed"), cfg, rngs=rngs)

  def __call__(
      self, x_btd, cos_bth, sin_bth, positions_bt, attn_mask_bt, cache: KVCache | None, layer: int
  ) -> tuple[jax.Array, KVCache | None]:
    cfg = self.cfg
    b, t, _ = x_btd.shape
    q_btnh = self.q_proj(x_btd).reshape(b, t, cfg.num_heads, cfg.head_dim)
    k_btkh = self.k_proj(x_btd).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    v_btkh = self.v_proj(x_btd).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    q_btnh = constrain(apply_rope(q_btnh, cos_bth, sin_bth), ("batch", "length", "act_heads", None))
    k_btkh = apply_rope(k_btkh, cos_bth, sin_bth)

    if cache is None:
      out_btnh = causal_attention(q_btnh, k_btkh, v_btkh, attn_mask_bt, cfg)
    else:
      cache = cache.write_layer(layer, positions_bt, k_btkh, v_btkh)
      if cfg.decode_attention == "ragged":  # the slots before the chunk (the write left them), then the chunk
        out_btnh = ragged_cached_attention(q_btnh, k_btkh, v_btkh, cache.k[layer], cache.v[layer], positions_bt[:, 0])
      else:
        out_btnh = cached_attention(q_btnh, cache.k[layer], cache.v[layer], positions_bt)
    out_btd = self.o_proj(out_btnh.reshape(b, t, cfg.num_heads * cfg.head_dim))
    return out_btd, cache


class MLP(nnx.Module):
  """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

  def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = Linear(d, f, ("embed", "mlp"), cfg, rngs=rngs)
    self.up_proj = Linear(d, f, ("embed", "mlp"), cfg, rngs=rngs)
    self.down_proj = Linear(f, d, ("mlp", "embed"), cfg, rngs=rngs)

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    h_btf = jax.nn.silu(self.gate_proj(x_btd)) * self.up_proj(x_btd)
    return self.down_proj(constrain(h_btf, ("batch", "length", "act_mlp")))


class DecoderLayer(nnx.Module):
  """Pre-norm attention block followed by a pre-norm MLP block."""

  def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
    self.input_layernorm = RMSNorm(cfg.hidden_size, cfg)
    self.self_attn = Attention(cfg, rngs=rngs)
    self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_btd, cos_bth, sin_bth, positions_bt, attn_mask_bt, cache, layer):
    attn_btd, cache = self.self_attn(
        self.input_layernorm(x_btd), cos_bth, sin_bth, positions_bt, attn_mask_bt, cache, layer
    )
    x_btd = x_btd + attn_btd
    x_btd = x_btd + self.mlp(self.post_attention_layernorm(x_btd))
    return constrain(x_btd, _ACT_BTD), cache


def _layer_fn(graphdef: nnx.GraphDef, cfg: LlamaConfig, *, in_scan: bool):
  """A pure `(layer_state, x_btd, cos_bth, sin_bth, positions_bt, attn_mask_bt) -> x_btd` for the
  cache-free forward, rematerialised per `cfg.remat_policy`. Pure (the layer is merged inside) so
  that `jax.checkpoint` sees every variable as an input: `nnx.remat` on a module whose frozen base
  and trained LoRA live at different trace levels fails when only the adapters are differentiated."""
  def apply(layer_state, x_btd, cos_bth, sin_bth, positions_bt, attn_mask_bt):
    out_btd, _ = nnx.merge(graphdef, layer_state)(x_btd, cos_bth, sin_bth, positions_bt, attn_mask_bt, None, 0)
    return out_btd

  if cfg.remat_policy == "none":
    return apply
  return jax.checkpoint(apply, policy=cfg.remat_jax_policy(), prevent_cse=not in_scan)  # CSE is safe in a scan


def _stack_layer_states(layers) -> tuple[nnx.GraphDef, nnx.State]:
  """The layers' common graph and their variables stacked along a leading "layers" axis."""
  graphdefs, states = zip(*(nnx.split(layer) for layer in layers), strict=True)
  if any(g != graphdefs[0] for g in graphdefs[1:]):
    raise ValueError("model.scan_layers needs layers of one structure (e.g. LoRA on every layer or "
                     "on none); set model.scan_layers=False for this model")

  def stack(*variables):
    value = jnp.stack([v.get_value() for v in variables])
    return variables[0].replace(constrain(value, ("layers",) + variable_logical_axes(variables[0])))

  return graphdefs[0], jax.tree.map(stack, *states, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _cache_free_layers(layers, x_btd, cos_bth, sin_bth, positions_bt, attn_mask_bt, cfg: LlamaConfig):
  """The layer stack without a KV cache: one layer at a time, or with `cfg.scan_layers` one
  `lax.scan` over the layers' variables stacked here, so that XLA traces and compiles one layer
  body whatever the depth. The stacked copy lives through the backward pass (with trained layer
  parameters, so does a stacked copy of their gradients). Parameters keep their per-layer layout
  either way (checkpoints, LoRA and the sharding rules do not change)."""
  if not cfg.scan_layers:
    for layer in layers:
      graphdef, layer_state = nnx.split(layer)
      x_btd = _layer_fn(graphdef, cfg, in_scan=False)(layer_state, x_btd, cos_bth, sin_bth, positions_bt,
                                                        attn_mask_bt)
    return x_btd
  graphdef, stacked = _stack_layer_states(layers)
  apply = _layer_fn(graphdef, cfg, in_scan=True)

  def body(carry_btd, layer_state):
    return apply(layer_state, carry_btd, cos_bth, sin_bth, positions_bt, attn_mask_bt), None

  out_btd, _ = jax.lax.scan(body, x_btd, stacked)
  return out_btd


class Llama(nnx.Module):
  """Llama causal language model.

  `model(tokens_bt, positions_bt, *, cache=None, attn_mask_bt=None)` returns
  `(logits_btv, hidden_btd, new_cache)`; `hidden_btd` is the final-normed hidden state and
  `logits_btv = model.logits_from_hidden(hidden_btd)` (in the compute dtype).

  Without a cache: causal attention over the given tokens; `attn_mask_bt` (1 = real token)
  hides padding keys. Right-padded rows need no mask (causality already hides trailing padding
  from real tokens) and keep the fast cuDNN path on GPU; left-padded rows need it. With a cache: the new K/V are written at each row's `positions_bt` and each
  query sees cache slots with position <= its own (see `kv_cache.py` for the invariant).
  """

  def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = nnx.Param(
        jax.nn.initializers.normal(0.02)(
            rngs.params(), (cfg.vocab_size, cfg.hidden_size), cfg.param_jnp_dtype
        ),
        logical_axes=("vocab", "embed"),
    )
    self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.norm = RMSNorm(cfg.hidden_size, cfg)
    self.lm_head = (
        None if cfg.tie_embeddings
        else Linear(cfg.hidden_size, cfg.vocab_size, ("embed", "vocab"), cfg, rngs=rngs)
    )

  def embed_tokens(self, tokens_bt: jax.Array) -> jax.Array:
    table_vd = constrain(self.embed[...], ("vocab", None))  # FSDP: gather the embed dim first
    x_btd = jnp.take(table_vd, tokens_bt, axis=0).astype(self.cfg.compute_jnp_dtype)
    return constrain(x_btd, _ACT_BTD)

  def logits_from_hidden(self, hidden_btd: jax.Array) -> jax.Array:
    """Vocabulary logits for (any leading shape of) final hidden states, in compute dtype."""
    if self.lm_head is not None:
      return self.lm_head(hidden_btd)
    return hidden_btd @ self.embed[...].astype(hidden_btd.dtype).T

  def __call__(
      self,
      tokens_bt: jax.Array,
      positions_bt: jax.Array,
      *,
      cache: KVCache | None = None,
      attn_mask_bt: jax.Array | None = None,
      compute_logits: bool = True,
  ) -> tuple[jax.Array | None, jax.Array, KVCache | None]:
    if tokens_bt.ndim != 2 or positions_bt.shape != tokens_bt.shape:
      raise ValueError(
          f"tokens_bt {tokens_bt.shape} and positions_bt {positions_bt.shape} must both be [batch, time]."
      )
    if cache is not None and attn_mask_bt is not None:
      raise ValueError(
          "attn_mask_bt is not used with a KV cache: visibility comes from positions_bt "
          "(pad only at the right end of each row, or give padding positions >= cache.max_len)."
      )
    cos_bth, sin_bth = rope_cos_sin(positions_bt, self.cfg)
    x_btd = self.embed_tokens(tokens_bt)
    if cache is None:
      x_btd = _cache_free_layers(self.layers, x_btd, cos_bth, sin_bth, positions_bt, attn_mask_bt, self.cfg)
    else:
      for i, layer in enumerate(self.layers):
        x_btd, cache = layer(x_btd, cos_bth, sin_bth, positions_bt, None, cache, i)
    hidden_btd = self.norm(x_btd)
    logits_btv = self.logits_from_hidden(hidden_btd) if compute_logits else None
    return logits_btv, hidden_btd, cache
