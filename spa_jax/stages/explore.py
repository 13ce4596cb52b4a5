"""Explore stage: K sampled episodes of the SFT policy per train task (spa-rl.md §2.2).

Writes trajectories/explore.p<k>.jsonl (with token log-probs; schema in WORKSPACE.md), one
metrics line (metrics/explore.jsonl) and, with explore.array_record, arrayrecord/explore/.
"""

import ml_collections
from flax import nnx

from spa_jax import distributed, tracking
from spa_jax.rollout import episodes
from spa_jax.rollout.trajectory_store import read_trajectories, write_array_record
from spa_jax.stages import common
from spa_jax.workspace import Workspace

POLICY = "sft"
TRAJECTORIES = "explore"


def run(cfg: ml_collections.ConfigDict, ws: Workspace) -> dict:
  tokenizer = common.load_tokenizer(cfg, ws)
  mesh = common.make_mesh(cfg)
  model_cfg, model = common.load_policy(cfg, ws, POLICY, tokenizer, mesh)
  graphdef, params = nnx.split(model)
  tasks = common.split_tasks(cfg, cfg.env.train_split, cfg.explore.max_tasks)
  local = common.rollout(
      cfg, ws, policy=POLICY, sampler=common.make_sampler(cfg, model_cfg, graphdef, tokenizer, mesh),
      params=params, tokenizer=tokenizer, tasks=tasks, split=cfg.env.train_split, name=TRAJECTORIES,
      samples_per_task=cfg.explore.samples_per_task, temperature=cfg.explore.temperature,
      top_p=cfg.explore.top_p, max_new_tokens=cfg.explore.max_new_tokens, seed=cfg.seed)
  distributed.barrier("explore-written")
  records = read_trajectories(ws, TRAJECTORIES)
  summary = episodes.summarize(records)
  outputs = [str(path) for path in ws.trajectory_shards(TRAJECTORIES)]
  if distributed.is_main_process():
    with tracking.MetricsWriter(ws, "explore", cfg.tracking.tensorboard) as writer:
      writer.write(0, {k: v for k, v in summary.items() if isinstance(v, (int, float))}
                   | {"episodes_per_s": local["episodes_per_s"], "tokens_per_s": local["tokens_per_s"]})
    if cfg.explore.array_record:
      outputs.append(str(write_array_record(ws.array_record_dir(TRAJECTORIES), "trajectory", records)))
  distributed.barrier("explore-done")
  return {**summary, "tasks": len(tasks), "outputs": outputs}
