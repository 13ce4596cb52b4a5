"""The tiny default's SFT step on CPU: what the host-memory and attention changes each buy.

    .venv/bin/python bench/sft_step_bench.py               # 3 rounds of every variant, 6 steps each
    .venv/bin/python bench/sft_step_bench.py --rounds 1 --steps 3

Each measurement is a child process running the project's `make_sft_step` on the tiny default's
shape (configs/base.py TINY_ARCH, the catalogue tokenizer's 5,296 ids, 4 sequences x 1,536 tokens:
the SFT's most common length bucket). Variants, cumulative:
  plain        GLIBC_TUNABLES=glibc.malloc.hugetlb=0, attention over every [t, s] pair
  huge pages   glibc.malloc.hugetlb=1, as `python -m spa_jax.main` sets (spa_jax/host_memory.py)
  + blocks     and causal attention in query blocks of XLA_QUERY_BLOCK (spa_jax/models/llama.py;
               the code's default)
Variants alternate within each round, so all see the same machine load. Reported: median step
seconds after the compiling step, and, from the child's rusage, minor page faults and system CPU
seconds per process. Appends a section to bench/RESULTS.md (unless --no-results) and ends with ONE
JSON line on stdout.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import time

from spa_jax import host_memory

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "RESULTS.md"
VOCAB, BATCH, SEQ = 5296, 4, 1536
VARIANTS = {"plain": dict(hugetlb=0, query_blocks=False), "huge pages": dict(hugetlb=1, query_blocks=False),
            "huge pages + query blocks": dict(hugetlb=1, query_blocks=True)}


def child(steps: int, query_blocks: bool) -> None:
  """Times `steps` SFT steps after one compiling step; prints their seconds and rusage as JSON."""
  import jax
  import numpy as np
  from flax import nnx

  from configs.base import TINY_ARCH
  from spa_jax.models import Llama, llama
  from spa_jax.models.config import LlamaConfig
  from spa_jax.training.optim import OptimizerConfig, make_optimizer
  from spa_jax.training.steps import make_sft_step
  from spa_jax.training.train_state import create_train_state

  if not query_blocks:
    llama.XLA_QUERY_BLOCK = SEQ  # one block: every query against every key
  cfg = LlamaConfig.preset("tiny", vocab_size=VOCAB, dtype="float32", param_dtype="float32",
                           remat_policy="none", **TINY_ARCH)
  tx = make_optimizer(OptimizerConfig(learning_rate=1e-3, schedule="constant", total_steps=steps + 1))
  state = create_train_state(Llama(cfg, rngs=nnx.Rngs(0)), tx, trainable="full", seed=0)
  step = make_sft_step(state)
  rng = np.random.default_rng(0)
  batch = {"tokens_bt": rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32),
           "positions_bt": np.tile(np.arange(SEQ, dtype=np.int32), (BATCH, 1)),
           "loss_mask_bt": np.ones((BATCH, SEQ), np.float32)}
  seconds = []
  for _ in range(steps + 1):
    started = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    seconds.append(time.perf_counter() - started)
  usage = resource.getrusage(resource.RUSAGE_SELF)
  print(json.dumps({"step_seconds": seconds[1:], "minor_faults": usage.ru_minflt,
                    "user_cpu_s": usage.ru_utime, "system_cpu_s": usage.ru_stime}))


def measure(name: str, steps: int) -> dict:
  variant = VARIANTS[name]
  environ = {**os.environ, "GLIBC_TUNABLES": f"glibc.malloc.hugetlb={variant['hugetlb']}",
             "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
  command = [sys.executable, __file__, "--child", "--steps", str(steps)]
  if variant["query_blocks"]:
    command.append("--query-blocks")
  out = subprocess.run(command, cwd=REPO, env=environ, stdout=subprocess.PIPE, text=True, check=True)
  result = json.loads(out.stdout.splitlines()[-1])
  print(f"{name}: median step {statistics.median(result['step_seconds']):.3f} s, "
        f"{result['minor_faults']} minor faults", file=sys.stderr, flush=True)
  return {"variant": name, **result}


def summarize(runs: list[dict]) -> dict:
  summary = {}
  for name in VARIANTS:
    mine = [run for run in runs if run["variant"] == name]
    summary[name] = {"median_step_s": statistics.median(s for run in mine for s in run["step_seconds"]),
                     **{key: statistics.median(run[key] for run in mine)
                        for key in ("minor_faults", "system_cpu_s", "user_cpu_s")}}
    summary[name]["speedup_vs_plain"] = summary["plain"]["median_step_s"] / summary[name]["median_step_s"]
  return summary


def markdown(summary: dict, args) -> str:
  now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  lines = [f"\n## sft_step_bench: host memory and attention blocks ({now})", "",
           f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
           f"glibc {'.'.join(map(str, host_memory.glibc_version() or ('?',)))}, load average {os.getloadavg()[0]:.1f} at the end",
           f"- command: `python bench/sft_step_bench.py{''.join(f' {a}' for a in sys.argv[1:])}`",
           f"- shape: tiny default arch, vocab {VOCAB}, {BATCH} x {SEQ} tokens; {args.rounds} round(s) of "
           f"every variant, {args.steps} timed steps per process", "",
           "| variant | median step s | vs plain | minor page faults / process | system CPU s | user CPU s |",
           "|---|---|---|---|---|---|"]
  for name, row in summary.items():
    lines.append(f"| {name} | {row['median_step_s']:.3f} | {row['speedup_vs_plain']:.2f}x | "
                 f"{row['minor_faults']:,.0f} | {row['system_cpu_s']:.1f} | {row['user_cpu_s']:.1f} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rounds", type=int, default=3, help="rounds of every variant")
  parser.add_argument("--steps", type=int, default=6, help="timed steps per child")
  parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--query-blocks", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    return child(args.steps, args.query_blocks)
  runs = [measure(name, args.steps) for _ in range(args.rounds) for name in VARIANTS]
  summary = summarize(runs)
  table = markdown(summary, args)
  print(table, file=sys.stderr)
  if not args.no_results:
    with RESULTS.open("a") as f:
      f.write(table + "\n")
  print(json.dumps(summary))


if __name__ == "__main__":
  main()
