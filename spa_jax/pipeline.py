"""The stage graph: which stages a target needs, which are already done, and running the rest.

sft <- explore <- prm <- label <- ppo (ppo <- sft alone without SPA rewards, an estimator critic or
offline data);  eval <- the stages of the policies in eval.policies;
export <- the stage of export.policy ("sft" -> sft, "ppo_<mode>" -> ppo, "untrained" -> none).
A stage's fingerprint hashes the config sections it reads, the contents of the files those sections
name (`input_files`) and its dependencies' fingerprints, so changing an upstream setting or file redoes
everything downstream of it and nothing else. A stage is reused only while its recorded outputs keep
the content they were written with.
"""

import importlib
import logging
import pathlib
import time
from typing import Callable, Mapping

import ml_collections

from webshop.catalogue import raw_data_files

from spa_jax import distributed
from spa_jax.configuration import STAGES, eval_policies, policy_stage, split_names
from spa_jax.digests import DigestCache
from spa_jax.workspace import Workspace, fingerprint

StageFn = Callable[[ml_collections.ConfigDict, Workspace], dict]
# Sections every stage reads besides its own.
SHARED_SECTIONS = ("seed", "env", "model", "tokenizer", "agent")
_CHAIN = {"sft": (), "explore": ("sft",), "prm": ("explore",), "label": ("prm",), "ppo": ("label",)}


def dependencies(stage: str, cfg: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The stages whose outputs `stage` reads. PPO reads the estimator and labels only when a reward
  mode, the critic or offline data needs them; otherwise only the SFT policy."""
  if stage == "ppo" and not ppo_needs_estimator(cfg):
    return ("sft",)
  if stage in _CHAIN:
    return _CHAIN[stage]
  if stage == "eval":
    stages = [policy_stage(p) for p in eval_policies(cfg)]
    return tuple(dict.fromkeys(s for s in stages if s))
  if stage == "export":
    return tuple(s for s in [policy_stage(cfg.export.policy)] if s)
  raise ValueError(f"Unknown stage {stage!r}; stages are {STAGES}.")


def ppo_needs_estimator(cfg: ml_collections.ConfigDict) -> bool:
  """Whether the ppo stage reads prm/ or label/: SPA rewards, an estimator-initialised critic or
  offline PPO (on the labelled exploration trajectories)."""
  return ("spa" in split_names(cfg.ppo.reward_modes) or cfg.ppo.critic_init == "prm"
          or cfg.ppo.mode == "offline")


# Fields that bound how long a run goes on, only watch it (PPO's held-out evaluation) or only choose
# how the same function is computed (rematerialisation, the scanned layer stack, the decode attention's
# kernel), not what an iteration computes:
# changing them neither redoes a finished stage nor discards its checkpoints (a stage stopped by its
# budget goes on from its last checkpoint with run.force; PPO seeds sharing one GPU can turn
# rematerialisation on without redoing the SFT policy they start from).
NOT_FINGERPRINTED = {"ppo": ("time_budget_s", "eval_every", "eval_tasks"),
                     "model": ("remat_policy", "scan_layers", "decode_attention")}


def stage_config(stage: str, cfg: ml_collections.ConfigDict) -> dict:
  """The part of the config that determines a stage's outputs."""
  sections = {key: (cfg[key].to_dict() if isinstance(cfg[key], ml_collections.ConfigDict) else cfg[key])
              for key in (*SHARED_SECTIONS, stage)}
  for section, fields in NOT_FINGERPRINTED.items():
    if section in sections:
      sections[section] = {k: v for k, v in sections[section].items() if k not in fields}
  return sections


def input_files(stage: str, cfg: ml_collections.ConfigDict) -> dict[str, str]:
  """The files and directories outside the workspace that `stage` reads, by the config field naming them:
  the WebShop data files, `file:` splits, model.hf_path, tokenizer.path (every stage) and sft.data (sft)."""
  files = {}
  if cfg.env.catalogue == "dir":
    data = raw_data_files(pathlib.Path(cfg.env.data_dir).expanduser(), need_human=cfg.env.goals == "human")
    files |= {f"env.data_dir:{path.name}": str(path) for path in data.values()}
  for field in ("train_split", "eval_split"):
    if cfg.env[field].startswith("file:"):
      files[f"env.{field}"] = cfg.env[field].removeprefix("file:")
  for field, path in (("model.hf_path", cfg.model.hf_path), ("tokenizer.path", cfg.tokenizer.path)):
    if path:
      files[field] = path
  if stage == "sft" and cfg.sft.data != "expert":
    files["sft.data"] = cfg.sft.data
  return files


def file_digests(stage: str, cfg: ml_collections.ConfigDict, digests: DigestCache) -> dict[str, str]:
  """The content digest of each of the stage's `input_files`."""
  return {field: digests.digest(path) for field, path in input_files(stage, cfg).items()}


def fingerprints(cfg: ml_collections.ConfigDict, stages: list[str],
                 digests: DigestCache | None = None) -> dict[str, str]:
  """Fingerprint of each of `stages` and of everything they depend on."""
  digests = digests or DigestCache()
  result: dict[str, str] = {}

  def visit(stage: str) -> str:
    if stage not in result:
      inputs = {dep: visit(dep) for dep in dependencies(stage, cfg)}
      result[stage] = fingerprint({"config": stage_config(stage, cfg), "inputs": inputs,
                                   "files": file_digests(stage, cfg, digests)})
    return result[stage]

  for stage in stages:
    visit(stage)
  return result


def plan(cfg: ml_collections.ConfigDict, ws: Workspace, digests: DigestCache | None = None) -> list[str]:
  """Stages to run, dependencies first: those not current in `ws`, forced, or downstream of one."""
  digests = digests or DigestCache()
  prints = fingerprints(cfg, split_names(cfg.run.targets), digests)
  forced = set(split_names(cfg.run.force))
  order: list[str] = []
  decided: dict[str, bool] = {}

  def visit(stage: str) -> bool:
    if stage not in decided:
      deps_rerun = [visit(dep) for dep in dependencies(stage, cfg)]
      decided[stage] = (any(deps_rerun) or stage in forced
                        or not ws.is_current(stage, prints[stage], digests))
      if decided[stage]:
        order.append(stage)
    return decided[stage]

  for target in split_names(cfg.run.targets):
    visit(target)
  return order


def default_stage(stage: str) -> StageFn:
  """`spa_jax.stages.<stage>.run`."""
  module = f"spa_jax.stages.{stage}"
  try:
    return importlib.import_module(module).run
  except ModuleNotFoundError as error:
    if error.name != module:
      raise
    raise NotImplementedError(f"Stage {stage!r} has no implementation yet ({module} is missing).") from error


def run_pipeline(cfg: ml_collections.ConfigDict, ws: Workspace,
                 stage_fns: Mapping[str, StageFn] | None = None) -> dict[str, dict]:
  """Runs the planned stages in order; returns each run stage's summary.

  Every process runs every stage (stages share work across processes themselves);
  process 0 writes the configs and DONE records, and all processes meet at a barrier after each.
  """
  digests = DigestCache()
  todo = plan(cfg, ws, digests)
  prints = fingerprints(cfg, todo, digests)
  runs = {stage: stage_fns[stage] if stage_fns is not None else default_stage(stage) for stage in todo}
  logging.info("Workspace %s: stages to run %s", ws.root, todo or "none (all current)")
  summaries = {}
  for stage, run in runs.items():
    if distributed.is_main_process():
      digests.save()
      ws.clear_done(stage)
      ws.write_config(stage_config(stage, cfg), stage)
    distributed.barrier(f"start-{stage}")
    started = time.time()
    summary = dict(run(cfg, ws))
    summary.setdefault("seconds", round(time.time() - started, 3))
    if distributed.is_main_process():
      inputs = {dep: prints[dep] for dep in dependencies(stage, cfg)}
      ws.mark_done(stage, prints[stage], inputs, summary, digests, file_digests(stage, cfg, digests))
    distributed.barrier(f"done-{stage}")
    summaries[stage] = summary
    logging.info("Stage %s done: %s", stage, summary)
  if distributed.is_main_process():
    digests.save()
  return summaries
