"""The learning result: SFT vs sparse-reward PPO vs SPA over seeds, each seed a separate workspace.

    .venv/bin/python bench/spa_bench.py                       # the default command, seeds 0, 1, 2
    .venv/bin/python bench/spa_bench.py --seeds 0 --quick     # a smaller pipeline, one seed
    .venv/bin/python bench/spa_bench.py --set ppo.iterations=6 --set explore.max_tasks=32
    .venv/bin/python bench/spa_bench.py --set eval.policies=untrained,sft --set sft.batch_size=2  # SFT recipe
    XLA_PYTHON_CLIENT_PREALLOCATE=false python3 bench/spa_bench.py --jobs 3   # GPU: seeds side by side
    python3 bench/spa_bench.py --config configs/eval.py:smollm2-135m --seeds 0,1,2,3,4 --jobs 5  # pretrained

Each seed runs `python -m spa_jax.main --config=<config> --config.seed=<k>` (default config
configs/eval.py) in <root>/seed<k>/ (no stage is shared between seeds: SFT, exploration, the
estimator and the PPO runs all depend on the seed). A rerun reuses finished stages of the same
config and resumes PPO from its last checkpoint, so a long run can be a series of short ones.

`--upstream-seed U` measures PPO's own spread instead: ONE SFT policy, exploration and estimator
(config.seed=U, in <root>/upstream, its SFT evaluated there once), and each --seeds k a PPO seed
(`ppo.seed=k`) from it, every reward mode in its own copy of the upstream workspace
(<root>/seed<k>_<mode>, checkpoints and policies hard-linked), so all of them run side by side
(--jobs) and the sparse and SPA runs of one PPO seed see the same task order and sampling seeds.
`--arm NAME:MODE[:PATH=VALUE...]` adds a run per PPO seed with reward mode MODE and those overrides
(for example `--arm spa_penalty:spa:label.grounding_form=penalty`), in <root>/seed<k>_<NAME> and
reported as policy ppo_<NAME> beside the modes' runs and against sparse like them. A run that fails
(out of GPU memory, say) does not stop the others: the report covers the finished runs, names the rest
and the command exits non-zero (run it again to resume them). `--collect-only` runs nothing and reports
the finished workspaces under --root (copied back from a GPU machine; pass the run's --seeds, --arm and
--set ppo.reward_modes).
Collected per seed: the eval report (score = mean reward x 100, success rate, purchase rate,
grounding accuracy per policy), the estimator's held-out MSE / Pearson correlation and the PPO
runs' per-iteration train-rollout curves and, with `--set ppo.eval_every=K`, their held-out curves
(greedy on the eval goals every K iterations: metrics/ppo_<mode>_eval.jsonl). Reported: mean,
sample standard deviation and the 95% confidence interval of the mean (Student t) over seeds;
reference rows for the scripted expert, the first-result and the goes-back policies on the same
goals (bench/reference_policies.py); the paired per-seed difference SPA - sparse with its 95% CI and
what the seeds can resolve (the difference they detect with 80% power, the seeds the paper's gain
would need at their spread, and with the evaluations' per-goal trajectories how much of that spread
the evaluation goals drawn make and how much PPO's seeds: `paired_difference`); with
held-out curves, for each dense mode and arm, per seed the first iteration at which its held-out
success rate reaches sparse's final one (as a fraction of sparse's iterations: the "half the
iterations" criterion), and the same on the mean curves over seeds at the evaluations every run
reached (seeds x goals episodes per point: a smaller noise band than one seed's 50 goals); a plot of
train-rollout (and held-out) success rate and score against PPO iteration per reward mode (mean
over seeds, min-max band). Writes <root>/spa_bench.md, .json
and .png, copies the plot to bench/plots/<--name>.png, appends the table to bench/RESULTS.md and
ends with ONE JSON line on stdout.
"""

import argparse
import concurrent.futures
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
from scipy import optimize, stats

from results_log import REPO, append_section
from spa_jax.rollout.trajectory_store import read_trajectories
from spa_jax.tracking import read_metrics
from spa_jax.workspace import Workspace

POLICIES = ("sft", "ppo_sparse", "ppo_spa")
CURVES = ("success_rate", "score")  # train-rollout metrics of each PPO iteration
EVAL_CURVES = tuple(f"eval_{metric}" for metric in CURVES)  # held-out (ppo.eval_every) metrics
METRICS = ("score", "success_rate", "purchase_rate", "grounding", "mean_steps")
# SPA's gain over PPO in the paper (Wang et al. 2025), as the power analysis's reference effect: WebShop score
# with Llama-3.2-3B, 64.1 vs 62.1 (Figure 2, read second-hand); success rate, +2.5 points averaged over WebShop,
# ALFWorld and VirtualHome (abstract). ../shared/reference/spa-rl.md.
PAPER_GAIN = {"score": 2.0, "success_rate": 2.5}
ESTIMATOR = ("heldout_mse", "heldout_r2", "heldout_pearson", "heldout_steps_pearson", "heldout_baseline_r2",
             "train_mse", "train_pearson", "probe_cv_r2", "probe_heldout_r2", "kept_epoch")
# --quick: the same chain, about a third of the work (fewer tasks, rollouts and PPO iterations).
# Its 8 rollouts come as mini-batches of 2 x accumulation 4 (the tiny default's 6 x 1 does not divide 8).
QUICK = {"explore.max_tasks": 8, "ppo.iterations": 2, "ppo.rollouts_per_iteration": 8, "ppo.mini_batch_size": 2,
         "ppo.grad_accum": 4, "eval.max_tasks": 8, "eval.policies": ",".join(POLICIES)}


def run_pipeline(workdir: pathlib.Path, overrides: dict[str, str], config: str) -> dict:
  """Runs (or reuses) `spa_jax.main` in `workdir` (log: <workdir>.log, appended to: the upstream's
  label run and its SFT evaluation, or a rerun, keep the earlier output); returns its CPU/wall time."""
  command = [sys.executable, "-m", "spa_jax.main", f"--config={config}", f"--workdir={workdir}",
             "--config.tracking.progress=False", *(f"--config.{path}={value}" for path, value in overrides.items())]
  started = time.time()
  print(f"{workdir.name}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
  log_path = workdir.with_name(workdir.name + ".log")
  with open(log_path, "a") as log:
    log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {' '.join(command[1:])}\n")
    log.flush()
    child = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own CPU time, also when runs go at once
  if exit_code := os.waitstatus_to_exitcode(status):
    raise RuntimeError(f"{workdir.name} failed (exit {exit_code}); see {log_path}")
  return {"wall_s": round(time.time() - started, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1)}


def run_seed(root: pathlib.Path, seed: int, overrides: dict[str, str], config: str = "configs/eval.py") -> dict:
  """Runs (or reuses) the pipeline of one seed; returns its results and CPU/wall time."""
  workdir = root / f"seed{seed}"
  return {"seed": seed, **run_pipeline(workdir, {"seed": str(seed), **overrides}, config), **collect(workdir)}


def upstream_copy(upstream: pathlib.Path, workdir: pathlib.Path) -> None:
  """A workspace that reuses `upstream`'s finished stages: its checkpoints and policies hard-linked
  (nothing rewrites them), everything else copied (the lock, metrics and reports are per workspace)."""
  if workdir.exists():
    return  # a rerun: the copy resumes where it stopped

  def link_or_copy(src: str, dst: str) -> None:
    if pathlib.Path(src).relative_to(upstream).parts[0] in ("checkpoints", "policies"):
      os.link(src, dst)
    else:
      shutil.copy2(src, dst)
  shutil.copytree(upstream, workdir, copy_function=link_or_copy, ignore=shutil.ignore_patterns("lock"))


def parse_arm(text: str) -> tuple[str, str, dict[str, str]]:
  """`NAME:MODE[:PATH=VALUE...]` -> (name, reward mode, overrides)."""
  name, _, rest = text.partition(":")
  mode, *items = rest.split(":") if rest else [""]
  if not name or not mode or name == mode or not all("=" in item for item in items):
    raise SystemExit(f"--arm {text!r}: use --arm NAME:MODE[:PATH=VALUE...] with NAME not a reward mode, "
                     "e.g. --arm spa_penalty:spa:label.grounding_form=penalty")
  return name, mode, parse_overrides(items)


def renamed(result: dict, mode: str, name: str) -> dict:
  """`result` (collect's) with run ppo_<mode>'s policy and curves reported as ppo_<name>."""
  def rename(table: dict) -> dict:
    return {(f"ppo_{name}" if key == f"ppo_{mode}" else key): value for key, value in table.items()}
  return result | {key: rename(result[key]) for key in ("policies", "curves", "eval_curves", "per_goal") if key in result}


def run_ppo_seeds(root: pathlib.Path, upstream_seed: int, seeds: list[int], overrides: dict[str, str],
                  config: str, jobs: int, arms: list[tuple[str, str, dict[str, str]]] = (),
                  collect_only: bool = False) -> tuple[list[dict], list[str]]:
  """PPO seeds from one upstream (SFT, exploration, estimator of config.seed=`upstream_seed`): every
  (seed, reward mode or arm) in its own workspace copy, side by side; returns the results per PPO seed
  with the upstream's SFT row, and the runs that did not finish (their workspace and why). A run that
  fails (say, out of memory) leaves the others' results standing; `collect_only` reads the finished
  workspaces under `root` and runs nothing (workspaces brought back from another machine)."""
  modes = [m.strip() for m in overrides.get("ppo.reward_modes", "sparse,spa").split(",") if m.strip()]
  arms = [(mode, mode, {}) for mode in modes] + list(arms)  # (name, reward mode, overrides)
  upstream = root / "upstream"
  shared = {**overrides, "seed": str(upstream_seed)}
  runs = {("sft", None): (upstream, {**shared, "run.targets": "eval", "eval.policies": "sft"})}
  runs |= {(seed, name): (root / f"seed{seed}_{name}",
                          {**shared, **own, "ppo.seed": str(seed), "ppo.reward_modes": mode, "run.targets": "eval",
                           "eval.policies": f"ppo_{mode}"}) for seed in seeds for name, mode, own in arms}
  failed: dict[tuple, str] = {}
  times: dict[tuple, dict] = {}
  if not collect_only:
    needs_labels = any(mode == "spa" for _, mode, _ in arms)
    run_pipeline(upstream, {**shared, "run.targets": "label" if needs_labels else "sft"}, config)
    for seed in seeds:
      for name, _, _ in arms:
        upstream_copy(upstream, root / f"seed{seed}_{name}")

    def attempt(key: tuple) -> None:
      try:
        times[key] = run_pipeline(*runs[key], config)
      except RuntimeError as error:  # the others go on; the report names this one
        failed[key] = str(error)

    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
      list(pool.map(attempt, runs))
    if ("sft", None) in failed:  # every seed's table needs the SFT row
      raise RuntimeError(failed["sft", None])
  base = collect(upstream)
  results, missing = [], []
  for seed in seeds:
    result = {**base, "seed": seed, "policies": dict(base["policies"]), "curves": {}, "eval_curves": {},
              "per_goal": dict(base["per_goal"]), "wall_s": 0.0, "cpu_s": 0.0}
    for name, mode, _ in arms:
      workdir = root / f"seed{seed}_{name}"
      reason = failed.get((seed, name))
      own = None if reason or not (workdir / "reports" / "eval.json").exists() else collect(workdir)
      if own is None or f"ppo_{mode}" not in own["policies"]:
        missing.append(f"{workdir.name} ({reason or 'no eval report of ppo_' + mode})")
        continue
      own = renamed(own, mode, name)
      result["policies"] |= own["policies"]
      result["curves"] |= own["curves"]
      result["eval_curves"] |= own["eval_curves"]
      result["per_goal"] |= own["per_goal"]
      if (seed, name) in times:  # not with collect_only: the report then has no time line
        result["wall_s"] = max(result["wall_s"], times[seed, name]["wall_s"])
        result["cpu_s"] += times[seed, name]["cpu_s"]
    results.append(result)
  return results, missing


def per_goal(workdir: pathlib.Path, policy: str) -> dict[str, dict[int, float]]:
  """A policy's final evaluation goal by goal (trajectories/eval_<policy>): score and success (0 or 100) per
  task id, for the part of a paired difference that the choice of goals explains (`goal_noise`)."""
  records = read_trajectories(Workspace(workdir), f"eval_{policy}")
  return {"score": {r["task_id"]: 100.0 * r["final_reward"] for r in records},
          "success_rate": {r["task_id"]: 100.0 * r["success"] for r in records}}


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
  result["per_goal"] = {policy: per_goal(workdir, policy) for policy in result["policies"]
                        if Workspace(workdir).trajectory_shards(f"eval_{policy}")}
  result["curves"], result["eval_curves"] = {}, {}
  result["held_out_tasks"] = json.loads((workdir / "config.json").read_text())["ppo"]["eval_tasks"]
  for path in sorted((workdir / "metrics").glob("ppo_*.jsonl")):
    rows = read_metrics(path)
    if path.stem.endswith("_eval"):
      result["eval_curves"][path.stem.removesuffix("_eval")] = {k: [row.get(k) for row in rows]
                                                                for k in ("step", *EVAL_CURVES)}
    else:
      result["curves"][path.stem] = {k: [row.get(k) for row in rows] for k in ("step", *CURVES, "kl")}
  return result


def confidence_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
  """Student-t confidence interval of the mean (nan for fewer than two values)."""
  values = np.asarray([v for v in values if v is not None], np.float64)
  if values.size < 2:
    return float("nan"), float("nan")
  half = stats.t.ppf(0.5 + level / 2, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
  return float(values.mean() - half), float(values.mean() + half)


def paired_t_power(effect: float, sd: float, n: int, level: float = 0.95) -> float:
  """Power of the two-sided paired t-test at `level` on n seeds whose differences have standard
  deviation `sd`, when the true mean difference is `effect` (noncentral t)."""
  if n < 2 or not sd > 0:
    return float("nan")
  critical = stats.t.ppf(0.5 + level / 2, n - 1)
  noncentrality = effect * np.sqrt(n) / sd
  # the lower tail as the upper tail of -T (scipy 1.17's nct.cdf returns nan far out in its tail, sf does not)
  return float(stats.nct.sf(critical, n - 1, noncentrality) + stats.nct.sf(critical, n - 1, -noncentrality))


def detectable_difference(sd: float, n: int, power: float = 0.8, level: float = 0.95) -> float:
  """The smallest true mean difference that n seeds detect with `power` (paired t-test at `level`)."""
  if n < 2 or not sd > 0:
    return float("nan")
  return float(optimize.brentq(lambda effect: paired_t_power(effect, sd, n, level) - power, 0.0, 200 * sd))


def seeds_needed(effect: float, sd: float, power: float = 0.8, level: float = 0.95, most: int = 10_000) -> int | None:
  """The fewest seeds whose paired t-test detects a true difference `effect` with `power`, when the per-seed
  differences have standard deviation `sd` (None beyond `most`)."""
  if not sd > 0:
    return None
  return next((n for n in range(2, most + 1) if paired_t_power(effect, sd, n, level) >= power), None)


def goal_noise(seeds: list[dict], a: str, b: str, metric: str) -> float:
  """The variance that evaluating on a finite set of goals adds to one seed's a - b (mean over the seeds
  with both policies' per-goal results, `per_goal`): var over goals of the per-goal difference / goals.
  The paired differences' variance over seeds is this plus PPO's own seed-to-seed variance."""
  variances = []
  for seed in seeds:
    outcomes = seed.get("per_goal", {})
    if a in outcomes and b in outcomes:
      goals = sorted(outcomes[a][metric].keys() & outcomes[b][metric].keys())
      diffs = np.array([outcomes[a][metric][g] - outcomes[b][metric][g] for g in goals])
      if diffs.size > 1:
        variances.append(diffs.var(ddof=1) / diffs.size)
  return float(np.mean(variances)) if variances else float("nan")


def paired_difference(seeds: list[dict], a: str, b: str) -> dict[str, dict]:
  """Per-seed a - b (score and success rate) over seeds that evaluated both: mean and 95% CI, and the
  median and the number of seeds where a is above b (one collapsed seed can carry the mean and the
  CI alone; these two say whether it does); with per-goal results, the part of one seed's difference that
  comes from the goals drawn (`goal_sd`) and PPO's own seed-to-seed spread (`seed_sd`, the rest of the
  differences' variance); with two seeds or more, what their spread can resolve: the
  smallest true difference these seeds detect with 80% power (`detectable`) and the seeds that the
  paper's WebShop gain of SPA over PPO would need at this spread (`paper_gain`, `seeds_for_paper_gain`)."""
  both = [s for s in seeds if a in s["policies"] and b in s["policies"]]
  out = {}
  for metric in ("score", "success_rate"):
    diffs = [s["policies"][a][metric] - s["policies"][b][metric] for s in both]
    sd = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else float("nan")
    goal_var = goal_noise(both, a, b, metric)
    out[metric] = {"per_seed": diffs, "mean": float(np.mean(diffs)) if diffs else float("nan"),
                   "goal_sd": float(np.sqrt(goal_var)), "seed_sd": float(np.sqrt(max(sd ** 2 - goal_var, 0.0))),
                   "ci95": confidence_interval(diffs), "median": float(np.median(diffs)) if diffs else float("nan"),
                   "above": sum(d > 0 for d in diffs), "detectable": detectable_difference(sd, len(diffs)),
                   "paper_gain": PAPER_GAIN[metric], "seeds_for_paper_gain": seeds_needed(PAPER_GAIN[metric], sd)}
  return out


def reference(workdir: pathlib.Path) -> dict[str, dict[str, float]]:
  """The scripted reference policies on the workspace's eval goals (bench/reference_policies.py)."""
  from reference_policies import reference_rows
  from spa_jax import configuration
  from spa_jax.stages import common
  cfg = configuration.workspace_config(workdir)
  tasks = common.split_tasks(cfg, cfg.env.eval_split, cfg.eval.max_tasks)
  return reference_rows(common.load_catalogue(cfg), tasks, **common.env_kwargs(cfg))


def curve_band(seeds: list[dict], kind: str, name: str, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(steps any seed's `kind` curve of run `name` has, and at each the mean, min and max of `metric` over
  the seeds that logged it): runs stopped by ppo.time_budget_s end at different iterations, and the
  last ones (the final held-out evaluation, say) are kept."""
  curves = [dict(zip(s[kind][name]["step"], s[kind][name][metric])) for s in seeds if name in s.get(kind, {})]
  steps = sorted({step for curve in curves for step in curve})
  values = [[curve[step] for curve in curves if curve.get(step) is not None] for step in steps]
  return (np.asarray(steps), *(np.asarray([reduce(v) for v in values], np.float64) for reduce in (np.mean, np.min, np.max)))


def plot_curves(seeds: list[dict], out: pathlib.Path) -> None:
  """Success rate and score per PPO iteration, train rollouts (top) and, where logged, greedy on the
  held-out goals (bottom): mean over seeds, min-max band."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  panels = [("curves", "train-rollout", CURVES)]
  if any(s.get("eval_curves") for s in seeds):
    panels.append(("eval_curves", "held-out greedy", EVAL_CURVES))
  colors = {name: f"C{k}" for k, name in enumerate(sorted({n for s in seeds for n in s["curves"]}))}
  fig, axes = plt.subplots(len(panels), len(CURVES), figsize=(6 * len(CURVES), 4 * len(panels)), squeeze=False)
  for row, (kind, title, metrics) in zip(axes, panels):
    runs = sorted({name for s in seeds for name in s.get(kind, {})})
    for ax, metric in zip(row, metrics):
      for name in runs:
        steps, mean, low, high = curve_band(seeds, kind, name, metric)
        count = sum(name in s.get(kind, {}) for s in seeds)
        ax.plot(steps, mean, marker=".", color=colors.get(name), label=f"{name} ({count} seeds)")
        ax.fill_between(steps, low, high, color=colors.get(name), alpha=0.2)
      ax.set_title(f"{title} {metric.removeprefix('eval_')}")
      ax.set_xlabel("PPO iteration")
      ax.grid(alpha=0.3)
    row[0].legend()
  fig.tight_layout()
  fig.savefig(out, dpi=90)
  plt.close(fig)


def _evaluation_noise(start: float, target: float, episodes: int) -> float:
  """Two binomial standard errors (percentage points) of the difference of two success rates measured on
  `episodes` held-out episodes each, at the mean of the two rates."""
  p = (start + target) / 200
  return float(100 * 2 * np.sqrt(2 * p * (1 - p) / episodes))


def iterations_to_reach(seeds: list[dict], fast: str = "ppo_spa", slow: str = "ppo_sparse") -> list[dict]:
  """Per seed with both held-out curves: `slow`'s start (step 0) and final held-out success rate, the
  first PPO iteration (>= 1) at which `fast`'s reaches the final one (None: never), that iteration as
  a fraction of `slow`'s last one, and `noise`: two binomial standard errors of the difference of two
  evaluations on the held-out goals. The criterion means something only where `slow`'s gain exceeds it."""
  out = []
  for s in seeds:
    curves = s.get("eval_curves", {})
    if fast not in curves or slow not in curves:
      continue
    start, target = curves[slow]["eval_success_rate"][0], curves[slow]["eval_success_rate"][-1]
    slow_last = curves[slow]["step"][-1]
    reached = next((step for step, value in zip(curves[fast]["step"], curves[fast]["eval_success_rate"])
                    if step >= 1 and value >= target), None)
    out.append({"seed": s["seed"], "start": start, "target": target, "slow_iterations": slow_last,
                "iteration": reached, "fraction": reached / slow_last if reached is not None else None,
                "noise": _evaluation_noise(start, target, s["held_out_tasks"])})
  return out


def pooled_iterations_to_reach(seeds: list[dict], fast: str = "ppo_spa", slow: str = "ppo_sparse") -> dict | None:
  """The same criterion on the mean held-out curves over the seeds that have both (None: none has), at the
  evaluation steps every one of those runs reached: seeds x held-out goals episodes per point, so its
  noise is sqrt(seeds) times smaller than one seed's."""
  having = [s for s in seeds if fast in s.get("eval_curves", {}) and slow in s.get("eval_curves", {})]
  if not having:
    return None
  common = sorted(set.intersection(*(set(s["eval_curves"][policy]["step"]) for s in having for policy in (fast, slow))))
  if not common or common[-1] < 1:
    return None

  def mean_curve(policy: str) -> list[float]:
    return [float(np.mean([dict(zip(s["eval_curves"][policy]["step"], s["eval_curves"][policy]["eval_success_rate"]))[step]
                           for s in having])) for step in common]
  fast_curve, slow_curve = mean_curve(fast), mean_curve(slow)
  start, target = slow_curve[0], slow_curve[-1]
  reached = next((step for step, value in zip(common, fast_curve) if step >= 1 and value >= target), None)
  return {"seeds": len(having), "steps": common, "start": start, "target": target, "slow_iterations": common[-1],
          "iteration": reached, "fraction": reached / common[-1] if reached is not None else None,
          "noise": _evaluation_noise(start, target, sum(s["held_out_tasks"] for s in having))}


def mean_std(values: list) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for one value) of the non-missing values."""
  values = [v for v in values if v is not None]
  if not values:
    return float("nan"), float("nan")
  return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def aggregate(seeds: list[dict]) -> dict:
  """Per policy over the seeds that evaluated it (a run that did not finish leaves its seed out of its
  policy's row and out of the paired differences it is in): mean and std, 95% CI and the seed count."""
  policies = list(dict.fromkeys(p for s in seeds for p in s["policies"]))
  having = {p: [s["policies"][p] for s in seeds if p in s["policies"]] for p in policies}
  summary = {"policies": {p: {m: mean_std([row[m] for row in having[p]]) for m in METRICS} for p in policies},
             "ci95": {p: {m: confidence_interval([row[m] for row in having[p]]) for m in ("score", "success_rate")}
                      for p in policies},
             "seeds": {p: len(having[p]) for p in policies}}
  if "ppo_sparse" in policies:  # each dense mode against sparse, paired by PPO seed
    summary["minus_sparse"] = {policy.removeprefix("ppo_"): paired_difference(seeds, policy, "ppo_sparse")
                               for policy in policies if policy.startswith("ppo_") and policy != "ppo_sparse"}
  if all("estimator" in s for s in seeds):
    summary["estimator"] = {k: mean_std([s["estimator"][k] for s in seeds]) for k in ESTIMATOR}
  reach = {}
  for policy in policies:
    if policy.startswith("ppo_") and policy != "ppo_sparse":
      per_seed, pooled = iterations_to_reach(seeds, policy), pooled_iterations_to_reach(seeds, policy)
      if per_seed:
        reach[policy.removeprefix("ppo_")] = {"per_seed": per_seed, "pooled": pooled}
  if reach:
    summary["reaches_sparse_final"] = reach
  return summary


def reach_lines(summary: dict) -> list[str]:
  """The "half the iterations" criterion's lines, per dense policy: per seed, then pooled over seeds."""
  lines = []
  for mode, reach in summary.get("reaches_sparse_final", {}).items():
    inside = lambda r: (f" (a gain inside the noise, +-{r['noise']:.1f}: the criterion is undefined)"
                        if r["target"] - r["start"] <= r["noise"] else "")
    reached = lambda r: (f"at iteration {r['iteration']} ({r['fraction']:.2f} of them)" if r["iteration"] is not None
                         else "never")
    lines += ["", f"{mode}'s held-out success rate reaches sparse's final one (greedy, ppo.eval_every): " + "; ".join(
        f"seed {r['seed']}: sparse {r['start']:.1f} -> {r['target']:.1f}% in {r['slow_iterations']} iterations"
        + inside(r) + f", {mode} " + reached(r) for r in reach["per_seed"])]
    if pooled := reach["pooled"]:
      lines += ["", f"Pooled over {pooled['seeds']} seeds (mean curves at the evaluations all of them reached, "
                f"iterations {pooled['steps']}): sparse {pooled['start']:.1f} -> {pooled['target']:.1f}%"
                + inside(pooled) + f", {mode} " + reached(pooled)]
  return lines


def power_note(diff: dict) -> str:
  """What the seeds' spread resolves: the detectable difference and the seeds the paper's gain would need,
  and how much of that spread the evaluation goals make."""
  if not np.isfinite(diff["detectable"]):
    return ""
  needed = diff["seeds_for_paper_gain"]
  split = (f"; of its standard deviation over seeds, the {diff['goal_sd']:.1f} of one evaluation on these goals and "
           f"{diff['seed_sd']:.1f} from PPO seed to seed" if np.isfinite(diff["goal_sd"]) else "")
  return split + (f"; these seeds detect a true difference of {diff['detectable']:.1f} or more (80% power, paired t-test "
          f"at 5%), the paper's gain of {diff['paper_gain']:+.1f} would need "
          + (f"{needed} seeds" if needed else "more than 10,000 seeds") + " at this spread")


def markdown(seeds: list[dict], summary: dict) -> str:
  n = len(seeds)
  lines = [f"Mean ± sample std over {n} seed(s) ({', '.join(str(s['seed']) for s in seeds)}), 95% CI of the "
           f"mean (Student t) in brackets; {seeds[0]['eval_tasks']} eval tasks per seed, greedy.", "",
           "| policy | score | SR % | purchase % | grounding % | steps |", "|---|---|---|---|---|---|"]
  for policy, metrics in summary["policies"].items():
    cells = [f"{mean:.1f} ± {std:.1f}" for mean, std in (metrics[m] for m in METRICS)]
    for column, metric in ((0, "score"), (1, "success_rate")):
      low, high = summary["ci95"][policy][metric]
      cells[column] += f" [{low:.1f}, {high:.1f}]" if np.isfinite(low) else ""
    count = summary["seeds"][policy]
    lines.append(f"| {policy}{f' ({count} of {n} seeds)' if count < n else ''} | " + " | ".join(cells) + " |")
  for name, row in summary.get("reference", {}).items():
    lines.append(f"| {name} (scripted) | {row['score']:.1f} | {row['success_rate']:.1f} | | | |")
  for mode, diff in summary.get("minus_sparse", {}).items():
    lines += [""] + [f"Paired {mode} - sparse, {metric}: mean {d['mean']:+.1f}, 95% CI "
                     + (f"[{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]" if np.isfinite(d["ci95"][0]) else "n/a (one seed)")
                     + f", per seed {', '.join(f'{x:+.1f}' for x in d['per_seed'])}; median {d['median']:+.1f}, "
                     f"above sparse on {d['above']} of {len(d['per_seed'])} seeds" + power_note(d)
                     for metric, d in diff.items()]
  lines += reach_lines(summary)
  lines += ["", "Per seed (score): " + "; ".join(
      f"seed {s['seed']}: " + ", ".join(f"{p} {v['score']:.1f}" for p, v in s["policies"].items()) for s in seeds)]
  if est := summary.get("estimator"):
    lines += ["", "Progress estimator (predicted sum of c_t vs final reward): "
              f"held-out MSE {est['heldout_mse'][0]:.4f} ± {est['heldout_mse'][1]:.4f}, "
              f"R² {est['heldout_r2'][0]:.3f} ± {est['heldout_r2'][1]:.3f}, "
              f"Pearson {est['heldout_pearson'][0]:.3f} ± {est['heldout_pearson'][1]:.3f}, "
              f"Pearson with the number of steps {est['heldout_steps_pearson'][0]:.3f} (a line through the "
              f"numbers of steps and of ungrounded steps: R² {est['heldout_baseline_r2'][0]:.3f}); "
              f"train MSE {est['train_mse'][0]:.4f}, Pearson {est['train_pearson'][0]:.3f}"
              + (f"; its head's linear probe before fine-tuning (prm.head_init=probe): cross-validated R² "
                 f"{est['probe_cv_r2'][0]:.3f}, held-out R² {est['probe_heldout_r2'][0]:.3f}"
                 if np.isfinite(est["probe_heldout_r2"][0]) else "")
              + (f"; the epoch kept by validation MSE (0: the initial head) {est['kept_epoch'][0]:.1f} on average"
                 if np.isfinite(est["kept_epoch"][0]) else ""),
              "", "Per-step progress plots: " + ", ".join(dict.fromkeys(s["progress_plot"] for s in seeds))]
  lines += ["", "SFT per seed: " + "; ".join(
      f"seed {s['seed']}: {s['sft']['steps']} steps in {s['sft']['seconds']:.0f} s, last loss {s['sft']['final_loss']:.3f}"
      for s in seeds)]
  if any(s["wall_s"] for s in seeds):
    lines += ["", "Time per seed: " + "; ".join(f"seed {s['seed']}: {s['wall_s']:.0f} s wall, {s['cpu_s']:.0f} s CPU"
                                               for s in seeds)]
  return "\n".join(lines)


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
  parser.add_argument("--config", default="configs/eval.py", help="config file[:preset] every seed runs")
  parser.add_argument("--name", default="spa_bench", help="the learning-curve plot's name under bench/plots/")
  parser.add_argument("--quick", action="store_true", help=f"smaller pipeline: {QUICK}")
  parser.add_argument("--root", default=str(REPO / "runs" / "spa_bench"), help="workspaces go in <root>/seed<k>")
  parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="extra config override")
  parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
  parser.add_argument("--upstream-seed", type=int, default=None,
                      help="one SFT policy / exploration / estimator (config.seed=this) for every seed; "
                           "--seeds are then PPO seeds (ppo.seed), each reward mode a separate run")
  parser.add_argument("--arm", action="append", default=[], metavar="NAME:MODE[:PATH=VALUE...]",
                      help="with --upstream-seed: one more run per PPO seed, reward mode MODE with these "
                           "overrides, reported as ppo_NAME (e.g. spa_penalty:spa:label.grounding_form=penalty)")
  parser.add_argument("--collect-only", action="store_true",
                      help="with --upstream-seed: run nothing, report the finished workspaces under --root "
                           "(e.g. copied back from a GPU machine); pass the run's --seeds, --arm and --set ppo.reward_modes")
  parser.add_argument("--jobs", type=int, default=1,
                      help="seeds run at once (a many-core or GPU machine; on a GPU also set "
                           "XLA_PYTHON_CLIENT_PREALLOCATE=false so the processes share its memory)")
  args = parser.parse_args()
  root = pathlib.Path(args.root).expanduser().resolve()
  root.mkdir(parents=True, exist_ok=True)
  overrides = {**(QUICK if args.quick else {}), **parse_overrides(args.set)}
  seed_list = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
  arms = [parse_arm(arm) for arm in args.arm]
  if (arms or args.collect_only) and args.upstream_seed is None:
    raise SystemExit("--arm and --collect-only need --upstream-seed (PPO runs from one shared upstream)")
  missing = []
  if args.upstream_seed is not None:
    seeds, missing = run_ppo_seeds(root, args.upstream_seed, seed_list, overrides, args.config, args.jobs, arms,
                                   collect_only=args.collect_only)
  else:
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
      seeds = list(pool.map(lambda seed: run_seed(root, seed, overrides, args.config), seed_list))
  summary = aggregate(seeds)
  summary["reference"] = reference(pathlib.Path(seeds[0]["workspace"]))
  table = markdown(seeds, summary)
  if args.upstream_seed is not None:
    table = (f"PPO seeds {args.seeds} from ONE SFT policy, exploration and estimator (config.seed="
             f"{args.upstream_seed}): the spread is PPO's alone; the sft row is that one policy.\n\n" + table)
  if missing:
    table += "\n\nRuns that did not finish (left out of their policy's row): " + "; ".join(missing)
  report = {"seeds": seeds, "summary": summary, "overrides": overrides, "config": args.config}
  (root / "spa_bench.json").write_text(json.dumps(report, indent=2) + "\n")
  if any(s["curves"] for s in seeds):
    plot_curves(seeds, root / "spa_bench.png")
    table += (f"\n\nLearning curves (train rollouts per PPO iteration"
              + (", and greedy on held-out goals" if any(s["eval_curves"] for s in seeds) else "")
              + f"): bench/plots/{args.name}.png")
  (root / "spa_bench.md").write_text(table + "\n")
  print(table, file=sys.stderr)
  if not args.no_results:
    if (root / "spa_bench.png").exists():
      (REPO / "bench" / "plots").mkdir(exist_ok=True)
      shutil.copyfile(root / "spa_bench.png", REPO / "bench" / "plots" / f"{args.name}.png")
    append_section("spa_bench", " ".join(["python bench/spa_bench.py", *sys.argv[1:]]), table)
  print(json.dumps({"summary": summary, "root": str(root), "missing": missing}))
  if missing:
    sys.exit(f"{len(missing)} run(s) did not finish: {'; '.join(missing)}. Run the same command again to go on "
             "from their checkpoints (finished runs are reused).")


if __name__ == "__main__":
  main()
