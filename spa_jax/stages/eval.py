"""Eval stage: greedy episodes of every policy in eval.policies on the eval split (spa-rl.md §5).

Per policy: score (mean reward x 100), success rate (r == 1), purchase rate, grounding accuracy,
mean steps over the episodes that ran to their end ("episodes"); episodes lost to a failed env worker
(termination "env_failed") are counted apart ("failed") and left out of every mean: they say nothing
about the policy, and a 0 for them would lower its score. Writes trajectories/eval_<policy>.p<k>.jsonl, reports/eval.json (with the env
settings: catalogue, split, observation mode, noun tagger, search backend) and plots/eval.png.
"""

import logging

import ml_collections
from flax import nnx

from spa_jax import distributed, tracking
from spa_jax.configuration import eval_policies
from spa_jax.rollout import episodes
from spa_jax.rollout.trajectory_store import read_trajectories
from spa_jax.stages import common
from spa_jax.workspace import Workspace, write_json_atomic

TABLE_COLUMNS = (("score", "score"), ("success_rate", "SR %"), ("purchase_rate", "purchase %"),
                 ("grounding", "grounding %"), ("mean_steps", "steps"), ("episodes", "episodes"),
                 ("failed", "failed"))
COUNT_COLUMNS = ("episodes", "failed")
REPORT = "eval"
ENV_FAILED = "env_failed"


def policy_metrics(records: list[dict]) -> dict:
  """`episodes.summarize` of the episodes that ran to their end, plus "failed": those lost to a failed
  env worker, which no mean includes."""
  completed = [r for r in records if r["termination"] != ENV_FAILED]
  return {**episodes.summarize(completed), "failed": len(records) - len(completed)}


def format_table(policies: dict[str, dict], order: list[str] | None = None) -> str:
  """A fixed-width text table: one row per policy (in `order`), the TABLE_COLUMNS metrics."""
  policies = {p: policies[p] for p in order or policies}
  width = max([len("policy")] + [len(p) for p in policies])
  header = "policy".ljust(width) + "".join(f"{title:>13}" for _, title in TABLE_COLUMNS)
  rows = [policy.ljust(width) + "".join(
      f"{metrics.get(key, float('nan')):>13.1f}" if key not in COUNT_COLUMNS else f"{metrics.get(key, 0):>13d}"
      for key, _ in TABLE_COLUMNS) for policy, metrics in policies.items()]
  return "\n".join([header, "-" * len(header), *rows])


def evaluate(cfg: ml_collections.ConfigDict, ws: Workspace, *, policy: str, name: str, sampler, params,
             tokenizer, tasks: list[int], pool) -> dict:
  """Episodes of `params` on `tasks` of env.eval_split with the eval settings (eval.temperature,
  top_p, max_new_tokens, config.seed), written as trajectories/<name>; returns their `policy_metrics`.
  The eval stage and PPO's held-out curve (ppo.eval_every) both measure through this."""
  common.rollout(cfg, ws, policy=policy, sampler=sampler, params=params, tokenizer=tokenizer,
                 tasks=tasks, split=cfg.env.eval_split, name=name, samples_per_task=1,
                 temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                 max_new_tokens=cfg.eval.max_new_tokens, seed=cfg.seed, pool=pool)
  distributed.barrier(f"{name}-written")
  return policy_metrics(read_trajectories(ws, name))


def run(cfg: ml_collections.ConfigDict, ws: Workspace) -> dict:
  tokenizer = common.load_tokenizer(cfg, ws)
  mesh = common.make_mesh(cfg)
  tasks = common.split_tasks(cfg, cfg.env.eval_split, cfg.eval.max_tasks)
  results, sampler, outputs = {}, None, []
  with common.open_pool(cfg) as pool:
    for policy in eval_policies(cfg):
      model_cfg, model = common.load_policy(cfg, ws, policy, tokenizer, mesh)
      graphdef, params = nnx.split(model)
      if sampler is None or sampler.cfg != model_cfg:
        sampler = common.make_sampler(cfg, model_cfg, graphdef, tokenizer, mesh)
      name = f"eval_{policy}"
      results[policy] = evaluate(cfg, ws, policy=policy, name=name, sampler=sampler, params=params,
                                 tokenizer=tokenizer, tasks=tasks, pool=pool)
      outputs += [str(path) for path in ws.trajectory_shards(name)]
      logging.info("eval %s: %s", policy, results[policy])
  report = {"split": cfg.env.eval_split, "tasks": len(tasks), "temperature": cfg.eval.temperature,
            "env": common.env_settings(cfg, cfg.env.eval_split), "policies": results,
            "order": list(results)}
  if distributed.is_main_process():
    write_json_atomic(ws.report_path(REPORT), report)
    outputs.append(str(ws.report_path(REPORT)))
    if cfg.tracking.plots:
      tracking.plot_eval_bars(results, ws.plot_path(REPORT))
      outputs.append(str(ws.plot_path(REPORT)))
    logging.info("Evaluation on %s (%d tasks):\n%s", cfg.env.eval_split, len(tasks), format_table(results))
  return {**{f"{policy}_score": r.get("score") for policy, r in results.items()}, "outputs": outputs}
