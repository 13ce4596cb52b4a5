"""Llama model family: config, Flax NNX model, KV cache, LoRA, scalar heads, HF I/O."""

from spa_jax.models.config import LlamaConfig, RopeScaling
from spa_jax.models.heads import ScalarHead, ValueModel
from spa_jax.models.hf_io import load_hf, save_hf
from spa_jax.models.kv_cache import KVCache
from spa_jax.models.llama import Llama
from spa_jax.models.lora import apply_lora, has_lora, merge_lora, trainable_filter

__all__ = [
    "KVCache", "Llama", "LlamaConfig", "RopeScaling", "ScalarHead", "ValueModel",
    "apply_lora", "has_lora", "load_hf", "merge_lora", "save_hf", "trainable_filter",
]
