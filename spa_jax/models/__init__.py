"""Llama model family: config, Flax NNX model, KV cache, LoRA, scalar heads, HF I/O."""

from spa_jax.models.config import LlamaConfig, RopeScaling
from spa_jax.models.kv_cache import KVCache
from spa_jax.models.llama import Llama

__all__ = ["KVCache", "Llama", "LlamaConfig", "RopeScaling"]
