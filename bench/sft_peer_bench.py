"""SmolLM2-135M SFT: spa_jax's stage against the PyTorch peer on the same demonstrations, one GPU.

    python3 bench/sft_peer_bench.py --peer ../shared/bench/smol_peer.py --gguf /tmp/smol/model.gguf \
        --hf /tmp/smol/hf --demos 1000                     # on the GPU machine, nothing else on the card

Runs, one after the other: the peer (`smol_peer.py GGUF_DIR GGUF_FILE N_DEMOS EPOCHS N_TEST`: full
fine-tune on the expert demonstrations of the first N_DEMOS embedded train goals as ChatML turns, batch
16, AdamW 1e-4, warm-up + cosine, then greedy on N_TEST test goals), then `python -m spa_jax.main
--config=configs/sft.py:smollm2-135m` on the same goals (`sft.train_split=train[:N_DEMOS]`) and epochs,
without the one-shot demonstration (`agent.one_shot=False`, the peer's format; `--one-shot` adds it to
ours only, which is then not like for like). Reported, peer time / ours (above 1: spa_jax faster):
  per step   steady-state seconds per optimizer step: the peer's from its step-50 log line to its last,
             ours from metrics/sft.jsonl's step-10 row to its last (compilation excluded on both sides)
  job        the peer's load + demonstrations + steps (evaluation excluded) against the SFT stage's
             seconds (data, init, compilation, steps, checkpoints, the policy's export) and against
             our whole process (interpreter and imports included)
Ours runs cold, with spa_jax's persistent XLA compilation cache off (`run.compilation_cache=False`), as
the peer has no cache: a cache warmed by an earlier run of the same shapes on the machine cut the
compilation from ~20-40 s to 11 s on 2026-12-07. `--warm-cache` keeps the cache (a repeated run's
figure) and says so in the heading. `--set PATH=VALUE` overrides our config (e.g. `--set
sft.max_padded_lengths=1 --set sft.length_bucket=128`: one compiled step shape fitted to the data).
Appends a section to bench/RESULTS.md (unless --no-results) and ends with ONE JSON line on stdout.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time

import results_log

REPO = pathlib.Path(__file__).resolve().parent.parent


def json_lines(text: str) -> list[dict]:
  """The lines of `text` that are JSON objects, in order (the peer prints one per phase)."""
  rows = []
  for line in text.splitlines():
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if isinstance(row, dict):
      rows.append(row)
  return rows


def steady_seconds_per_step(points: list[tuple[int, float]], from_step: int) -> float:
  """Seconds per step between the first logged step >= `from_step` and the last one, from
  (step, seconds) points; raises when the log has fewer than two such points."""
  later = sorted(p for p in points if p[0] >= from_step)
  if len(later) < 2 or later[-1][0] == later[0][0]:
    raise ValueError(f"need two logged steps at or after step {from_step} to time the steady state; "
                     f"got {sorted(points)}: run more steps (--demos, --epochs)")
  (s0, t0), (s1, t1) = later[0], later[-1]
  return (t1 - t0) / (s1 - s0)


def peer_summary(rows: list[dict]) -> dict:
  """The peer's phases from its JSON lines: load, demonstrations, steps, steady step time, result."""
  merged = {key: value for row in rows for key, value in row.items() if key not in ("step", "s", "loss")}
  steps = [(row["step"], row["s"]) for row in rows if "step" in row and "s" in row]
  missing = [key for key in ("loaded_s", "demo_s", "sft_s", "sft_steps") if key not in merged]
  if missing:
    raise ValueError(f"the peer's output lacks {missing}: did it fail? (its last lines: {rows[-2:]})")
  return {"load_s": merged["loaded_s"], "demo_s": merged["demo_s"], "steps_s": merged["sft_s"],
          "steps": merged["sft_steps"], "job_s": merged["loaded_s"] + merged["demo_s"] + merged["sft_s"],
          "step_s": steady_seconds_per_step(steps, 50), "final_loss": [r["loss"] for r in rows if "loss" in r][-1],
          "eval": {k: merged.get(k) for k in ("eval_goals", "score", "success_rate")}}


def ours_summary(workdir: pathlib.Path, process_s: float) -> dict:
  """The SFT stage's summary (sft/DONE.json) and its steady step time (metrics/sft.jsonl)."""
  summary = json.loads((workdir / "sft" / "DONE.json").read_text())["summary"]
  rows = json_lines((workdir / "metrics" / "sft.jsonl").read_text())
  times = {key: value for key, value in summary.items() if key.startswith("time_")}
  return {"job_s": summary["seconds"], "process_s": process_s, "steps": summary["steps"], **times,
          "padded_lengths": summary.get("padded_lengths"), "final_loss": summary["final_loss"],
          "step_s": steady_seconds_per_step([(r["step"], r["time"]) for r in rows], 10)}


def table(peer: dict, ours: dict) -> str:
  phases = ", ".join(f"{k[5:-2]} {v:.1f}" for k, v in ours.items() if k.startswith("time_"))
  return "\n".join([
      "| | PyTorch peer | spa_jax | peer time / ours |", "|---|---|---|---|",
      f"| per optimizer step, steady state | {peer['step_s']:.3f} s | {ours['step_s']:.3f} s | "
      f"**{peer['step_s'] / ours['step_s']:.2f}x** |",
      f"| the SFT job | {peer['job_s']:.1f} s (load {peer['load_s']:.1f} + demonstrations {peer['demo_s']:.1f} + "
      f"{peer['steps']} steps {peer['steps_s']:.1f}) | {ours['job_s']:.1f} s stage ({phases}; padded lengths "
      f"{ours['padded_lengths']}) | **{peer['job_s'] / ours['job_s']:.2f}x** |",
      f"| the SFT job, our whole process | | {ours['process_s']:.1f} s | {peer['job_s'] / ours['process_s']:.2f}x |",
      f"| final loss | {peer['final_loss']:.4f} | {ours['final_loss']:.4f} | |"])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--peer", default=str(REPO.parent / "shared" / "bench" / "smol_peer.py"))
  parser.add_argument("--gguf", required=True, help="SmolLM2's GGUF file (the peer dequantises it)")
  parser.add_argument("--hf", required=True, help="the same weights as an HF directory (spa_jax.models.gguf_import)")
  parser.add_argument("--demos", type=int, default=1000, help="expert demonstrations: the first N train goals")
  parser.add_argument("--epochs", type=int, default=2)
  parser.add_argument("--peer-test-goals", type=int, default=8, help="the peer's greedy check (not timed)")
  parser.add_argument("--workdir", default="/tmp/sft_peer_bench")
  parser.add_argument("--one-shot", action="store_true", help="ours with the one-shot demonstration (not like for like)")
  parser.add_argument("--warm-cache", action="store_true",
                      help="keep spa_jax's persistent XLA compilation cache (default: off, a cold compilation)")
  parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                      help="a config override for ours (repeatable), e.g. sft.max_padded_lengths=1")
  parser.add_argument("--no-results", action="store_true")
  args = parser.parse_args()
  gguf = pathlib.Path(args.gguf)
  peer_cmd = [sys.executable, args.peer, str(gguf.parent), gguf.name, str(args.demos), str(args.epochs),
              str(args.peer_test_goals)]
  print("peer:", " ".join(peer_cmd), file=sys.stderr, flush=True)
  done = subprocess.run(peer_cmd, capture_output=True, text=True)
  if done.returncode:
    raise SystemExit(f"the peer failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
  peer = peer_summary(json_lines(done.stdout))
  workdir = pathlib.Path(args.workdir)
  ours_cmd = [sys.executable, "-m", "spa_jax.main", "--config=configs/sft.py:smollm2-135m", f"--workdir={workdir}",
              "--config.run.targets=sft", "--config.run.force=sft", f"--config.sft.train_split=train[:{args.demos}]",
              f"--config.sft.epochs={args.epochs}", f"--config.agent.one_shot={args.one_shot}",
              "--config.model.gguf=", f"--config.model.hf_path={args.hf}", "--config.env.search_backend=bm25",
              "--config.tracking.tensorboard=False", "--config.tracking.progress=False",
              f"--config.run.compilation_cache={args.warm_cache}"] + [f"--config.{item}" for item in args.set]
  print("ours:", " ".join(ours_cmd), file=sys.stderr, flush=True)
  started = time.perf_counter()
  done = subprocess.run(ours_cmd, cwd=REPO, capture_output=True, text=True)
  if done.returncode:
    raise SystemExit(f"spa_jax's SFT failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
  ours = ours_summary(workdir, time.perf_counter() - started)
  results_log.publish(
      f"sft_peer_bench: SmolLM2-135M SFT against the PyTorch peer, {args.demos} demonstrations x {args.epochs} epochs"
      f"{', ours with the one-shot demonstration' if args.one_shot else ''}"
      f"{', ours with the persistent XLA cache (warm if this machine compiled these shapes before)' if args.warm_cache else ''}"
      f"{', ours with ' + ' '.join(args.set) if args.set else ''}",
      table(peer, ours),
      {"peer": peer, "ours": {**ours, "compilation_cache": args.warm_cache, "overrides": args.set}, "step_ratio": peer["step_s"] / ours["step_s"], "job_ratio": peer["job_s"] / ours["job_s"]},
      results=not args.no_results)


if __name__ == "__main__":
  main()
