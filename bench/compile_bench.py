"""Compile time and step time of the training programs: layer stack unrolled vs scanned, and XLA flags.

    python bench/compile_bench.py                            # smollm2-135m shape, GPU
    python bench/compile_bench.py --preset llama3.2-3b --seq 1024
    python bench/compile_bench.py --programs sft --variants scanned,scanned_autotune0,scanned_no_triton_gemm
    .venv/bin/python bench/compile_bench.py --quick          # CPU: short sequences, 1 round

`model.scan_layers` runs the cache-free forward (training and scoring) as one `lax.scan` over the
layers' stacked parameters, so XLA compiles one layer body instead of `num_layers` copies. What that
buys, and what it costs per step, measured on the project's own programs:
  sft   the SFT stage's step: full fine-tune, AdamW, remat "full", batch 16 = 4 micro-batches of 4
  lora  the same step training LoRA (r 8 on q, v) over a frozen base: the PPO update's policy part
Each (variant, program, round) is a fresh child process (no persistent compilation cache, so no
variant inherits another's compilation); variants alternate within a round. A variant is the layer
stack's form plus XLA flags (`VARIANTS`; e.g. GPU autotuning off, which trades step speed for compile
time); each is compared with the first one listed. Reported per child:
tracing + lowering seconds, XLA compile seconds (`jit(...).lower(...).compile()`), the program's
scratch memory (XLA's temp buffers: where the scanned variant's stacked copies show), the first
call, the median step after it, and the loss after the steps (the two variants must agree). Appends a
section to bench/RESULTS.md (unless --no-results); ends with ONE JSON line on stdout.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from results_log import REPO, append_section

# name: (model.scan_layers, XLA flags added to the child's XLA_FLAGS)
VARIANTS = {"unrolled": (False, ""), "scanned": (True, ""),
            "scanned_autotune0": (True, "--xla_gpu_autotune_level=0"),  # no GEMM/fusion autotuning on GPU
            "scanned_no_triton_gemm": (True, "--xla_gpu_enable_triton_gemm=false")}  # cuBLAS GEMMs only
PROGRAMS = ("sft", "lora")


def child(preset: str, program: str, scan: bool, seq: int, steps: int) -> None:
  import jax
  import numpy as np
  from flax import nnx

  from spa_jax.models import Llama, LlamaConfig, apply_lora
  from spa_jax.sharding import create_sharded, make_mesh
  from spa_jax.training.global_batch import to_global_batch
  from spa_jax.training.optim import OptimizerConfig, make_optimizer
  from spa_jax.training.steps import make_sft_step
  from spa_jax.training.train_state import create_train_state

  from model_bench import timed

  # as the pipeline runs pretrained presets: float32 parameters, bfloat16 compute, full remat
  cfg = LlamaConfig.preset(preset, param_dtype="float32", dtype="bfloat16", remat_policy="full", scan_layers=scan)
  mesh = make_mesh()
  model = create_sharded(lambda: Llama(cfg, rngs=nnx.Rngs(0)), mesh)
  if program == "lora":
    apply_lora(model, 8, 16.0, ("q_proj", "v_proj"), rngs=nnx.Rngs(1))
  tx = make_optimizer(OptimizerConfig(learning_rate=1e-4, schedule="constant", total_steps=steps + 1))
  state = create_train_state(model, tx, trainable="lora" if program == "lora" else "full", seed=0)
  del model
  rng = np.random.default_rng(0)
  batch = {"tokens_bt": rng.integers(0, cfg.vocab_size, (16, seq), dtype=np.int32),
           "positions_bt": np.broadcast_to(np.arange(seq, dtype=np.int32), (16, seq)).copy(),
           "loss_mask_bt": np.ones((16, seq), np.float32)}
  with jax.set_mesh(mesh):
    step = make_sft_step(state, num_micro_batches=4)
    batch = to_global_batch(batch, mesh)
    started = time.perf_counter()
    lowered = step.lower(state, batch)
    lowered_at = time.perf_counter()
    temp_bytes = lowered.compile().memory_analysis().temp_size_in_bytes
    compiled_at = time.perf_counter()
    holder = {"state": state}

    def run():
      holder["state"], holder["metrics"] = step(holder["state"], batch)
      jax.block_until_ready(holder["metrics"])

    first_call_s = timed(run, repeats=1, warmup=0)
    step_s = timed(run, repeats=steps, warmup=0)
  print(json.dumps({"lower_s": lowered_at - started, "compile_s": compiled_at - lowered_at,
                    "first_call_s": first_call_s, "step_s": step_s, "temp_GB": temp_bytes / 1e9,
                    "loss": float(holder["metrics"]["sft_loss"]), "backend": jax.default_backend(),
                    "device": jax.devices()[0].device_kind}))


def measure(args, program: str, variant: str) -> dict:
  scan, xla_flags = VARIANTS[variant]
  environ = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false",
             "XLA_FLAGS": " ".join(filter(None, [os.environ.get("XLA_FLAGS"), xla_flags])),
             "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
  command = [sys.executable, __file__, "--child", "--preset", args.preset, "--program", program,
             "--seq", str(args.seq), "--steps", str(args.steps)] + (["--scan"] if scan else [])
  out = subprocess.run(command, cwd=REPO, env=environ, stdout=subprocess.PIPE, text=True, check=True)
  result = json.loads(out.stdout.splitlines()[-1])
  print(f"{program} {variant}: lower {result['lower_s']:.1f} s, compile {result['compile_s']:.1f} s, "
        f"step {result['step_s']:.3f} s, loss {result['loss']:.5f}", file=sys.stderr, flush=True)
  return {"program": program, "variant": variant, **result}


def summarize(runs: list[dict], programs: list[str], variants: list[str]) -> dict:
  """Per program: each variant's medians over rounds, and every later variant against the first."""
  summary = {"backend": runs[0]["backend"], "device": runs[0]["device"], "baseline": variants[0]}
  for program in programs:
    rows = {}
    for variant in variants:
      mine = [run for run in runs if run["program"] == program and run["variant"] == variant]
      rows[variant] = {key: statistics.median(run[key] for run in mine)
                       for key in ("lower_s", "compile_s", "first_call_s", "step_s", "temp_GB", "loss")}
    base = rows[variants[0]]
    rows["against_baseline"] = {variant: {
        "compile_speedup": (base["lower_s"] + base["compile_s"]) / (row["lower_s"] + row["compile_s"]),
        "step_time_ratio": row["step_s"] / base["step_s"],  # > 1: the variant costs per step
        "loss_difference": abs(row["loss"] - base["loss"])} for variant, row in rows.items() if variant != variants[0]}
    summary[program] = rows
  return summary


def markdown(summary: dict, args) -> str:
  programs, variants = args.programs.split(","), args.variants.split(",")
  lines = [f"- shape: `{args.preset}`, batch 16 x {args.seq} tokens (4 micro-batches), remat full; "
           f"{args.rounds} round(s), {args.steps} timed steps per child; {summary['backend']} "
           f"({summary['device']})", "",
           "| program | variant | trace + lower s | XLA compile s | first call s | step s | XLA temp GB | loss after the steps |",
           "|---|---|---|---|---|---|---|---|"]
  for program in programs:
    for variant in variants:
      row = summary[program][variant]
      lines.append(f"| {program} | {variant} | {row['lower_s']:.1f} | {row['compile_s']:.1f} | "
                   f"{row['first_call_s']:.2f} | {row['step_s']:.3f} | {row['temp_GB']:.2f} | {row['loss']:.5f} |")
  lines.append("")
  for program in programs:
    for variant, row in summary[program]["against_baseline"].items():
      lines.append(f"- {program}: {variant} compiles **{row['compile_speedup']:.2f}x as fast** as {variants[0]} "
                   f"(trace + lower + compile); step time {variant} / {variants[0]} **{row['step_time_ratio']:.3f}**; "
                   f"losses differ by {row['loss_difference']:.1e}")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="smollm2-135m", help="spa_jax.models.LlamaConfig preset")
  parser.add_argument("--seq", type=int, default=None, help="tokens per row (default 1536; 128 with --quick)")
  parser.add_argument("--rounds", type=int, default=None, help="rounds of every variant (default 2; 1 with --quick)")
  parser.add_argument("--steps", type=int, default=None, help="timed steps per child (default 10; 2 with --quick)")
  parser.add_argument("--quick", action="store_true", help="CPU-sized: short sequences, one round")
  parser.add_argument("--programs", default=",".join(PROGRAMS), help=f"of {PROGRAMS}, comma-separated")
  parser.add_argument("--variants", default="unrolled,scanned",
                      help=f"of {list(VARIANTS)}, comma-separated; the first is the baseline")
  parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--program", choices=PROGRAMS, help=argparse.SUPPRESS)
  parser.add_argument("--scan", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  defaults = (128, 1, 2) if args.quick else (1536, 2, 10)
  args.seq, args.rounds, args.steps = (given if given is not None else default for given, default in
                                       zip((args.seq, args.rounds, args.steps), defaults, strict=True))
  if args.child:
    return child(args.preset, args.program, args.scan, args.seq, args.steps)
  programs, variants = args.programs.split(","), args.variants.split(",")
  unknown = sorted(set(programs) - set(PROGRAMS)) + sorted(set(variants) - set(VARIANTS))
  if unknown or len(variants) < 2:
    parser.error(f"unknown programs/variants {unknown} or fewer than two variants; programs: {list(PROGRAMS)}, "
                 f"variants: {list(VARIANTS)}")
  runs = [measure(args, program, variant) for _ in range(args.rounds) for program in programs
          for variant in variants]
  summary = summarize(runs, programs, variants)
  table = markdown(summary, args)
  print(table, file=sys.stderr)
  if not args.no_results:
    append_section(f"compile_bench: training programs, {' vs '.join(variants)}",
                   "python bench/compile_bench.py" + "".join(f" {a}" for a in sys.argv[1:]), table)
  print(json.dumps(summary))


if __name__ == "__main__":
  main()
