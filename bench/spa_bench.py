"""The learning result: SFT vs sparse-reward PPO vs SPA over seeds, each seed a separate workspace.

    .venv/bin/python bench/spa_bench.py                       # the default command, seeds 0, 1, 2
    .venv/bin/python bench/spa_bench.py --seeds 0 --quick     # a smaller pipeline, one seed
    .venv/bin/python bench/spa_bench.py --set ppo.iterations=6 --set explore.max_tasks=32
    .venv/bin/python bench/spa_bench.py --set eval.policies=untrained,sft --set sft.batch_size=2  # SFT recipe
    XLA_PYTHON_CLIENT_PREALLOCATE=false python3 bench/spa_bench.py --jobs 3   # GPU: seeds side by side

Each seed runs `python -m spa_jax.main --config=configs/eval.py --config.seed=<k>` in
<root>/seed<k>/ (no stage is shared between seeds: SFT, exploration, the estimator and both PPO
runs all depend on the seed). A rerun reuses finished stages of the same config. Collected per
seed: the eval report (score = mean reward x 100, success rate, purchase rate, grounding
accuracy per policy) and the estimator's held-out MSE / Pearson correlation; reported as mean and
sample standard deviation over seeds. Writes <root>/spa_bench.md and .json, appends the table to
bench/RESULTS.md and ends with ONE JSON line on stdout.
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "RESULTS.md"
POLICIES = ("sft", "ppo_sparse", "ppo_spa")
METRICS = ("score", "success_rate", "purchase_rate", "grounding", "mean_steps")
ESTIMATOR = ("heldout_mse", "heldout_pearson", "train_mse", "train_pearson")
# --quick: the same chain, about a third of the work (fewer tasks, rollouts and PPO iterations).
QUICK = {"explore.max_tasks": 8, "ppo.iterations": 2, "ppo.rollouts_per_iteration": 8,
         "eval.max_tasks": 8, "eval.policies": ",".join(POLICIES)}


def run_seed(root: pathlib.Path, seed: int, overrides: dict[str, str]) -> dict:
  """Runs (or reuses) the default pipeline of one seed; returns its results and CPU/wall time."""
  workdir = root / f"seed{seed}"
  command = [sys.executable, "-m", "spa_jax.main", "--config=configs/eval.py", f"--workdir={workdir}",
             f"--config.seed={seed}", "--config.tracking.progress=False",
             *(f"--config.{path}={value}" for path, value in overrides.items())]
  started = time.time()
  print(f"seed {seed}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
  with open(root / f"seed{seed}.log", "w") as log:
    child = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own CPU time, also when seeds run at once
  if exit_code := os.waitstatus_to_exitcode(status):
    raise RuntimeError(f"seed {seed} failed (exit {exit_code}); see {root / f'seed{seed}.log'}")
  return {"seed": seed, "wall_s": round(time.time() - started, 1),
          "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), **collect(workdir)}


def collect(workdir: pathlib.Path) -> dict:
  """A finished workspace's eval scores per policy and the estimator's fit."""
  report = json.loads((workdir / "reports" / "eval.json").read_text())
  result = {"workspace": str(workdir), "eval_tasks": report["tasks"],
            "policies": {p: {m: report["policies"][p][m] for m in METRICS}
                         for p in report.get("order", report["policies"])}}
  sft = json.loads((workdir / "sft" / "DONE.json").read_text())["summary"]
  result["sft"] = {"steps": sft["steps"], "final_loss": sft["final_loss"], "seconds": sft["seconds"]}
  estimator_done = workdir / "prm" / "DONE.json"
  if estimator_done.exists():  # absent when eval.policies needs no PPO (e.g. an SFT recipe sweep)
    estimator = json.loads(estimator_done.read_text())["summary"]
    result["estimator"] = {key: estimator.get(key) for key in ESTIMATOR}
    result["progress_plot"] = str(workdir / "plots" / "prm_progress.png")
  return result


def mean_std(values: list) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for one value) of the non-missing values."""
  values = [v for v in values if v is not None]
  if not values:
    return float("nan"), float("nan")
  return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def aggregate(seeds: list[dict]) -> dict:
  policies = [p for p in seeds[0]["policies"] if all(p in s["policies"] for s in seeds)]
  summary = {"policies": {p: {m: mean_std([s["policies"][p][m] for s in seeds]) for m in METRICS} for p in policies}}
  if all("estimator" in s for s in seeds):
    summary["estimator"] = {k: mean_std([s["estimator"][k] for s in seeds]) for k in ESTIMATOR}
  return summary


def markdown(seeds: list[dict], summary: dict) -> str:
  n = len(seeds)
  lines = [f"Mean ± sample std over {n} seed(s) ({', '.join(str(s['seed']) for s in seeds)}); "
           f"{seeds[0]['eval_tasks']} eval tasks per seed, greedy.", "",
           "| policy | score | SR % | purchase % | grounding % | steps |", "|---|---|---|---|---|---|"]
  for policy, metrics in summary["policies"].items():
    cells = [f"{mean:.1f} ± {std:.1f}" for mean, std in (metrics[m] for m in METRICS)]
    lines.append(f"| {policy} | " + " | ".join(cells) + " |")
  lines += ["", "Per seed (score): " + "; ".join(
      f"seed {s['seed']}: " + ", ".join(f"{p} {v['score']:.1f}" for p, v in s["policies"].items()) for s in seeds)]
  if est := summary.get("estimator"):
    lines += ["", "Progress estimator (predicted sum of c_t vs final reward): "
              f"held-out MSE {est['heldout_mse'][0]:.4f} ± {est['heldout_mse'][1]:.4f}, "
              f"Pearson {est['heldout_pearson'][0]:.3f} ± {est['heldout_pearson'][1]:.3f}; "
              f"train MSE {est['train_mse'][0]:.4f}, Pearson {est['train_pearson'][0]:.3f}",
              "", "Per-step progress plots: " + ", ".join(s["progress_plot"] for s in seeds)]
  lines += ["", "SFT per seed: " + "; ".join(
      f"seed {s['seed']}: {s['sft']['steps']} steps in {s['sft']['seconds']:.0f} s, last loss {s['sft']['final_loss']:.3f}"
      for s in seeds)]
  lines += ["", "Time per seed: " + "; ".join(f"seed {s['seed']}: {s['wall_s']:.0f} s wall, {s['cpu_s']:.0f} s CPU"
                                             for s in seeds)]
  return "\n".join(lines)


def append_results(table: str, command: str) -> None:
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
  header = [f"\n## spa_bench ({datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')})", "",
            f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.1f} at the end",
            f"- command: `{command}`", f"- commit: {commit}", "", ""]
  with RESULTS.open("a") as f:
    f.write("\n".join(header) + table + "\n")


def parse_overrides(items: list[str]) -> dict[str, str]:
  overrides = {}
  for item in items:
    path, sep, value = item.partition("=")
    if not sep:
      raise SystemExit(f"--set {item!r}: use --set path=value, e.g. --set ppo.iterations=6")
    overrides[path] = value
  return overrides


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
  parser.add_argument("--quick", action="store_true", help=f"smaller pipeline: {QUICK}")
  parser.add_argument("--root", default=str(REPO / "runs" / "spa_bench"), help="workspaces go in <root>/seed<k>")
  parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="extra config override")
  parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
  parser.add_argument("--jobs", type=int, default=1,
                      help="seeds run at once (a many-core or GPU machine; on a GPU also set "
                           "XLA_PYTHON_CLIENT_PREALLOCATE=false so the processes share its memory)")
  args = parser.parse_args()
  root = pathlib.Path(args.root).expanduser().resolve()
  root.mkdir(parents=True, exist_ok=True)
  overrides = {**(QUICK if args.quick else {}), **parse_overrides(args.set)}
  seed_list = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
  with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
    seeds = list(pool.map(lambda seed: run_seed(root, seed, overrides), seed_list))
  summary = aggregate(seeds)
  table = markdown(seeds, summary)
  report = {"seeds": seeds, "summary": summary, "overrides": overrides}
  (root / "spa_bench.json").write_text(json.dumps(report, indent=2) + "\n")
  (root / "spa_bench.md").write_text(table + "\n")
  print(table, file=sys.stderr)
  if not args.no_results:
    append_results(table, " ".join(["python bench/spa_bench.py", *sys.argv[1:]]))
  print(json.dumps({"summary": summary, "root": str(root)}))


if __name__ == "__main__":
  main()
