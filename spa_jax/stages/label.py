"""Label stage: stepwise rewards r_t = alpha * c_t + beta * g_t (spa-rl.md §1, §7.1-7.4, §7.6).

c_t is the frozen progress estimator's own output at the end of action t (no leave-one-out
values, no (T - t - 1) factor, the "OK" turn is not a step); g_t is the environment's grounding
signal (`valid` of the step: a parsed action the env accepted). alpha = label.progress_coef,
beta = label.grounding_coef.

Out of sample: the estimator was fit on the train tasks of the exploration set (prm/split.json),
so this stage labels only the HELD-OUT tasks' trajectories, which it never saw. These labels feed
`ppo.mode = "offline"` (raise prm.holdout_fraction for more offline data); the default online PPO
labels its own fresh rollouts with the same functions (`label_sequences`).

Writes label/labels.jsonl: one line per step {trajectory, task_id, rollout, step, progress,
grounding, reward, final_reward, num_steps}, in (task_id, rollout, step) order.
"""

import json

import jax.numpy as jnp
import ml_collections
import numpy as np

from spa_jax import distributed
from spa_jax.rollout.trajectory_store import read_jsonl, read_trajectories
from spa_jax.stages import common, prm
from spa_jax.training.rewards import step_rewards
from spa_jax.workspace import Workspace

LABELS_FILE = "labels.jsonl"


def spa_rewards(sequence: prm.TrajectorySequence, progress_s: np.ndarray, *, alpha: float,
                beta: float, grounding_form: str = "bonus") -> np.ndarray:
  """r_t = alpha * c_t + beta * g_t ("penalty": beta * (g_t - 1)) for each step of one trajectory."""
  num_steps = sequence.num_steps
  rewards_bs = step_rewards("spa", progress_bs=jnp.asarray(progress_s, jnp.float32)[None],
                            grounding_bs=jnp.asarray(sequence.grounding, jnp.float32)[None],
                            step_mask_bs=jnp.ones((1, num_steps), jnp.float32),
                            final_reward_b=jnp.asarray([sequence.final_reward], jnp.float32),
                            alpha=alpha, beta=beta, grounding_form=grounding_form)
  return np.asarray(rewards_bs[0])


def label_sequences(sequences: list[prm.TrajectorySequence], progress: dict[str, np.ndarray], *,
                    alpha: float, beta: float, grounding_form: str = "bonus") -> list[dict]:
  """The flat per-step label rows of `sequences` given the estimator's c_t (`prm.estimate_progress`)."""
  rows = []
  for sequence in sequences:
    progress_s = progress[sequence.key]
    rewards_s = spa_rewards(sequence, progress_s, alpha=alpha, beta=beta, grounding_form=grounding_form)
    for step in range(sequence.num_steps):
      rows.append({"trajectory": sequence.key, "task_id": sequence.task_id, "rollout": sequence.rollout,
                   "step": step, "progress": float(progress_s[step]), "grounding": sequence.grounding[step],
                   "reward": float(rewards_s[step]), "final_reward": sequence.final_reward,
                   "num_steps": sequence.num_steps})
  return rows


def labels_path(ws: Workspace):
  return ws.stage_dir("label") / LABELS_FILE


def read_labels(ws: Workspace) -> dict[str, list[dict]]:
  """label/labels.jsonl grouped by trajectory key ("task_id:rollout"), steps in order."""
  path = labels_path(ws)
  if not path.exists():
    raise FileNotFoundError(f"No step labels at {path}: run the label stage first (--config.run.targets=label).")
  grouped: dict[str, list[dict]] = {}
  for row in read_jsonl(path):
    grouped.setdefault(row["trajectory"], []).append(row)
  return grouped


def read_progress(ws: Workspace) -> dict[str, np.ndarray]:
  """The labelled trajectories' estimator outputs c_t, float32 [num_steps] per trajectory key."""
  return {key: np.array([row["progress"] for row in rows], np.float32) for key, rows in read_labels(ws).items()}


def run(cfg: ml_collections.ConfigDict, ws: Workspace) -> dict:
  tokenizer = common.load_tokenizer(cfg, ws)
  mesh = common.make_mesh(cfg)
  heldout = set(prm.read_split(ws)["heldout"])
  records = [r for r in read_trajectories(ws, prm.EXPLORE) if r["task_id"] in heldout]
  sequences, dropped = prm.load_sequences(records, tokenizer, cfg.prm.max_len)
  estimator = prm.load_estimator(cfg, ws, mesh)
  progress = prm.estimate_progress(estimator, sequences, **prm.estimator_forward(cfg, tokenizer, mesh))
  rows = label_sequences(sequences, progress, alpha=cfg.label.progress_coef, beta=cfg.label.grounding_coef,
                         grounding_form=cfg.label.grounding_form)
  if distributed.is_main_process():
    with open(labels_path(ws), "w") as f:
      f.writelines(json.dumps(row) + "\n" for row in rows)
  distributed.barrier("label-written")
  fit = prm.fit_metrics(sequences, progress)
  rewards = [row["reward"] for row in rows]
  return {"trajectories": len(sequences), "steps": len(rows), "dropped": dropped,
          "mean_step_reward": float(np.mean(rewards)) if rewards else None,
          "grounded_steps": float(np.mean([row["grounding"] for row in rows])) if rows else None,
          "heldout_mse": fit["mse"], "outputs": [str(labels_path(ws))]}
