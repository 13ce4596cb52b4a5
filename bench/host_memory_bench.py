"""The tiny default's SFT step on CPU with and without transparent huge pages for malloc.

    .venv/bin/python bench/host_memory_bench.py             # 3 rounds of (off, on), 6 steps each
    .venv/bin/python bench/host_memory_bench.py --rounds 1 --steps 3

Each measurement is a child process running the project's `make_sft_step` on the tiny default's
shape (configs/base.py TINY_ARCH, the catalogue tokenizer's 5,296 ids, 4 sequences x 1,536 tokens:
the SFT's most common length bucket) with GLIBC_TUNABLES=glibc.malloc.hugetlb=0 ("off") or =1
("on", what `python -m spa_jax.main` sets; spa_jax/host_memory.py). Off and on alternate, so both
see the same machine load. Reported: median step seconds after the compiling step, and, from the
child's rusage, minor page faults and system CPU seconds per process. Appends a section to
bench/RESULTS.md (unless --no-results) and ends with ONE JSON line on stdout.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import resource
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "RESULTS.md"
VOCAB, BATCH, SEQ = 5296, 4, 1536


def child(steps: int) -> None:
  """Times `steps` SFT steps after one compiling step; prints their seconds as JSON."""
  import jax
  import numpy as np
  from flax import nnx

  from configs.base import TINY_ARCH
  from spa_jax.models import Llama
  from spa_jax.models.config import LlamaConfig
  from spa_jax.training.optim import OptimizerConfig, make_optimizer
  from spa_jax.training.steps import make_sft_step
  from spa_jax.training.train_state import create_train_state

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


def measure(hugetlb: int, steps: int) -> dict:
  environ = {**os.environ, "GLIBC_TUNABLES": f"glibc.malloc.hugetlb={hugetlb}", "PYTHONPATH": str(REPO)}
  out = subprocess.run([sys.executable, __file__, "--child", "--steps", str(steps)], cwd=REPO, env=environ,
                       stdout=subprocess.PIPE, text=True, check=True)
  result = json.loads(out.stdout.splitlines()[-1])
  print(f"hugetlb={hugetlb}: median step {statistics.median(result['step_seconds']):.3f} s, "
        f"{result['minor_faults']} minor faults", file=sys.stderr, flush=True)
  return {"hugetlb": hugetlb, **result}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rounds", type=int, default=3, help="(off, on) pairs")
  parser.add_argument("--steps", type=int, default=6, help="timed steps per child")
  parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    return child(args.steps)
  runs = [measure(hugetlb, args.steps) for _ in range(args.rounds) for hugetlb in (0, 1)]
  summary = {}
  for hugetlb, name in ((0, "off"), (1, "on")):
    mine = [run for run in runs if run["hugetlb"] == hugetlb]
    summary[name] = {"median_step_s": statistics.median(s for run in mine for s in run["step_seconds"]),
                     "minor_faults": statistics.median(run["minor_faults"] for run in mine),
                     "system_cpu_s": statistics.median(run["system_cpu_s"] for run in mine),
                     "user_cpu_s": statistics.median(run["user_cpu_s"] for run in mine)}
  summary["speedup"] = summary["off"]["median_step_s"] / summary["on"]["median_step_s"]
  table = markdown(summary, args)
  print(table, file=sys.stderr)
  if not args.no_results:
    with RESULTS.open("a") as f:
      f.write(table + "\n")
  print(json.dumps(summary))


def markdown(summary: dict, args) -> str:
  now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  lines = [f"\n## host memory: huge pages for malloc, SFT step ({now})", "",
           f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
           f"glibc {platform.libc_ver()[1]}, load average {os.getloadavg()[0]:.1f} at the end",
           f"- command: `python bench/host_memory_bench.py{''.join(f' {a}' for a in sys.argv[1:])}`",
           f"- shape: tiny default arch, vocab {VOCAB}, {BATCH} x {SEQ} tokens; {args.rounds} round(s) of "
           f"(off, on), {args.steps} timed steps per process", "",
           "| GLIBC_TUNABLES glibc.malloc.hugetlb | median step s | minor page faults / process | system CPU s | user CPU s |",
           "|---|---|---|---|---|"]
  for name in ("off", "on"):
    row = summary[name]
    lines.append(f"| {name} ({0 if name == 'off' else 1}) | {row['median_step_s']:.3f} | {row['minor_faults']:,.0f} | "
                 f"{row['system_cpu_s']:.1f} | {row['user_cpu_s']:.1f} |")
  lines += ["", f"Step time off / on: {summary['speedup']:.2f}x"]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
