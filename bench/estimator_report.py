"""What a workspace's progress estimator learned, and what each reward mode makes of it at PPO's first
update. Reads files only (no model is loaded, so it runs anywhere on a workspace copied off a GPU):

    .venv/bin/python bench/estimator_report.py --workdir runs/default
    .venv/bin/python bench/estimator_report.py --workdir /tmp/spa/upstream --no-results

Needs the workspace's exploration trajectories (trajectories/explore.p*.jsonl, with exact tokens),
prm/split.json and label/labels.jsonl (the label stage's c_t per step of the held-out trajectories).
Reports:
- the estimator's held-out fit (`prm.fit_metrics`: MSE, R^2 with its bootstrap interval over the
  held-out goals (`prm.r2_interval`), Pearson correlation of the sums with the final reward and with
  the number of steps), the held-out R^2 of the least-squares line through the
  numbers of steps and of ungrounded steps fit on the train trajectories (`prm.counting_baseline_r2`),
  and, over all exploration trajectories, the Pearson correlation of the number of ungrounded actions
  with the final reward and the mean reward per count;
- per reward mode and grounding form (`spa`, `grounding_only`: the paper's bonus; `spa_penalty`,
  `grounding_only_penalty`: the penalty form), the advantages of PPO's first update on the held-out
  trajectories: `ppo_targets`
  (GAE over steps, whitened over action tokens) with the critic at 0 and the policy equal to its
  reference (so KL 0), which is what the first iteration computes when its critic head starts at 0:
  mean advantage at each trajectory's first and last step, and the share of last steps below 0.
Appends the table to bench/RESULTS.md unless --no-results; prints one JSON line.
"""

import argparse
import json
import pathlib
import sys

import jax.numpy as jnp
import ml_collections
import numpy as np

from results_log import append_section
from spa_jax import configuration
from spa_jax.rollout.trajectory_store import read_trajectories
from spa_jax.stages import common, label, ppo, prm
from spa_jax.training import ppo_targets
from spa_jax.training.rewards import GROUNDING_FORMS, REWARD_MODES
from spa_jax.workspace import Workspace


def reward_variants(cfg: ml_collections.ConfigDict) -> dict[str, tuple[str, ml_collections.ConfigDict]]:
  """{name: (reward mode, config)} for each reward mode under each grounding form, named as spa_bench's
  arms: `spa` and `grounding_only` are the bonus form (the paper's), `spa_penalty` and
  `grounding_only_penalty` the penalty form; `sparse` has no grounding term."""
  variants = {}
  for mode in REWARD_MODES:
    for form in (GROUNDING_FORMS if mode != "sparse" else ("bonus",)):
      variant = cfg.copy_and_resolve_references()
      variant.label.grounding_form = form
      variants[mode if form == "bonus" else f"{mode}_{form}"] = (mode, variant)
  return variants


def first_update_advantages(cfg, sequences, progress) -> dict[str, dict[str, float]]:
  """Per reward variant (`reward_variants`): mean whitened advantage at the first and the last step, share
  of last steps < 0."""
  out = {}
  for name, (mode, variant) in reward_variants(cfg).items():
    batch = ppo.reward_batch(variant, mode, sequences, progress, pad_id=0, rows=len(sequences))
    rewards_bs = jnp.asarray(batch["task_rewards_bs"])
    zeros_bt = jnp.zeros(batch["tokens_bt"].shape, jnp.float32)
    targets = ppo_targets({key: jnp.asarray(value) for key, value in batch.items()}, old_logp_bt=zeros_bt,
                          ref_logp_bt=zeros_bt, old_values_bs=jnp.zeros_like(rewards_bs), task_rewards_bs=rewards_bs,
                          kl_coef=jnp.float32(0.0), gamma=cfg.ppo.gamma, lam=cfg.ppo.gae_lambda,
                          whiten_advantages=cfg.ppo.whiten_advantages)
    advantages_bt, step_id_bt = np.asarray(targets["advantages_bt"]), batch["step_id_bt"]
    per_step = [[advantages_bt[row][step_id_bt[row] == step][0] for step in range(s.num_steps)]
                for row, s in enumerate(sequences)]
    last = np.array([steps[-1] for steps in per_step])
    out[name] = {"first_step": float(np.mean([steps[0] for steps in per_step])), "last_step": float(last.mean()),
                 "last_step_negative_share": float(np.mean(last < 0))}
  return out


PROBE_KEYS = ("probe_l2", "probe_cv_r2", "probe_heldout_r2")  # the prm stage's summary, with head_init=probe


def report(ws: Workspace, cfg: ml_collections.ConfigDict, records: list[dict], tokenizer=None) -> dict:
  """The figures of the module doc from the exploration `records`; `tokenizer` re-encodes records
  without token ids (history elision)."""
  split = prm.read_split(ws)
  sequences = [prm.trajectory_sequence(r, tokenizer) for r in records if r["num_steps"]]
  heldout_ids = set(split["heldout"])
  train = [s for s in sequences if s.task_id not in heldout_ids]
  progress = label.read_progress(ws)
  heldout = [s for s in sequences if s.key in progress]
  ungrounded = np.array([s.num_steps - sum(s.grounding) for s in sequences])
  rewards = np.array([s.final_reward for s in sequences])
  prm_summary = (ws.done_record("prm") or {}).get("summary", {})
  return {"workdir": str(ws.root), "trajectories": len(sequences), "train": len(train), "heldout": len(heldout),
          "heldout_fit": prm.fit_metrics(heldout, progress),
          "heldout_r2_ci95": prm.r2_interval(heldout, progress, seed=cfg.seed),
          "heldout_baseline_r2": prm.counting_baseline_r2(train, heldout),
          "ungrounded_reward_pearson": float(np.corrcoef(ungrounded, rewards)[0, 1]),
          "reward_by_ungrounded": {int(k): [int((ungrounded == k).sum()), float(rewards[ungrounded == k].mean())]
                                   for k in np.unique(ungrounded)},
          "first_update": first_update_advantages(cfg, heldout, progress),
          "probe": {key: prm_summary.get(key) for key in PROBE_KEYS}}


def markdown(result: dict) -> str:
  fit = result["heldout_fit"]
  lines = [f"Workspace {result['workdir']}: {result['trajectories']} exploration trajectories "
           f"({result['train']} train, {result['heldout']} held-out with labels).", "",
           f"Estimator on the held-out ones: MSE {fit['mse']:.4f}, **R^2 {fit['r2']:.3f}** (95% bootstrap interval "
           f"over goals [{result['heldout_r2_ci95'][0]:.2f}, {result['heldout_r2_ci95'][1]:.2f}]), Pearson with the "
           f"final reward {fit['pearson']:.3f}, with the number of steps {fit['steps_pearson']:.3f}; mean sum "
           f"{fit['mean_predicted']:.3f} against mean reward {fit['mean_reward']:.3f}.",
           f"Line through the numbers of steps and of ungrounded steps (least squares on the train "
           f"trajectories): held-out **R^2 {result['heldout_baseline_r2']:.3f}**.",
           *([f"The estimator's head before fine-tuning (prm.head_init=probe, ridge penalty {probe['probe_l2']:g}): "
              f"cross-validated R^2 {probe['probe_cv_r2']:.3f} on the train trajectories, held-out R^2 "
              f"{probe['probe_heldout_r2']:.3f}."] if (probe := result["probe"])["probe_heldout_r2"] is not None else []),
           f"Number of ungrounded actions vs final reward, all exploration: Pearson "
           f"{result['ungrounded_reward_pearson']:.3f}; " + ", ".join(
               f"{k}: {n} trajectories, mean reward {r:.2f}" for k, (n, r) in result["reward_by_ungrounded"].items()),
           "", "PPO's first update on the held-out trajectories (critic at 0, KL 0; whitened over action tokens):", "",
           "| reward | mean advantage, first step | mean advantage, last step | last steps below 0 |",
           "|---|---|---|---|"]
  lines += [f"| {mode} | {a['first_step']:+.2f} | {a['last_step']:+.2f} | {100 * a['last_step_negative_share']:.0f}% |"
            for mode, a in result["first_update"].items()]
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="a workspace with exploration, prm and label done")
  parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
  args = parser.parse_args()
  workdir = pathlib.Path(args.workdir).expanduser().resolve()
  missing = [p for p in ("prm/split.json", "label/labels.jsonl") if not (workdir / p).exists()]
  if missing:
    raise SystemExit(f"{workdir}: no {', '.join(missing)}; run the pipeline to the label stage first "
                     f"(python -m spa_jax.main --workdir={workdir} --config.run.targets=label ...)")
  cfg = configuration.workspace_config(workdir)
  ws = Workspace(workdir)
  records = read_trajectories(ws, prm.EXPLORE)
  exact = all(r["tokens"] is not None for r in records)
  result = report(ws, cfg, records, None if exact else common.load_tokenizer(cfg, ws))
  table = markdown(result)
  print(table, file=sys.stderr)
  if not args.no_results:
    append_section("estimator_report", " ".join(["python bench/estimator_report.py", *sys.argv[1:]]), table)
  print(json.dumps(result))


if __name__ == "__main__":
  main()
