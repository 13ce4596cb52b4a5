"""Helpers shared by the stages: catalogue/env settings, tokenizer, model, policies, sampler, rollouts.

Helpers (stage authors, E included: add yours below and list them here):
  load_catalogue(cfg), env_kwargs(cfg), env_settings(cfg, split), split_tasks(cfg, split, max_tasks)
  load_tokenizer(cfg, ws)                 SentencePiece trained on first use into <ws>/tokenizer/, or the HF one
                                          (checked against agent.max_context: check_agent_context)
  model_config(cfg, tokenizer)            LlamaConfig: preset + model.arch (+ the tokenizer's vocab) or HF config.json
  make_mesh(cfg)                          the (data, fsdp, tensor) mesh of config.mesh
  init_policy(cfg, tokenizer, mesh)       (LlamaConfig, Llama): HF weights (model.hf_path) or random init (seed)
  policy_dir(ws, name) / save_policy(ws, name, model, model_cfg) / load_policy(cfg, ws, name, tokenizer, mesh)
                                          policies are HF directories <ws>/policies/<name>/ (LoRA merged);
                                          names: "untrained", "sft", "ppo_<mode>" (configuration.policy_names)
  open_pool(cfg)                          webshop.EnvPool with cfg.env.num_envs envs
  make_sampler(cfg, model_cfg, graphdef, tokenizer, mesh)   one Sampler row per env; reuse across policies
  rollout(cfg, ws, policy=, sampler=, params=, tasks=, ...)  batched episodes -> trajectories/<name>.p<k>.jsonl
  stage_config_hash(cfg, stage)           hash of the config sections a stage reads and of the files they name
                                          (checkpoint resume guard)
"""

import contextlib
import functools
import json
import logging
import pathlib
import re

import jax
import ml_collections
from flax import nnx

from spa_jax import distributed, pipeline
from spa_jax.configuration import UNTRAINED
from spa_jax.digests import DigestCache
from spa_jax.models import Llama, LlamaConfig, load_hf, save_hf
from spa_jax.models.tokenizer import HFTokenizer, SentencePieceTokenizer, Tokenizer
from spa_jax.rollout import agent_format as af
from spa_jax.rollout import episodes
from spa_jax.rollout.generate import Sampler
from spa_jax.rollout.trajectory_store import TrajectoryWriter
from spa_jax.sharding import create_sharded
from spa_jax.sharding import make_mesh as _make_mesh
from spa_jax.training.checkpoint import config_hash
from spa_jax.workspace import Workspace

POLICIES_DIR = "policies"
TOKENIZER_DIR = "tokenizer"
ROLLOUT_LENGTH_BUCKETS = (64, 128, 256, 512)


# ----------------------------------------------------------------------------- environment


@functools.cache
def _catalogue(source: str, goals: str, search_backend: str):
  from webshop import Catalogue
  backend = {"search_backend": search_backend} if search_backend else {}
  if source == "embedded":
    return Catalogue.embedded_default(**backend)
  return Catalogue.from_dir(source, goals, **backend)


def load_catalogue(cfg: ml_collections.ConfigDict):
  """The config's webshop.Catalogue (built once per process)."""
  return _catalogue(*_source_and_goals(cfg), cfg.env.search_backend)


def _source_and_goals(cfg) -> tuple[str, str]:
  if cfg.env.catalogue == "embedded":
    return "embedded", "synthetic"
  return str(pathlib.Path(cfg.env.data_dir).expanduser().resolve()), cfg.env.goals


def env_kwargs(cfg: ml_collections.ConfigDict) -> dict:
  """WebShopEnv keyword arguments from config.env."""
  return dict(observation_mode=cfg.env.observation_mode, max_steps=cfg.env.max_steps)


def env_settings(cfg: ml_collections.ConfigDict, split: str) -> dict:
  """What the env ran with, recorded in trajectories and reports."""
  catalogue = load_catalogue(cfg)
  return {"catalogue": cfg.env.catalogue, "data_dir": cfg.env.data_dir, "goals": catalogue.goal_kind,
          "split": split, "observation_mode": cfg.env.observation_mode, "max_steps": cfg.env.max_steps,
          "noun_tagger": catalogue.noun_tagger,
          "search_backend": getattr(catalogue, "search_backend", cfg.env.search_backend or "pyserini"),
          "seed": cfg.seed}


def split_tasks(cfg: ml_collections.ConfigDict, split: str, max_tasks: int | None) -> list[int]:
  """The first `max_tasks` goal indices of a split (all when None)."""
  tasks = load_catalogue(cfg).split(split)
  return tasks if max_tasks is None else tasks[:max_tasks]


def open_pool(cfg: ml_collections.ConfigDict, num_envs: int | None = None):
  """An EnvPool of `num_envs` (default config.env.num_envs) envs over this process's catalogue (the
  one every stage reads); use it as a context manager."""
  from webshop import EnvPool
  num_envs = num_envs or cfg.env.num_envs
  return EnvPool(load_catalogue(cfg), num_envs=num_envs, num_workers=max(1, min(cfg.env.pool_workers, num_envs)),
                 seed=cfg.seed, **env_kwargs(cfg))


# ----------------------------------------------------------------------------- tokenizer and model


def tokenizer_corpus(catalogue) -> list[str]:
  """Texts the SentencePiece tokenizer is trained on: products, instructions and the agent prompt."""
  products = [f"{p.title}\n{p.description}\n" + "\n".join(p.bullet_points) + "\n" +
              " ".join(v for values in p.options.values() for v in values) for p in catalogue.products]
  goals = [goal["instruction_text"] for goal in catalogue.goals]
  prompt = [m["content"] for m in af.prompt_messages(one_shot=True)]
  return products + goals + prompt + [af.INVALID_FORMAT_MESSAGE, af.ELIDED_OBSERVATION]


def load_tokenizer(cfg: ml_collections.ConfigDict, ws: Workspace) -> Tokenizer:
  """HF tokenizer (tokenizer.path or model.hf_path), or SentencePiece: tokenizer.path if set, else
  trained on the catalogue's texts at first use and kept in <ws>/tokenizer/ (process 0 trains it).
  Raises ValueError when agent.max_context cannot hold an episode's first turn."""
  tokenizer = _tokenizer(cfg, ws)
  check_agent_context(cfg, tokenizer)
  return tokenizer


def check_agent_context(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer) -> None:
  """A ValueError naming agent.max_context when the prompt and a first observation fill it (every episode
  would end before its first step)."""
  from webshop import WebShopEnv
  observation, _ = WebShopEnv(load_catalogue(cfg), **env_kwargs(cfg)).reset(0)
  ids, _ = tokenizer.encode_chat(list(af.start_conversation(observation, cfg.agent.one_shot).messages),
                                 add_generation_prompt=True)
  if len(ids) >= cfg.agent.max_context:
    raise ValueError(f"config.agent.max_context={cfg.agent.max_context} cannot hold an episode's first turn "
                     f"({len(ids)} tokens of prompt and observation): pass --config.agent.max_context="
                     f"{len(ids) + 1024} or more")


def _tokenizer(cfg: ml_collections.ConfigDict, ws: Workspace) -> Tokenizer:
  if cfg.tokenizer.kind == "hf":
    return HFTokenizer(cfg.tokenizer.path or cfg.model.hf_path)
  if cfg.tokenizer.path:
    return SentencePieceTokenizer(cfg.tokenizer.path)
  def train() -> SentencePieceTokenizer:
    catalogue = load_catalogue(cfg)
    product_ids = [p.asin for p in catalogue.products] if cfg.tokenizer.atomic_product_ids else []
    try:
      return SentencePieceTokenizer.train_or_load(tokenizer_corpus(catalogue), ws.root / TOKENIZER_DIR,
                                                  cfg.tokenizer.vocab_size, atomic_symbols=product_ids)
    except RuntimeError as error:
      shortfall = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(error))
      if not shortfall:
        raise
      need = cfg.tokenizer.vocab_size + int(shortfall[2]) - int(shortfall[1])
      raise ValueError(f"config.tokenizer.vocab_size={cfg.tokenizer.vocab_size} is too small for the characters of "
                       f"this catalogue's texts: pass --config.tokenizer.vocab_size={need} or more") from None

  if distributed.is_main_process():
    tokenizer = train()
  distributed.barrier("tokenizer")
  return tokenizer if distributed.is_main_process() else train()


def model_config(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer) -> LlamaConfig:
  """model.hf_path's config.json, or the preset with config.model.arch overrides (a tokenizer
  trained on first use sets vocab_size); run settings from `run_settings`."""
  if cfg.model.hf_path:
    hf_config = json.loads((pathlib.Path(cfg.model.hf_path).expanduser() / "config.json").read_text())
    return LlamaConfig.from_hf_dict(hf_config, **run_settings(cfg))
  overrides = {name: value for name, value in cfg.model.arch.items() if value is not None}
  if cfg.tokenizer.kind == "sentencepiece":
    overrides.setdefault("vocab_size", tokenizer.vocab_size)
  if overrides.get("vocab_size", tokenizer.vocab_size) < tokenizer.vocab_size:
    raise ValueError(f"config.model.arch.vocab_size={overrides['vocab_size']} is smaller than the tokenizer's "
                     f"{tokenizer.vocab_size} ids: raise it or leave it unset (None: the tokenizer's)")
  return LlamaConfig.preset(cfg.model.preset, bos_token_id=tokenizer.bos_id, eos_token_ids=(tokenizer.eos_id,),
                            **run_settings(cfg), **overrides)


def run_settings(cfg: ml_collections.ConfigDict, dtype: str = "") -> dict:
  """The LlamaConfig fields that config.model sets whatever a checkpoint's config.json says:
  parameter and compute dtypes (`dtype` overrides model.dtype), the remat policy, layer scanning and
  the decode attention."""
  return dict(dtype=dtype or cfg.model.dtype, param_dtype=cfg.model.param_dtype,
              remat_policy=cfg.model.remat_policy, scan_layers=cfg.model.scan_layers,
              decode_attention=cfg.model.decode_attention)


def make_mesh(cfg: ml_collections.ConfigDict) -> jax.sharding.Mesh:
  return _make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)


def init_policy(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer, mesh) -> tuple[LlamaConfig, Llama]:
  """The starting model: HF weights from model.hf_path, or a random init from config.seed."""
  if cfg.model.hf_path:
    return load_hf(cfg.model.hf_path, mesh=mesh, **run_settings(cfg))
  model_cfg = model_config(cfg, tokenizer)
  return model_cfg, create_sharded(lambda: Llama(model_cfg, rngs=nnx.Rngs(cfg.seed)), mesh)


def policy_dir(ws: Workspace, name: str) -> pathlib.Path:
  """<ws>/policies/<name>/: an HF Llama directory (config.json + safetensors)."""
  return ws.root / POLICIES_DIR / name


def save_policy(ws: Workspace, name: str, model: Llama, model_cfg: LlamaConfig) -> list[str]:
  """Writes the policy (LoRA merged; every process calls, process 0 writes); returns its files."""
  out = save_hf(model, model_cfg, policy_dir(ws, name))
  distributed.barrier(f"policy-{name}")
  return [str(path) for path in sorted(out.iterdir())]


def load_policy(cfg: ml_collections.ConfigDict, ws: Workspace, name: str, tokenizer: Tokenizer,
                mesh) -> tuple[LlamaConfig, Llama]:
  """Policy `name` from the workspace ("untrained": `init_policy`)."""
  if name == UNTRAINED:
    return init_policy(cfg, tokenizer, mesh)
  path = policy_dir(ws, name)
  if not (path / "config.json").exists():
    raise FileNotFoundError(f"No policy {name!r} in {path}: run the stage that trains it "
                            f"(e.g. --config.run.targets={name.split('_')[0]}).")
  return load_hf(path, mesh=mesh, **run_settings(cfg))


def stage_config_hash(cfg: ml_collections.ConfigDict, stage: str) -> str:
  """Hash of the config sections `stage` reads and of the content of the files they name: a checkpoint
  from another config or other data is not resumed."""
  return config_hash({"config": pipeline.stage_config(stage, cfg),
                      "files": pipeline.file_digests(stage, cfg, DigestCache())})


# ----------------------------------------------------------------------------- rollouts


def make_sampler(cfg: ml_collections.ConfigDict, model_cfg: LlamaConfig, graphdef, tokenizer: Tokenizer,
                 mesh, batch_size: int | None = None) -> Sampler:
  """A Sampler with one row per env of every process (config.env.num_envs each) and
  config.agent.max_context tokens per row.

  Reuse it for every policy of the same architecture: its jitted functions compile once."""
  rows = (batch_size or cfg.env.num_envs) * distributed.process_count()
  return Sampler(graphdef, model_cfg, tokenizer, batch_size=rows, max_len=cfg.agent.max_context,
                 length_buckets=ROLLOUT_LENGTH_BUCKETS, mesh=mesh)


def rollout(cfg: ml_collections.ConfigDict, ws: Workspace, *, policy: str, sampler: Sampler, params,
            tokenizer: Tokenizer, tasks: list[int], split: str, name: str, samples_per_task: int,
            temperature: float, top_p: float, max_new_tokens: int, seed: int, pool=None) -> dict:
  """Episodes of `policy` (its `params`) on this process's share of `tasks`, written to
  trajectories/<name>.p<k>.jsonl; returns the run_episodes summary of this process's episodes.
  With several processes each drives its own pool and block of the sampler's rows (in lockstep).

  `pool`: an open EnvPool to reuse (left open), else one is opened for the call.
  """
  if distributed.is_main_process():  # a rerun with fewer processes must not read stale shards
    for shard in ws.trajectory_shards(name):
      shard.unlink()
  distributed.barrier(f"rollout-{name}")
  local_tasks = distributed.process_share(tasks)
  if distributed.process_count() > 1:
    sampler = episodes.ProcessRowsSampler(sampler)  # this process's block of the global rows
  pool_context = contextlib.nullcontext(pool) if pool is not None else open_pool(cfg, sampler.batch_size)
  with TrajectoryWriter(ws, name) as write, pool_context as env_pool:
    summary = episodes.run_episodes(
        sampler, params, env_pool, tokenizer, local_tasks, samples_per_task=samples_per_task,
        temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
        rng=jax.random.key(seed), on_trajectory=write, one_shot=cfg.agent.one_shot,
        history_window=cfg.agent.history_window, policy=policy, env_settings=env_settings(cfg, split),
        show_progress=cfg.tracking.progress)
  logging.info("rollout %s of %s: %s", name, policy, summary)
  return summary
