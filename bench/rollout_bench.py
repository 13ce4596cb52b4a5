"""Exploration throughput: batched episodes (Sampler x EnvPool) of a random-weight policy.

    .venv/bin/python bench/rollout_bench.py --quick                      # tiny model, CPU
    python bench/rollout_bench.py --preset llama3.2-3b --num-envs 64,256 --search-backend bm25   # GPU

Per pool size: episodes/s, generated tokens/s, env steps/s and the share of wall time spent in
generation (Sampler.extend: prefilling prompts and observations, + generate: decoding) vs the env
(EnvPool.reset + step). Random weights: every turn decodes the full --max-new-tokens (no stop
fires) and acts invalidly, so every episode runs --max-steps turns: the generation-heaviest case.
Compilation is excluded (a warm-up round runs first). Each pool size runs with the shared prompt
prefix (its keys/values prefilled once and copied into each new episode's row) and without it
(every row prefills the whole prompt), side by side;
--decode-attention dense,ragged also runs each with both decode attentions (model.decode_attention:
the masked read of all --max-context slots, or the Pallas kernel reading each row's filled slots).
Each pool size's ceiling is measured in the same process (unless --no-ceilings): pure batched
decode (bench/model_bench.py) at as many rows, a --ceiling-prompt-token context and --max-new-tokens
new tokens; each row's generated tokens/s is reported as a fraction of it. The tokenizer is the
SentencePiece one trained on the embedded catalogue; real presets keep their full vocabulary.
Prints progress to stderr, appends a section to bench/RESULTS.md and ends with ONE JSON line on stdout.
"""

import argparse
import collections
import datetime
import functools
import gc
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import jax
from flax import nnx

import model_bench
from spa_jax import configuration
from spa_jax.models import Llama, LlamaConfig
from spa_jax.rollout import episodes
from spa_jax.sharding import create_sharded
from spa_jax.stages import common
from spa_jax.workspace import Workspace

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "RESULTS.md"


class Stopwatch:
  """Accumulated wall seconds and call counts of wrapped methods, by label."""

  def __init__(self):
    self.seconds = collections.defaultdict(float)
    self.env_steps = 0

  def wrap(self, obj, label: str, *methods: str, wait=None) -> None:
    """Times `methods` of `obj` under `label`; `wait(result)` blocks until the device work the call
    dispatched is done (JAX returns before it is, and the next blocking call would be charged)."""
    for name in methods:
      original = getattr(obj, name)

      @functools.wraps(original)
      def timed(*args, _original=original, **kwargs):
        start = time.perf_counter()
        try:
          result = _original(*args, **kwargs)
          if wait is not None:
            wait(result)
          return result
        finally:
          self.seconds[label] += time.perf_counter() - start

      setattr(obj, name, timed)

  def count_steps(self, pool) -> None:
    step = pool.step

    def counted(actions):
      self.env_steps += sum(a is not None for a in actions)
      return step(actions)

    pool.step = counted


def bench_config(args) -> "configuration.ml_collections.ConfigDict":
  cfg = configuration.load_config("explore")
  cfg.env.max_steps = args.max_steps
  cfg.agent.max_context = args.max_context
  cfg.env.pool_workers = args.workers
  cfg.env.search_backend = args.search_backend
  cfg.agent.one_shot = args.one_shot
  cfg.tracking.progress = False
  return cfg


def build_policy(args, cfg, tokenizer):
  if args.preset == "tiny":
    model_cfg = common.model_config(cfg, tokenizer)
  else:
    model_cfg = LlamaConfig.preset(args.preset, dtype="bfloat16", param_dtype="bfloat16")
  model = create_sharded(lambda: Llama(model_cfg, rngs=nnx.Rngs(0)))
  return model_cfg, model


def decode_variant(model_cfg: LlamaConfig, attention: str) -> tuple[LlamaConfig, nnx.GraphDef]:
  """The model config and graph with `attention` as decode attention (the parameters are the same)."""
  variant_cfg = model_cfg.replace(decode_attention=attention)
  return variant_cfg, model_bench.abstract_graph(variant_cfg)


def measure(args, cfg, tokenizer, model_cfg, graphdef, params, num_envs: int, share_prefix: bool) -> dict:
  tasks = common.split_tasks(cfg, cfg.env.train_split, None)
  sampler = common.make_sampler(cfg, model_cfg, graphdef, tokenizer, mesh=None, batch_size=num_envs)
  run = functools.partial(episodes.run_episodes, sampler, params, tokenizer=tokenizer, temperature=1.0,
                          top_p=1.0, max_new_tokens=args.max_new_tokens, on_trajectory=lambda r: None,
                          one_shot=cfg.agent.one_shot, show_progress=False, share_prefix=share_prefix)
  with common.open_pool(cfg, num_envs) as pool:
    run(pool=pool, tasks=tasks[:num_envs], rng=jax.random.key(1))  # warm-up: compiles every shape
    watch = Stopwatch()
    watch.wrap(sampler, "extend", "extend", wait=lambda state: state.pending_b.block_until_ready())
    watch.wrap(sampler, "generate", "generate")
    watch.wrap(pool, "env", "reset", "step")
    watch.count_steps(pool)
    episodes_total = args.episodes_per_env * num_envs
    start = time.perf_counter()
    summary = run(pool=pool, tasks=tasks[num_envs:num_envs + episodes_total], rng=jax.random.key(2))
    seconds = time.perf_counter() - start
  return {
      "num_envs": num_envs, "shared_prefix": summary["prefix_tokens"], "decode_attention": model_cfg.decode_attention,
      "episodes": summary["episodes"], "seconds": round(seconds, 2),
      "episodes_per_s": round(summary["episodes"] / seconds, 3),
      "gen_tokens_per_s": round(summary["generated_tokens"] / seconds, 1),
      "env_steps_per_s": round(watch.env_steps / seconds, 1),
      "generation_share": round((watch.seconds["extend"] + watch.seconds["generate"]) / seconds, 3),
      "extend_share": round(watch.seconds["extend"] / seconds, 3),
      "env_share": round(watch.seconds["env"] / seconds, 3),
      "mean_steps": summary["mean_steps"],
  }


def append_results(args, results: list[dict], machine: str) -> None:
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()
  lines = [f"\n## rollout_bench ({datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')})\n",
           f"- machine: {machine}",
           f"- command: `python bench/rollout_bench.py {' '.join(sys.argv[1:])}`",
           f"- commit: {commit}; preset {args.preset}, random weights, max_new_tokens {args.max_new_tokens}, "
           f"max_steps {args.max_steps}, max_context {args.max_context}, search backend {args.search_backend or 'default'}, "
           f"one-shot prompt {args.one_shot}\n",
           "| envs | shared prefix (tokens) | decode attention | episodes | episodes/s | gen tokens/s | env steps/s | "
           "generation share (extend) | env share | pure decode tokens/s | fraction of decode |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  lines += [f"| {r['num_envs']} | {r['shared_prefix'] or 'off'} | {r['decode_attention']} | {r['episodes']} | "
            f"{r['episodes_per_s']} | "
            f"{r['gen_tokens_per_s']} | {r['env_steps_per_s']} | {r['generation_share']} ({r['extend_share']}) | {r['env_share']} | "
            f"{r.get('decode_tok_s', 'n/a')} | {r.get('fraction_of_decode', 'n/a')} |" for r in results]
  if any("decode_tok_s" in r for r in results):
    lines += ["", f"Pure decode: the same rows, a {args.ceiling_prompt}-token context, {args.max_new_tokens} new "
              "tokens, greedy, dense attention over a cache of just those slots, in this process "
              "(bench/model_bench.py's bench_decode)."]
  pairs = [(on, off) for on in results for off in results
           if on["num_envs"] == off["num_envs"] and on["decode_attention"] == off["decode_attention"]
           and on["shared_prefix"] and not off["shared_prefix"]]
  if pairs:
    lines += ["", "Shared prefix on / off, generated tokens/s: " + ", ".join(
        f"{on['num_envs']} envs ({on['decode_attention']}) {on['gen_tokens_per_s'] / off['gen_tokens_per_s']:.2f}x"
        for on, off in pairs)]
  if not RESULTS.exists():
    RESULTS.write_text("# Benchmark results\n\nAppend-only: one section per run (date, machine, command, results).\n")
  with RESULTS.open("a") as f:
    f.write("\n".join(lines) + "\n")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="8 envs, 2 episodes each, 4 steps, 32 tokens")
  parser.add_argument("--preset", default="tiny", help="tiny (configs' tiny arch) or a LlamaConfig preset")
  parser.add_argument("--num-envs", default="8", help="comma-separated pool sizes (= sampler rows)")
  parser.add_argument("--episodes-per-env", type=int, default=4)
  parser.add_argument("--max-steps", type=int, default=10)
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--max-context", type=int, default=2048, help="tokens per sampler row (KV cache length)")
  parser.add_argument("--workers", type=int, default=2, help="EnvPool worker processes")
  parser.add_argument("--search-backend", default="", help='"" (env default) or e.g. "bm25" (no Java)')
  parser.add_argument("--one-shot", action="store_true",
                      help="the real presets' prompt (instruction + demonstration, ~1.1k tokens; tiny: instruction only)")
  parser.add_argument("--prefix", choices=("both", "on", "off"), default="both",
                      help="run with the shared prompt prefix, without it, or both side by side")
  parser.add_argument("--decode-attention", default="dense",
                      help="comma-separated model.decode_attention values to run side by side (dense, ragged)")
  parser.add_argument("--no-ceilings", action="store_true", help="skip the pure-decode ceiling per pool size")
  parser.add_argument("--ceiling-prompt", type=int, default=1024, help="the pure-decode ceiling's context tokens")
  parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
  args = parser.parse_args()
  if args.quick:
    args.num_envs, args.episodes_per_env, args.max_steps, args.max_new_tokens = "8", 2, 4, 32
    args.ceiling_prompt = 32

  cfg = bench_config(args)
  cache = pathlib.Path(os.environ.get("SPA_JAX_BENCH_CACHE", pathlib.Path(tempfile.gettempdir()) / "spa_jax_bench"))
  tokenizer = common.load_tokenizer(cfg, Workspace(cache))
  model_cfg, model = build_policy(args, cfg, tokenizer)
  _, params = nnx.split(model)
  variants = [decode_variant(model_cfg, attention) for attention in args.decode_attention.split(",")]
  device = jax.devices()[0]
  machine = (f"{platform.machine()}, {os.cpu_count()} CPU cores, {jax.default_backend()} "
             f"({getattr(device, 'device_kind', device.platform)}), jax {jax.__version__}")
  mesh = common.make_mesh(cfg)
  bandwidth = None if args.no_ceilings else model_bench.copy_bandwidth_bytes_per_s(mesh)
  results = []
  for num_envs in [int(n) for n in args.num_envs.split(",")]:
    rows = [measure(args, cfg, tokenizer, variant_cfg, variant_graphdef, params, num_envs, share_prefix)
            for variant_cfg, variant_graphdef in variants
            for share_prefix in {"both": (True, False), "on": (True,), "off": (False,)}[args.prefix]]
    if bandwidth is not None:
      gc.collect()  # the rollouts' samplers (their KV caches) go before the ceiling's own
      decode = model_bench.bench_decode(model_cfg, mesh, num_envs, args.ceiling_prompt, args.max_new_tokens, bandwidth)
      for row in rows:
        row |= {"decode_tok_s": round(decode["new_tok_s"], 1),
                "fraction_of_decode": round(row["gen_tokens_per_s"] / decode["new_tok_s"], 3)}
    for row in rows:
      print(json.dumps(row), file=sys.stderr, flush=True)
    results += rows
  if not args.no_results:
    append_results(args, results, machine)
  print(json.dumps({"bench": "rollout", "preset": args.preset, "machine": machine,
                    "search_backend": args.search_backend or "default", "results": results}))


if __name__ == "__main__":
  main()
