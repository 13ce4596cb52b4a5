"""The progress estimator's head initialisation: a zero head against the linear probe (`prm.head_init`),
each fine-tuned at the given learning rate and epochs, on one workspace's exploration trajectories.

    .venv/bin/python -m spa_jax.main --config=configs/ppo.py --config.run.targets=explore  # tiny default
    .venv/bin/python bench/estimator_init_bench.py --workdir runs/default
    python3 bench/estimator_init_bench.py --workdir /tmp/spa/upstream --variants probe:2e-5:3,zero:5e-5:3

Each variant `<head_init>:<learning rate>:<epochs>` runs the prm stage alone on its own copy of the
workspace (the SFT policy, tokenizer and exploration hard-linked; the same held-out tasks, chosen by
the workspace's seed) and reports: the probe's cross-validated R^2 on the train trajectories and its
held-out R^2 before any fine-tuning (probe variants), then after fine-tuning the held-out R^2 (with
its bootstrap interval over the held-out goals, `prm.r2_interval`), the
held-out sums' Pearson correlation with the final reward and with the number of steps, the train
R^2, the epoch the stage kept by validation MSE (0: the initial head; the workspace's
`prm.validation_fraction` applies, 0 keeps the last epoch) and the stage's seconds, with the held-out R^2 of the line through the numbers of steps and of
ungrounded steps (`prm.counting_baseline_r2`) as the floor. Appends the table to bench/RESULTS.md
unless --no-results; prints one JSON line.
"""

import argparse
import json
import pathlib
import shutil
import sys
import time

import ml_collections

from results_log import append_section
from spa_jax import configuration
from spa_jax.stages import prm
from spa_jax.workspace import Workspace

DEFAULT_VARIANTS = "zero:1e-3:2,zero:1e-4:6,probe:1e-4:2,probe:3e-5:4"
# What a variant's copy needs: the prm stage reads the SFT policy, the tokenizer and the exploration.
SHARED = ("config.json", "sft", "explore", "policies/sft", "tokenizer", "trajectories")


def parse_variants(text: str) -> list[tuple[str, float, int]]:
  variants = []
  for item in text.split(","):
    head_init, learning_rate, epochs = item.split(":")
    variants.append((head_init, float(learning_rate), int(epochs)))
  return variants


def linked_copy(workdir: pathlib.Path, root: pathlib.Path) -> None:
  """`root` holds hard links to `workdir`'s SFT policy, tokenizer and exploration files (copies across
  filesystems); the explore stage's own trajectories only."""
  shutil.rmtree(root, ignore_errors=True)
  for name in SHARED:
    src = workdir / name
    if src.is_dir():
      shutil.copytree(src, root / name, copy_function=_link_or_copy,
                      ignore=shutil.ignore_patterns("ppo_*", "eval_*") if name == "trajectories" else None)
    elif src.exists():
      (root / name).parent.mkdir(parents=True, exist_ok=True)
      _link_or_copy(src, root / name)


def _link_or_copy(src, dst) -> None:
  try:
    pathlib.Path(dst).hardlink_to(src)
  except OSError:
    shutil.copy2(src, dst)


def run_variant(workdir: pathlib.Path, base_cfg: ml_collections.ConfigDict, out: pathlib.Path, head_init: str,
                learning_rate: float, epochs: int) -> dict:
  """The prm stage of `workdir` (config `base_cfg`) with this head, learning rate and epochs, on a copy."""
  root = out / f"{head_init}_lr{learning_rate:g}_ep{epochs}"
  linked_copy(workdir, root)
  cfg = ml_collections.ConfigDict(base_cfg.to_dict())
  cfg.workspace = str(root)
  cfg.prm.head_init, cfg.prm.learning_rate, cfg.prm.epochs = head_init, learning_rate, epochs
  cfg.tracking.progress = False
  configuration.validate(cfg)
  start = time.time()
  summary = prm.run(cfg, Workspace(root))
  return {"head_init": head_init, "learning_rate": learning_rate, "epochs": epochs, "steps": summary["steps"],
          "seconds": time.time() - start, **{key: summary.get(key) for key in (
              "probe_cv_r2", "probe_heldout_r2", "heldout_r2", "heldout_pearson", "heldout_steps_pearson",
              "heldout_r2_ci95", "train_r2", "heldout_baseline_r2", "train_trajectories", "heldout_trajectories",
              "kept_epoch")}}


def markdown(workdir: pathlib.Path, rows: list[dict]) -> str:
  def cell(value):
    return "" if value is None else f"{value:.3f}"

  def interval(bounds):
    return "" if bounds is None or None in bounds else f" [{bounds[0]:.2f}, {bounds[1]:.2f}]"
  first = rows[0]
  lines = [f"Workspace {workdir}: {first['train_trajectories']} train and {first['heldout_trajectories']} held-out "
           f"exploration trajectories; the line through the numbers of steps and of ungrounded steps reaches "
           f"held-out R^2 {cell(first['heldout_baseline_r2'])}.", "",
           "| head | lr | epochs (steps) | probe CV R^2 | probe held-out R^2 | held-out R^2 [95% CI] | held-out Pearson "
           "| Pearson with #steps | train R^2 | kept epoch | s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  lines += [f"| {r['head_init']} | {r['learning_rate']:g} | {r['epochs']} ({r['steps']}) | {cell(r['probe_cv_r2'])} "
            f"| {cell(r['probe_heldout_r2'])} | {cell(r['heldout_r2'])}{interval(r['heldout_r2_ci95'])} "
            f"| {cell(r['heldout_pearson'])} "
            f"| {cell(r['heldout_steps_pearson'])} | {cell(r['train_r2'])} | {r['kept_epoch']} | {r['seconds']:.0f} |"
            for r in rows]
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="a workspace whose explore stage is done")
  parser.add_argument("--variants", default=DEFAULT_VARIANTS, help="comma-separated head_init:lr:epochs")
  parser.add_argument("--out", help="where the variants' workspaces go (default <workdir>_init_bench)")
  parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
  args = parser.parse_args()
  workdir = pathlib.Path(args.workdir).expanduser().resolve()
  if Workspace(workdir).done_record("explore") is None:
    raise SystemExit(f"{workdir}: the explore stage has not finished; run the pipeline to it first "
                     f"(python -m spa_jax.main --workdir={workdir} --config.run.targets=explore ...)")
  out = pathlib.Path(args.out) if args.out else workdir.with_name(workdir.name + "_init_bench")
  cfg = configuration.workspace_config(workdir)
  rows = [run_variant(workdir, cfg, out, *variant) for variant in parse_variants(args.variants)]
  table = markdown(workdir, rows)
  print(table, file=sys.stderr)
  if not args.no_results:
    append_section("estimator_init_bench", " ".join(["python bench/estimator_init_bench.py", *sys.argv[1:]]), table)
  print(json.dumps(rows))


if __name__ == "__main__":
  main()
