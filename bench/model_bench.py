"""Model throughput: a training step and batched decode of a Llama model with random weights.

    python bench/model_bench.py                      # Llama-3.2-3B shape, training + decode (GPU)
    python bench/model_bench.py --quick              # tiny preset, a few steps (CPU smoke run)
    python bench/model_bench.py --mesh fsdp=-1       # FSDP over every device (tensor=N for TP)

(a) Training step: forward + backward + AdamW (the project's own `make_sft_step`, loss on every
    token, as the PyTorch peer's `labels=input_ids`), batch 8 and 16 x 1024: tokens/s and MFU
    (6 * params * tokens/s against 790 TFLOP/s, the peer's definition).
(b) Decode: the project's `Sampler`, batch 64 and 256, prompt 512, 128 new tokens, greedy:
    new tokens/s, against the memory-bandwidth roofline: batch / (bytes read per decode step,
    weights + the KV cache of the average context, at the device copy bandwidth (read + write
    traffic) measured in the same process; the figure at 4.16 TB/s is reported beside it).
    --decode-slots 0,4096 sizes the KV cache to the context and past it (as agent.max_context does in
    rollouts) and --decode-attention dense,ragged compares the masked read of every slot with the
    Pallas kernel that reads each row's filled slots only (model.decode_attention), side by side.

Ends with one JSON line on stdout; with $OUT set, also writes $OUT/model_bench.json. Run
`../shared/bench/torch_baseline.py` in the same call for ratios.
"""

import argparse
import itertools
import json
import os
import statistics
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spa_jax.models.config import LlamaConfig
from spa_jax.models.llama import Llama
from spa_jax.rollout.generate import Sampler
from spa_jax.sharding import create_sharded, make_mesh
from spa_jax.training.global_batch import to_global_batch
from spa_jax.training.optim import OptimizerConfig, make_optimizer
from spa_jax.training.steps import make_sft_step
from spa_jax.training.train_state import create_train_state

PEAK_FLOPS = 790e12  # the peer baseline's MFU denominator (dense bf16, H200)


def parse_mesh(spec: str) -> dict[str, int]:
  sizes = {"data": 1, "fsdp": 1, "tensor": 1}
  for part in filter(None, spec.split(",")):
    name, value = part.split("=")
    if name not in sizes:
      raise SystemExit(f"--mesh: unknown axis {name!r}; use data=, fsdp=, tensor=")
    sizes[name] = int(value)
  if -1 not in sizes.values():
    sizes["data"] = -1 if sizes["fsdp"] * sizes["tensor"] == 1 else sizes["data"]
  return sizes


def timed(fn, repeats: int, warmup: int) -> float:
  """Median wall time of `fn()` (which must block until its result is ready)."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def log(message: str) -> None:
  print(f"[model_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def count_params(state) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))


def bench_train(cfg: LlamaConfig, mesh, batch: int, seq: int, steps: int) -> dict:
  model = create_sharded(lambda: Llama(cfg, rngs=nnx.Rngs(0)), mesh)
  n_params = count_params(nnx.state(model, nnx.Param))
  state = create_train_state(model, make_optimizer(OptimizerConfig(learning_rate=1e-5, grad_clip_norm=None)))
  del model
  rng = np.random.default_rng(0)
  local = {
      "tokens_bt": rng.integers(0, cfg.vocab_size, (batch, seq), dtype=np.int32),
      "positions_bt": np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq)).copy(),
      "loss_mask_bt": np.ones((batch, seq), np.float32),
  }
  with jax.set_mesh(mesh):
    step = make_sft_step(state)
    global_batch = to_global_batch(local, mesh)
    holder = {"state": state}

    def run():
      holder["state"], metrics = step(holder["state"], global_batch)
      jax.block_until_ready(metrics)

    compile_start = time.perf_counter()
    run()
    compile_s = time.perf_counter() - compile_start
    log(f"train batch {batch}: first step (compiles) {compile_s:.1f} s")
    step_s = timed(run, repeats=steps, warmup=1)
  tokens_per_s = batch * seq / step_s
  result = {
      "params": n_params, "step_s": step_s, "tok_s": tokens_per_s, "first_step_s": compile_s,
      "mfu_vs_790T": 6 * n_params * tokens_per_s / PEAK_FLOPS / jax.device_count(),
      "tok_s_per_device": tokens_per_s / jax.device_count(),
  }
  del holder, state
  return result


def copy_bandwidth_bytes_per_s(mesh) -> float:
  """Device copy bandwidth (bytes read + written per second) on a 2 GiB-per-device array."""
  per_device = (2 << 30) // 4 if jax.default_backend() != "cpu" else (64 << 20) // 4
  x = jax.device_put(jnp.ones((jax.device_count(), per_device), jnp.float32),
                     jax.sharding.NamedSharding(mesh, jax.P(("data", "fsdp", "tensor"))))
  copy = jax.jit(lambda a: a * 1.0001)
  seconds = timed(lambda: jax.block_until_ready(copy(x)), repeats=10, warmup=2)
  return 2 * x.nbytes / seconds


def abstract_graph(cfg: LlamaConfig) -> nnx.GraphDef:
  """`cfg`'s model graph, traced without parameters: one model's params serve every variant of it
  (decode attention, say) that keeps the parameter shapes."""
  return nnx.graphdef(nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0))))


def random_params(cfg: LlamaConfig, mesh):
  return nnx.state(create_sharded(lambda: Llama(cfg, rngs=nnx.Rngs(0)), mesh))


def bench_decode(cfg: LlamaConfig, mesh, batch: int, prompt: int, new_tokens: int, bandwidth: float,
                 slots: int = 0, params=None) -> dict:
  """Greedy decode of `new_tokens` after a `prompt`-token context in every row, with a KV cache of `slots`
  slots (0: prompt + new_tokens) and `cfg.decode_attention`, with `params` (unset: a random model's; a
  caller comparing several decodes passes one model's: on the GPU a fresh 3B model per comparison left
  about a minute between comparisons)."""
  graphdef = abstract_graph(cfg)
  params = random_params(cfg, mesh) if params is None else params
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  # Random weights: ids past the vocabulary's real range stand in for the end tokens, so that no
  # row stops early; the throughput counts the tokens actually generated.
  tokenizer = types.SimpleNamespace(vocab_size=cfg.vocab_size, pad_id=0, bos_id=1,
                                    eos_id=cfg.vocab_size - 1, end_of_turn_id=cfg.vocab_size - 2,
                                    decode=lambda ids: "")
  max_len = slots or prompt + new_tokens
  sampler = Sampler(graphdef, cfg, tokenizer, batch_size=batch, max_len=max_len,
                    length_buckets=(prompt,), mesh=mesh)
  rng = np.random.default_rng(1)
  prompts = rng.integers(100, cfg.vocab_size - 100, (batch, prompt)).tolist()
  with jax.set_mesh(mesh):
    def run():
      state = sampler.init_state()
      state = sampler.extend(params, state, list(range(batch)), prompts)
      jax.block_until_ready(state.cache.k)
      start = time.perf_counter()
      state, out = sampler.generate(params, state, [True] * batch, rng=jax.random.key(0),
                                    max_new_tokens=new_tokens, temperature=0.0)
      return time.perf_counter() - start, sum(len(t) for t in out.token_ids)

    compile_start = time.perf_counter()
    run()  # compile
    log(f"decode batch {batch}: first run (compiles) {time.perf_counter() - compile_start:.1f} s")
    runs = [run() for _ in range(3)]
    log(f"decode batch {batch}: runs {[round(s, 3) for s, _ in runs]} s")
  seconds, generated = sorted(runs)[1]
  kv_bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(sampler.cache_dtype).itemsize
  mean_context = prompt + new_tokens / 2
  bytes_per_step_ideal = weight_bytes + batch * mean_context * kv_bytes_per_token
  bytes_per_step_dense = weight_bytes + batch * max_len * kv_bytes_per_token
  roofline = batch * bandwidth / bytes_per_step_ideal  # a decode step's traffic at copy speed
  new_tok_s = generated / seconds
  return {
      "s": seconds, "new_tok_s": new_tok_s, "generated": generated,
      "roofline_tok_s": roofline, "fraction_of_roofline": new_tok_s / roofline,
      "roofline_dense_cache_tok_s": batch * bandwidth / bytes_per_step_dense,
      "roofline_at_4.16TBps_tok_s": batch * 4.16e12 / bytes_per_step_ideal,
      "weights_GB": weight_bytes / 1e9, "kv_GB_mean_context": batch * mean_context * kv_bytes_per_token / 1e9,
      "cache_slots": max_len, "decode_attention": cfg.decode_attention,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="tiny preset, small shapes (CPU smoke run)")
  parser.add_argument("--preset", default=None, help="model preset (default llama3.2-3b; tiny with --quick)")
  parser.add_argument("--mesh", default="", help="e.g. fsdp=-1 or fsdp=4,tensor=2 (default: data over all)")
  parser.add_argument("--skip-train", action="store_true")
  parser.add_argument("--skip-decode", action="store_true")
  parser.add_argument("--train-batches", default="8,16")
  parser.add_argument("--decode-batches", default="64,256")
  parser.add_argument("--decode-slots", default="0",
                      help="comma-separated KV cache slots per row to compare (0: prompt + new tokens; e.g. 0,4096)")
  parser.add_argument("--decode-attention", default="dense",
                      help="comma-separated model.decode_attention values to compare (dense, ragged)")
  parser.add_argument("--remat", default=None, help="remat policy override (e.g. none, full)")
  parser.add_argument("--unrolled", action="store_true",
                      help="train with the layer stack unrolled (model.scan_layers=False; default: scanned)")
  args = parser.parse_args()

  preset = args.preset or ("tiny" if args.quick else "llama3.2-3b")
  overrides = {"scan_layers": not args.unrolled} | ({} if args.remat is None else {"remat_policy": args.remat})
  cfg = LlamaConfig.preset(preset, **overrides)
  mesh = make_mesh(**parse_mesh(args.mesh))
  seq, prompt, new_tokens, steps = (64, 32, 16, 3) if args.quick else (1024, 512, 128, 5)
  result = {"bench": "model", "preset": preset, "backend": jax.default_backend(),
            "devices": jax.device_count(), "device_kind": jax.devices()[0].device_kind,
            "mesh": dict(mesh.shape), "scan_layers": cfg.scan_layers, "jax": jax.__version__}
  if not args.skip_train:
    for batch in map(int, args.train_batches.split(",")):
      batch = max(batch, mesh.shape["data"] * mesh.shape["fsdp"])
      try:
        result[f"train_B{batch}_T{seq}"] = bench_train(cfg, mesh, batch, seq, steps)
      except Exception as error:  # noqa: BLE001  (an OOM at one size should not lose the others)
        result[f"train_B{batch}_T{seq}"] = f"failed: {type(error).__name__}: {str(error)[:300]}"
      print(json.dumps(result), flush=True)
  if not args.skip_decode:
    bandwidth = copy_bandwidth_bytes_per_s(mesh)
    result["copy_TBps"] = bandwidth / 1e12
    params = random_params(cfg, mesh)
    for batch in map(int, args.decode_batches.split(",")):
      batch = 4 if args.quick else batch
      for slots, attention in itertools.product(map(int, args.decode_slots.split(",")), args.decode_attention.split(",")):
        key = f"decode_B{batch}_P{prompt}_N{new_tokens}" + (f"_S{slots}" if slots else "")
        key += "" if attention == "dense" else f"_{attention}"
        try:
          result[key] = bench_decode(cfg.replace(decode_attention=attention), mesh, batch, prompt, new_tokens,
                                     bandwidth, slots, params=params)
        except Exception as error:  # noqa: BLE001
          result[key] = f"failed: {type(error).__name__}: {str(error)[:300]}"
        print(json.dumps(result), flush=True)
      if args.quick:
        break
  if jax.default_backend() == "gpu":
    stats = jax.devices()[0].memory_stats() or {}
    result["peak_GB"] = stats.get("peak_bytes_in_use", 0) / 1e9
  if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "model_bench.json"), "w") as f:
      json.dump(result, f, indent=1)
  print(json.dumps(result))


if __name__ == "__main__":
  main()
