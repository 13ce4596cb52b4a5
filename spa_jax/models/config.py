"""Llama architecture configuration: presets and conversion to/from HF `config.json`."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
ATTENTION_IMPLS = ("auto", "xla", "cudnn")
# attention over a KV cache (prefill chunks and decode steps): "dense" reads every cache slot (masked);
# "ragged" reads each row's filled slots only (spa_jax.models.decode_attention: a Pallas GPU kernel)
DECODE_ATTENTION_IMPLS = ("dense", "ragged")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama-3 ("llama3" type) RoPE frequency scaling."""

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Static Llama hyper-parameters (hashable: safe as a jit static argument)."""

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 500_000.0
  rope_scaling: RopeScaling | None = None
  rms_norm_eps: float = 1e-5
  tie_embeddings: bool = True
  max_position_embeddings: int = 4096
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  param_dtype: str = "float32"
  dtype: str = "float32"  # compute dtype
  remat_policy: str = "none"  # one of REMAT_POLICIES
  attention_impl: str = "auto"  # one of ATTENTION_IMPLS; "auto" = cuDNN on GPU for bf16/fp16
  decode_attention: str = "dense"  # one of DECODE_ATTENTION_IMPLS: forwards with a KV cache
  # cache-free forwards (training, scoring) run the layers as one lax.scan: one compiled layer body
  scan_layers: bool = True

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
          " (grouped-query attention); fix the config."
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE.")
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"remat_policy={self.remat_policy!r}; choose one of {REMAT_POLICIES}.")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"attention_impl={self.attention_impl!r}; choose one of {ATTENTION_IMPLS}.")
    if self.decode_attention not in DECODE_ATTENTION_IMPLS:
      raise ValueError(f"decode_attention={self.decode_attention!r}; choose one of {DECODE_ATTENTION_IMPLS}.")
    for name in ("param_dtype", "dtype"):
      jnp.dtype(getattr(self, name))  # raises TypeError naming a bad dtype
    if isinstance(self.rope_scaling, dict):
      object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
    object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))

  @property
  def param_jnp_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)

  @property
  def compute_jnp_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  def replace(self, **overrides) -> LlamaConfig:
    return dataclasses.replace(self, **overrides)

  @classmethod
  def preset(cls, name: str, **overrides) -> LlamaConfig:
    """Named architecture (see PRESETS), with optional field overrides."""
    if name not in PRESETS:
      raise ValueError(f"Unknown Llama preset {name!r}; available: {sorted(PRESETS)}.")
    return dataclasses.replace(PRESETS[name], **overrides)

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], **overrides) -> LlamaConfig:
    """Config from a HF Llama `config.json` dict."""
    if hf.get("model_type", "llama") != "llama":
      raise ValueError(f"Expected a Llama config.json (model_type 'llama'), got {hf.get('model_type')!r}.")
    scaling = hf.get("rope_scaling") or (hf.get("rope_parameters") or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ("default", "llama3"):
      raise ValueError(f"Unsupported rope scaling type {rope_type!r}; only 'llama3' or none.")
    rope_scaling = None
    if rope_type == "llama3":
      rope_scaling = RopeScaling(
          factor=float(scaling["factor"]),
          low_freq_factor=float(scaling["low_freq_factor"]),
          high_freq_factor=float(scaling["high_freq_factor"]),
          original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
      )
    rope_theta = hf.get("rope_theta", scaling.get("rope_theta", 10_000.0))
    eos = hf.get("eos_token_id")
    eos_ids = () if eos is None else (tuple(eos) if isinstance(eos, (list, tuple)) else (eos,))
    torch_dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
    num_heads = hf["num_attention_heads"]
    fields = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
        rope_theta=float(rope_theta),
        rope_scaling=rope_scaling,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=hf.get("max_position_embeddings", 4096),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids,
        param_dtype=torch_dtype,
        dtype=torch_dtype,
    )
    if hf.get("attention_bias") or hf.get("mlp_bias"):
      raise ValueError("Llama configs with attention_bias/mlp_bias are not supported.")
    fields.update(overrides)
    return cls(**fields)

  def to_hf_dict(self) -> dict[str, Any]:
    """A `config.json` dict that `transformers.LlamaConfig` loads."""
    eos: Any = None
    if self.eos_token_ids:
      eos = self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else list(self.eos_token_ids)
    hf: dict[str, Any] = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=self.vocab_size,
        hidden_size=self.hidden_size,
        intermediate_size=self.intermediate_size,
        num_hidden_layers=self.num_layers,
        num_attention_heads=self.num_heads,
        num_key_value_heads=self.num_kv_heads,
        head_dim=self.head_dim,
        hidden_act="silu",
        rope_theta=self.rope_theta,
        rope_scaling=None,
        rms_norm_eps=self.rms_norm_eps,
        tie_word_embeddings=self.tie_embeddings,
        max_position_embeddings=self.max_position_embeddings,
        bos_token_id=self.bos_token_id,
        eos_token_id=eos,
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        pretraining_tp=1,
        torch_dtype=self.param_dtype,
    )
    if self.rope_scaling is not None:
      hf["rope_scaling"] = dict(rope_type="llama3", **dataclasses.asdict(self.rope_scaling))
    return hf

  def remat_jax_policy(self):
    """The jax.checkpoint policy for `remat_policy` (None means save nothing)."""
    return {
        "full": None,
        "dots": jax.checkpoint_policies.dots_saveable,
        "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    }[self.remat_policy]


_LLAMA3_SCALING_32 = RopeScaling(32.0, 1.0, 4.0, 8192)
_LLAMA3_SCALING_8 = RopeScaling(8.0, 1.0, 4.0, 8192)
_LLAMA3_COMMON = dict(
    vocab_size=128_256,
    num_kv_heads=8,
    rope_theta=500_000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=131_072,
    bos_token_id=128_000,
    eos_token_ids=(128_001, 128_008, 128_009),
    param_dtype="bfloat16",
    dtype="bfloat16",
)

PRESETS: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=688,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        rope_theta=10_000.0,
        tie_embeddings=True,
        max_position_embeddings=4096,
    ),
    "llama3.2-1b": LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32, head_dim=64,
        rope_scaling=_LLAMA3_SCALING_32, tie_embeddings=True, **_LLAMA3_COMMON,
    ),
    "llama3.2-3b": LlamaConfig(
        hidden_size=3072, intermediate_size=8192, num_layers=28, num_heads=24, head_dim=128,
        rope_scaling=_LLAMA3_SCALING_32, tie_embeddings=True, **_LLAMA3_COMMON,
    ),
    "llama3.1-8b": LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, head_dim=128,
        rope_scaling=_LLAMA3_SCALING_8, tie_embeddings=False, **_LLAMA3_COMMON,
    ),
    # SmolLM2-135M(-Instruct)'s architecture (the configs' smollm2-135m preset loads its weights)
    "smollm2-135m": LlamaConfig(
        vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, rope_theta=100_000.0, tie_embeddings=True,
        max_position_embeddings=8192, bos_token_id=1, eos_token_ids=(2,), param_dtype="bfloat16",
        dtype="bfloat16",
    ),
}
