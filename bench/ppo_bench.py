"""Online PPO iterations of a 3B-shaped model: per stage and per PPO phase, steady state against ceilings.

    python3 bench/ppo_bench.py --num-envs 64                   # GPU (H200): the 3B shape, 64 episodes at once
    .venv/bin/python bench/ppo_bench.py --quick --no-results   # CPU smoke run: tiny arch, 8 envs

Runs the real pipeline (`spa_jax.pipeline.run_pipeline`, as `spa_jax.main` does) up to `ppo` in a
fresh workspace, one stage at a time (sft, explore, prm, label, ppo), on configs/ppo.py:tiny changed
to the Llama-3.2-3B architecture through `model.arch` (hidden 3072, 28 layers, 24 heads, 8 KV heads,
MLP 8192; `model.preset="llama3.2-3b"` passes `configuration.validate` only with HF weights) with
Llama-3's 128,256-entry vocabulary (`model.arch.vocab_size`; the tiny config's 4096-token
SentencePiece tokenizer uses the first 4096 ids) and the real presets' one-shot prompt
(`agent.one_shot`): 3.21B parameters, random init, bfloat16 activations and parameters
(float32 parameters would leave about 57 GB of policies and checkpoints on the device machine's
64 GiB disk), LoRA for sft, prm and ppo, --num-envs episodes at once, numpy BM25 search (no Java).
Small stages before PPO (SFT: 16 expert episodes, 1 epoch; exploration: 16 tasks x 2; 1 estimator
epoch), then --iterations online PPO iteration(s) of --num-envs rollouts with spa rewards and the
real presets' update layout (mini-batch 2 x grad_accum 4, 4 PPO epochs); a random policy's turns
run to --max-new-tokens and are invalid, so every episode takes --max-steps turns. Reported: per
stage its wall seconds and the device allocator's high-water mark after it (GB since the process
started; GPU/TPU only); per PPO iteration its phase times from metrics/ppo_spa.jsonl (rollout,
rewards, targets, update; the first iteration's include compilation) and peak_memory_gb; and the
STEADY STATE: the mean over iterations 2.. of each phase's seconds, tokens and tokens/s against its
ceiling measured in the same process (bench/model_bench.py): the rollout's generated tokens against
batched decode at --num-envs rows; targets and update in training-step-equivalent tokens (targets:
the batch's tokens once, its three forward passes, old policy, reference and critic, cost about
one forward + backward; update: the batch's tokens x ppo_epochs x 2, policy and critic each trained
on every token) against the training step (forward + backward + AdamW, batch 8 x 1024).
--decode-attention ragged: the rollouts' prefill and decode (and the decode ceiling's) read each row's
filled KV-cache slots only (model.decode_attention; default dense, every slot of agent.max_context). A
finished stage's Orbax checkpoints (resume points) are deleted to bound the disk. Progress goes to
stderr; $OUT/ppo_bench.json is rewritten after every stage when $OUT is set (a run cut short keeps
what it measured); a section is appended to bench/RESULTS.md unless --no-results; ONE JSON line
ends stdout.
"""

import argparse
import datetime
import json
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import jax
from flax import nnx

import model_bench
from spa_jax import configuration, pipeline, tracking
from spa_jax.models import Llama, LlamaConfig
from spa_jax.stages import common
from spa_jax.workspace import Workspace

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "RESULTS.md"
SHAPE = "llama3.2-3b"
PHASES = ("rollout", "rewards", "targets", "update")
ITERATION_KEYS = ("trajectories", "score", "mean_steps", "policy_loss", "value_loss", "kl", "generated_tokens",
                  "batch_tokens", "padded_tokens", "targets_tokens", "update_tokens")
LLAMA3_VOCAB = 128_256


def overrides(args) -> dict:
  """Config path -> value: the 3B shape (unless --quick), dtypes, LoRA, env, small stages, PPO."""
  three_b = LlamaConfig.preset(SHAPE)
  shape = {} if args.quick else {f"model.arch.{name}": getattr(three_b, name)
                                 for name in configuration.load_config("ppo").model.arch}
  real_prompt = {} if args.quick else {"model.arch.vocab_size": LLAMA3_VOCAB, "agent.one_shot": True}
  return {**shape, **real_prompt,
          "model.dtype": "bfloat16", "model.param_dtype": "bfloat16", "model.decode_attention": args.decode_attention,
          "sft.finetune": "lora", "prm.finetune": "lora", "ppo.finetune": "lora",
          "env.num_envs": args.num_envs, "env.pool_workers": args.workers, "env.search_backend": "bm25",
          "env.max_steps": args.max_steps,
          "sft.expert_episodes": 16, "sft.epochs": 1,
          "explore.max_tasks": 16, "explore.samples_per_task": 2, "explore.max_new_tokens": args.max_new_tokens,
          "prm.epochs": 1,
          "ppo.iterations": args.iterations, "ppo.rollouts_per_iteration": args.num_envs,
          "ppo.reward_modes": "spa", "ppo.max_new_tokens": args.max_new_tokens,
          "ppo.mini_batch_size": 2, "ppo.grad_accum": 4, "ppo.ppo_epochs": 4,
          "tracking.tensorboard": False, "tracking.progress": False, "run.targets": "ppo"}


def bench_config(settings: dict, workspace: pathlib.Path):
  cfg = configuration.load_config("ppo", "tiny")
  cfg.update_from_flattened_dict(settings)
  cfg.workspace = str(workspace)
  return configuration.validate(cfg)


def run_stage(cfg, ws: Workspace, stage: str) -> dict:
  """Runs one stage through the pipeline; its wall seconds and the memory high-water mark after it."""
  cfg.run.targets = stage
  summary = pipeline.run_pipeline(cfg, ws)[stage]
  shutil.rmtree(ws.checkpoint_dir(stage), ignore_errors=True)
  return {"stage": stage, "seconds": round(summary["seconds"], 1), "peak_memory_gb": _round(tracking.peak_memory_gb())}


def ppo_iterations(ws: Workspace) -> list[dict]:
  """Phase times, peak memory and a few results of each PPO iteration (metrics/ppo_spa.jsonl)."""
  measured = (*(f"time_{phase}_s" for phase in PHASES), "peak_memory_gb")
  return [{"iteration": row["step"], **{key: _round(row[key]) for key in measured if key in row},
           **{key: row[key] for key in ITERATION_KEYS if key in row}}
          for row in tracking.read_metrics(ws.metrics_path("ppo_spa"))]


def steady_state(iterations: list[dict], ppo_epochs: int, ceilings: dict) -> list[dict]:
  """Per phase: mean seconds and tokens over iterations 2.. (compilation is in the first), tokens/s
  and its fraction of the phase's ceiling (see the module doc for what a phase's tokens are)."""
  steady = iterations[1:]
  if not steady:
    return []
  tokens = {"rollout": lambda it: it.get("generated_tokens"), "targets": lambda it: it.get("batch_tokens"),
            "update": lambda it: 2 * ppo_epochs * it["batch_tokens"] if "batch_tokens" in it else None}
  ceiling = {"rollout": ceilings.get("decode_tok_s"), "targets": ceilings.get("train_tok_s"),
             "update": ceilings.get("train_tok_s")}
  rows = []
  for phase in PHASES:
    seconds = sum(it[f"time_{phase}_s"] for it in steady) / len(steady)
    row = {"phase": phase, "seconds": _round(seconds)}
    if phase in tokens and all(tokens[phase](it) is not None for it in steady):
      count = sum(tokens[phase](it) for it in steady) / len(steady)
      row |= {"tokens": round(count), "tok_s": _round(count / seconds)}
      if ceiling[phase]:
        row |= {"ceiling_tok_s": _round(ceiling[phase]), "fraction": _round(count / seconds / ceiling[phase])}
    rows.append(row)
  rows.append({"phase": "iteration", "seconds": _round(sum(r["seconds"] for r in rows))})
  return rows


def measure_ceilings(cfg, ws: Workspace, args) -> dict:
  """The training step's and batched decode's tokens/s for the benched model, in this process."""
  model_cfg = common.model_config(cfg, common.load_tokenizer(cfg, ws))
  mesh = common.make_mesh(cfg)
  seq, prompt = (64, 32) if args.quick else (1024, 1024)
  train = model_bench.bench_train(model_cfg, mesh, batch=8, seq=seq, steps=3)
  bandwidth = model_bench.copy_bandwidth_bytes_per_s(mesh)
  decode = model_bench.bench_decode(model_cfg, mesh, args.num_envs, prompt, args.max_new_tokens, bandwidth)
  return {"train_tok_s": train["tok_s"], "train_batch": f"8 x {seq}", "decode_tok_s": decode["new_tok_s"],
          "decode_batch": f"{args.num_envs} rows, prompt {prompt}, {args.max_new_tokens} new",
          "decode_fraction_of_roofline": decode["fraction_of_roofline"]}


def model_description(cfg, ws: Workspace, shape: str) -> dict:
  """The benched model: shape name, parameter count (without LoRA adapters), vocabulary, dtypes."""
  model_cfg = common.model_config(cfg, common.load_tokenizer(cfg, ws))
  params = nnx.state(nnx.eval_shape(lambda: Llama(model_cfg, rngs=nnx.Rngs(0))), nnx.Param)
  return {"shape": shape,
          "parameters": int(sum(x.size for x in jax.tree.leaves(params))),
          "vocab_size": model_cfg.vocab_size, "hidden_size": model_cfg.hidden_size,
          "num_layers": model_cfg.num_layers, "dtype": model_cfg.dtype, "param_dtype": model_cfg.param_dtype,
          "note": f"random init; a {model_cfg.vocab_size}-entry vocabulary, the tiny config's SentencePiece "
                  "tokenizer"}


def _round(value):
  return None if value is None else round(value, 3 if abs(value) < 100 else 1)


def _cell(value) -> str:
  return "n/a" if value is None else str(value)


def machine() -> str:
  device = jax.devices()[0]
  return (f"{platform.machine()}, {os.cpu_count()} CPU cores, {jax.default_backend()} "
          f"({getattr(device, 'device_kind', device.platform)}), jax {jax.__version__}")


def save_partial(result: dict) -> None:
  """$OUT/ppo_bench.json, rewritten after every stage."""
  if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "ppo_bench.json"), "w") as f:
      json.dump(result, f, indent=1)


def append_results(result: dict) -> None:
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()
  model = result["model"]
  lines = [f"\n## ppo_bench ({datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')})\n",
           f"- machine: {result['machine']}",
           f"- command: `python bench/ppo_bench.py {' '.join(sys.argv[1:])}`",
           f"- commit: {commit}; {model['shape']} shape, {model['parameters']:,} parameters "
           f"({model['note']}), {model['dtype']} activations and parameters, LoRA; "
           f"{result['num_envs']} envs, max_steps {result['max_steps']}, max_new_tokens {result['max_new_tokens']}, "
           f"bm25 search; peak memory = the device allocator's high-water mark since the process started\n",
           "| stage | seconds | peak memory GB |", "|---|---|---|"]
  lines += [f"| {s['stage']} | {s['seconds']} | {_cell(s['peak_memory_gb'])} |" for s in result["stages"]]
  lines.append(f"| total | {result['total_s']} | |")
  lines += ["", "| PPO iteration | trajectories | rollout s | rewards s | targets s | update s | peak memory GB |",
            "|---|---|---|---|---|---|---|"]
  lines += [f"| {it['iteration']} | {int(it['trajectories'])} | " + " | ".join(
      _cell(it.get(f"time_{phase}_s")) for phase in PHASES) + f" | {_cell(it.get('peak_memory_gb'))} |"
      for it in result["ppo_iterations"]]
  if result.get("steady_state"):
    c = result["ceilings"]
    lines += ["", f"Steady state (iterations 2..{len(result['ppo_iterations'])}); ceilings in the same process: "
              f"training step {c['train_tok_s']:.0f} tok/s ({c['train_batch']}), decode {c['decode_tok_s']:.0f} new "
              f"tok/s ({c['decode_batch']}; {c['decode_fraction_of_roofline']:.2f} of its roofline)", "",
              "| phase | seconds | tokens | tokens/s | ceiling tokens/s | fraction |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['phase']} | {r['seconds']} | {_cell(r.get('tokens'))} | {_cell(r.get('tok_s'))} | "
              f"{_cell(r.get('ceiling_tok_s'))} | {_cell(r.get('fraction'))} |" for r in result["steady_state"]]
  with RESULTS.open("a") as f:
    f.write("\n".join(lines) + "\n")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="tiny arch (no 3B shape), 8 envs, 2 pool workers")
  parser.add_argument("--num-envs", type=int, default=64, help="parallel episodes = PPO rollouts per iteration")
  parser.add_argument("--iterations", type=int, default=4, help="PPO iterations (the first one compiles)")
  parser.add_argument("--no-ceilings", action="store_true", help="skip the training-step and decode ceilings")
  parser.add_argument("--max-steps", type=int, default=5)
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--workers", type=int, default=8, help="EnvPool worker processes")
  parser.add_argument("--decode-attention", default="dense", choices=("dense", "ragged"),
                      help="model.decode_attention of the rollouts (and of the decode ceiling)")
  parser.add_argument("--workdir", default="", help="keep the workspace here (default: a temporary one, removed)")
  parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
  args = parser.parse_args()
  if args.quick:
    args.num_envs, args.workers = 8, 2
  logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s", force=True)
  logging.getLogger("absl").setLevel(logging.WARNING)  # orbax's INFO lines

  root = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="ppo_bench_"))
  settings = overrides(args)
  cfg = bench_config(settings, root)
  ws = Workspace(root)
  result = {"bench": "ppo", "quick": args.quick, "machine": machine(), "num_envs": args.num_envs,
            "max_steps": args.max_steps, "max_new_tokens": args.max_new_tokens,
            "settings": settings, "stages": [], "ppo_iterations": []}
  started = time.perf_counter()
  try:
    for stage in pipeline.plan(cfg, ws):
      result["stages"].append(run_stage(cfg, ws, stage))
      print(json.dumps(result["stages"][-1]), file=sys.stderr, flush=True)
      save_partial(result)
    result["total_s"] = round(time.perf_counter() - started, 1)
    result["ppo_iterations"] = ppo_iterations(ws)
    result["model"] = model_description(cfg, ws, "tiny" if args.quick else SHAPE)
    save_partial(result)
    if not args.no_ceilings:
      result["ceilings"] = measure_ceilings(cfg, ws, args)
      result["steady_state"] = steady_state(result["ppo_iterations"], cfg.ppo.ppo_epochs, result["ceilings"])
      save_partial(result)
  finally:
    if not args.workdir:
      shutil.rmtree(root, ignore_errors=True)
  if not args.no_results:
    append_results(result)
  print(json.dumps(result))


if __name__ == "__main__":
  main()
