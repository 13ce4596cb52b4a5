"""Does PPO optimise its reward? Online PPO from a workspace's SFT policy, one run per reward mode,
per-iteration train-rollout curves, a table, a plot and pass/fail against the learning goals.

    .venv/bin/python bench/ppo_learning_bench.py --workdir runs/default            # tiny default's SFT
    .venv/bin/python bench/ppo_learning_bench.py --workdir W --iterations 20 --set ppo.learning_rate=1e-4

Runs `python -m spa_jax.main --config=configs/ppo.py --config.run.targets=ppo` in the workspace
(its SFT policy is reused or trained first) with LEARNING (below; `--set` overrides it: the default
chain's PPO, LoRA on 12 rollouts for 2 iterations, is sized for its time budget, not for learning)
and `--modes` (default grounding_only,sparse: rewards
the tiny default can learn quickly; neither needs the progress estimator), then reads
metrics/ppo_<mode>.jsonl. Per iteration: train-rollout score, grounding %, purchase %, the mode's
task return, KL to the reference (nats per trajectory, with its standard error), clip fraction,
the update's approx KL (mean 0.5 (log r)^2 per token over its mini-batches) and the share of them that
moved the policy (below 1 after ppo.target_kl's early stop), value loss, the critic's explained variance
and the sampler/old-policy log-prob gap.

Goals (issue 14): grounding_only raises train grounding by >= 15 points over its iteration-1 level and
keeps it there (mean of the last 5 iterations, and their minimum above iteration 1 + 10); sparse
raises the train score (mean of the last 5 above the first 5's, and the least-squares slope of the
score over iterations above 0 with its 95% confidence interval: a trend beyond the goal-set noise);
the logged KL is >= 0 within its noise (every iteration above -2 standard errors) and grows as the
policy moves (last-5 mean above the first 5). Writes <workdir>/ppo_learning.{md,json,png}, copies
the plot to bench/plots/ and appends the table to bench/RESULTS.md.
"""

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from results_log import REPO, append_section  # noqa: E402
from spa_jax.tracking import read_metrics  # noqa: E402

CURVES = ("score", "grounding", "purchase_rate", "task_return", "kl", "clip_frac", "approx_kl", "policy_updated",
          "value_loss", "explained_variance", "sampler_logp_gap_max")
LAST = 5  # iterations averaged for "kept there"
# The setting in which grounding_only met its goal on 2 CPU cores (bench/RESULTS.md, 2026-12-03 21:01):
# full fine-tuning, the critic at half the policy's LR, rollout batches large enough to beat the
# goal-set noise between iterations.
LEARNING = ("ppo.finetune=full", "ppo.learning_rate=2e-4", "ppo.critic_learning_rate=1e-4",
            "ppo.rollouts_per_iteration=48", "ppo.mini_batch_size=8", "ppo.ppo_epochs=2")


def run_ppo(workdir: pathlib.Path, modes: str, iterations: int, overrides: list[str]) -> float:
  command = [sys.executable, "-m", "spa_jax.main", "--config=configs/ppo.py", f"--workdir={workdir}",
             "--config.run.targets=ppo", f"--config.ppo.reward_modes={modes}", "--config.eval.policies=sft",
             f"--config.ppo.iterations={iterations}", "--config.tracking.progress=False",
             *(f"--config.{item}" for item in overrides)]
  print(" ".join(command[1:]), file=sys.stderr, flush=True)
  started = time.time()
  subprocess.run(command, cwd=REPO, check=True)
  return time.time() - started


def curves(workdir: pathlib.Path, mode: str) -> dict[str, np.ndarray]:
  rows = read_metrics(workdir / "metrics" / f"ppo_{mode}.jsonl")
  return {name: np.array([row.get(name, np.nan) for row in rows], np.float64)
          for name in ("step", "kl_stderr", *CURVES)}


def score_trend(c: dict[str, np.ndarray]) -> tuple[float, float, float]:
  """Least-squares slope of the train score per iteration and its 95% CI (Student t, n - 2 dof)."""
  fit = stats.linregress(c["step"], c["score"])
  half = float(stats.t.ppf(0.975, c["step"].size - 2) * fit.stderr)
  return float(fit.slope), float(fit.slope) - half, float(fit.slope) + half


def goals(mode: str, c: dict[str, np.ndarray]) -> dict[str, bool]:
  first, last = 0, slice(-LAST, None)
  kl_ok = bool(np.all(c["kl"] >= -2 * np.nan_to_num(c["kl_stderr"]) - 1e-6))
  kl_grows = bool(np.mean(c["kl"][last]) > np.mean(c["kl"][:LAST]))
  result = {"kl_nonnegative_within_noise": kl_ok, "kl_grows": kl_grows}
  if mode == "grounding_only":
    result["grounding_up_15_and_kept"] = bool(np.mean(c["grounding"][last]) >= c["grounding"][first] + 15
                                              and np.min(c["grounding"][last]) >= c["grounding"][first] + 10)
  if mode == "sparse":
    _, slope_low, _ = score_trend(c)
    result["score_up"] = bool(np.mean(c["score"][last]) > np.mean(c["score"][:LAST]) and slope_low > 0)
  return result


def table(all_curves: dict[str, dict], all_goals: dict[str, dict]) -> str:
  lines = []
  for mode, c in all_curves.items():
    lines += [f"**{mode}** (train rollouts of each iteration)", "",
              "| it | score | grounding % | purchase % | task return | KL (± se) | clip frac | approx KL "
              "| policy updated | value loss | expl. var | sampler gap |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i in range(c["step"].size):
      lines.append(f"| {int(c['step'][i])} | {c['score'][i]:.1f} | {c['grounding'][i]:.1f} | "
                   f"{c['purchase_rate'][i]:.1f} | {c['task_return'][i]:.3f} | {c['kl'][i]:.2f} ± "
                   f"{c['kl_stderr'][i]:.2f} | {c['clip_frac'][i]:.3f} | {c['approx_kl'][i]:.4f} | "
                   f"{c['policy_updated'][i]:.2f} | {c['value_loss'][i]:.4f} | "
                   f"{c['explained_variance'][i]:.2f} | {c['sampler_logp_gap_max'][i]:.1e} |")
    slope, low, high = score_trend(c)
    lines += ["", f"Train score: first 5 iterations {np.mean(c['score'][:LAST]):.1f}, last 5 "
              f"{np.mean(c['score'][-LAST:]):.1f}; slope {slope:+.3f} per iteration, 95% CI [{low:+.3f}, {high:+.3f}]",
              "", f"Goals: {json.dumps(all_goals[mode])}", ""]
  return "\n".join(lines)


def plot(all_curves: dict[str, dict], out: pathlib.Path) -> None:
  names = ("grounding", "score", "purchase_rate", "task_return", "kl", "clip_frac", "value_loss",
           "explained_variance")
  fig, axes = plt.subplots(2, 4, figsize=(18, 7))
  for ax, name in zip(axes.flat, names):
    for mode, c in all_curves.items():
      ax.plot(c["step"], c[name], marker=".", label=mode)
      if name == "kl":
        ax.fill_between(c["step"], c["kl"] - 2 * c["kl_stderr"], c["kl"] + 2 * c["kl_stderr"], alpha=0.2)
    ax.set_title(name + (" (± 2 se)" if name == "kl" else ""), fontsize=10)
    ax.set_xlabel("PPO iteration")
    ax.grid(alpha=0.3)
  axes.flat[0].legend()
  fig.suptitle("Online PPO from the SFT policy: train-rollout curves per reward mode")
  fig.tight_layout()
  fig.savefig(out, dpi=90)
  plt.close(fig)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="workspace (its SFT policy is reused)")
  parser.add_argument("--modes", default="grounding_only,sparse")
  parser.add_argument("--iterations", type=int, default=20)
  parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="extra config override")
  parser.add_argument("--name", default="ppo_learning_cpu", help="plot name under bench/plots/")
  parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
  args = parser.parse_args()
  workdir = pathlib.Path(args.workdir).expanduser().resolve()
  seconds = run_ppo(workdir, args.modes, args.iterations, [*LEARNING, *args.set])
  modes = [m for m in args.modes.split(",") if m]
  all_curves = {mode: curves(workdir, mode) for mode in modes}
  all_goals = {mode: goals(mode, c) for mode, c in all_curves.items()}
  body = table(all_curves, all_goals) + f"\nPPO stage wall time: {seconds:.0f} s for {len(modes)} mode(s).\n"
  png = workdir / "ppo_learning.png"
  plot(all_curves, png)
  (workdir / "ppo_learning.md").write_text(body)
  (workdir / "ppo_learning.json").write_text(json.dumps(
      {"goals": all_goals, "curves": {m: {k: v.tolist() for k, v in c.items()} for m, c in all_curves.items()}}))
  print(body, file=sys.stderr)
  if not args.no_results:
    plots = REPO / "bench" / "plots"
    plots.mkdir(exist_ok=True)
    shutil.copyfile(png, plots / f"{args.name}.png")
    body += f"\nPlot: bench/plots/{args.name}.png\n"
    append_section("ppo_learning_bench", " ".join(["python bench/ppo_learning_bench.py", *sys.argv[1:]]), body)
  print(json.dumps({"goals": all_goals, "seconds": round(seconds, 1)}))


if __name__ == "__main__":
  main()
