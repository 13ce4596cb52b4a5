"""The stage graph: which stages a target needs, which are already done, and running the rest.

sft <- explore <- prm <- label <- ppo (ppo <- sft alone without SPA rewards, an estimator critic or
offline data);  eval <- the stages of the policies in eval.policies;
export <- the stage of export.policy ("sft" -> sft, "ppo_<mode>" -> ppo, "untrained" -> none).
A stage's fingerprint hashes the config sections it reads plus its dependencies' fingerprints,
so changing an upstream setting redoes everything downstream of it and nothing else.
"""

import importlib
import logging
import time
from typing import Callable, Mapping

import ml_collections

from spa_jax import distributed
from spa_jax.configuration import STAGES, policy_stage, split_names
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
    stages = [policy_stage(p) for p in split_names(cfg.eval.policies)]
    return tuple(dict.fromkeys(s for s in stages if s))
  if stage == "export":
    return tuple(s for s in [policy_stage(cfg.export.policy)] if s)
  raise ValueError(f"Unknown stage {stage!r}; stages are {STAGES}.")


def ppo_needs_estimator(cfg: ml_collections.ConfigDict) -> bool:
  """Whether the ppo stage reads prm/ or label/: SPA rewards, an estimator-initialised critic or
  offline PPO (on the labelled exploration trajectories)."""
  return ("spa" in split_names(cfg.ppo.reward_modes) or cfg.ppo.critic_init == "prm"
          or cfg.ppo.mode == "offline")


def stage_config(stage: str, cfg: ml_collections.ConfigDict) -> dict:
  """The part of the config that determines a stage's outputs."""
  return {key: (cfg[key].to_dict() if isinstance(cfg[key], ml_collections.ConfigDict) else cfg[key])
          for key in (*SHARED_SECTIONS, stage)}


def fingerprints(cfg: ml_collections.ConfigDict, stages: list[str]) -> dict[str, str]:
  """Fingerprint of each of `stages` and of everything they depend on."""
  result: dict[str, str] = {}

  def visit(stage: str) -> str:
    if stage not in result:
      inputs = {dep: visit(dep) for dep in dependencies(stage, cfg)}
      result[stage] = fingerprint({"config": stage_config(stage, cfg), "inputs": inputs})
    return result[stage]

  for stage in stages:
    visit(stage)
  return result


def plan(cfg: ml_collections.ConfigDict, ws: Workspace) -> list[str]:
  """Stages to run, dependencies first: those not current in `ws`, forced, or downstream of one."""
  prints = fingerprints(cfg, split_names(cfg.run.targets))
  forced = set(split_names(cfg.run.force))
  order: list[str] = []
  decided: dict[str, bool] = {}

  def visit(stage: str) -> bool:
    if stage not in decided:
      deps_rerun = [visit(dep) for dep in dependencies(stage, cfg)]
      decided[stage] = (any(deps_rerun) or stage in forced
                        or not ws.is_current(stage, prints[stage]))
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
  todo = plan(cfg, ws)
  prints = fingerprints(cfg, todo)
  runs = {stage: stage_fns[stage] if stage_fns is not None else default_stage(stage) for stage in todo}
  logging.info("Workspace %s: stages to run %s", ws.root, todo or "none (all current)")
  summaries = {}
  for stage, run in runs.items():
    if distributed.is_main_process():
      ws.clear_done(stage)
      ws.write_config(stage_config(stage, cfg), stage)
    distributed.barrier(f"start-{stage}")
    started = time.time()
    summary = dict(run(cfg, ws))
    summary.setdefault("seconds", round(time.time() - started, 3))
    if distributed.is_main_process():
      inputs = {dep: prints[dep] for dep in dependencies(stage, cfg)}
      ws.mark_done(stage, prints[stage], inputs, summary)
    distributed.barrier(f"done-{stage}")
    summaries[stage] = summary
    logging.info("Stage %s done: %s", stage, summary)
  return summaries
