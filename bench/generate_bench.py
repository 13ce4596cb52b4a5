"""Multi-turn generation micro-benchmark: persistent per-row KV cache vs re-encoding the history.

    .venv/bin/python bench/generate_bench.py [--preset tiny] [--batch 8] [--turns 4]

Each of `turns` agent turns appends an observation of `--obs` tokens and greedily decodes
`--new` tokens (random weights; end tokens are ids the model cannot emit, so every row decodes the
full length). "persistent" extends each row's cache with the new observation only; "reencode"
resets the rows and prefills the whole history every turn. Compilation is excluded (one warm-up
episode). Ends with one JSON line.
"""

import argparse
import json
import time
import types

import jax
import numpy as np
from flax import nnx

from spa_jax.models.config import LlamaConfig
from spa_jax.models.llama import Llama
from spa_jax.rollout.generate import Sampler


def run_episode(sampler, params, prompts, observations, new_tokens, reencode: bool) -> tuple[float, int]:
    """(seconds, generated tokens) of one multi-turn episode on every row."""
    batch = sampler.batch_size
    rows = list(range(batch))
    histories = [list(p) for p in prompts]
    start = time.perf_counter()
    state = sampler.extend(params, sampler.init_state(), rows, histories)
    generated = 0
    for turn, observation in enumerate(observations):
        if turn:
            histories = [h + observation for h in histories]
            if reencode:
                state = sampler.extend(params, sampler.reset_rows(state, rows), rows, histories)
            else:
                state = sampler.extend(params, state, rows, [observation] * batch)
        state, out = sampler.generate(
            params, state, [True] * batch, rng=jax.random.key(turn), max_new_tokens=new_tokens
        )
        histories = [h + t for h, t in zip(histories, out.token_ids)]
        generated += sum(map(len, out.token_ids))
    return time.perf_counter() - start, generated


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--obs", type=int, default=64)
    parser.add_argument("--new", type=int, default=32)
    args = parser.parse_args()

    cfg = LlamaConfig.preset(args.preset)
    graphdef, params = nnx.split(Llama(cfg, rngs=nnx.Rngs(0)))
    tokenizer = types.SimpleNamespace(
        vocab_size=cfg.vocab_size, pad_id=0, eos_id=cfg.vocab_size - 1, end_of_turn_id=cfg.vocab_size - 2,
        decode=lambda ids: "",
    )
    max_len = args.prompt + args.turns * (args.obs + args.new)
    sampler = Sampler(graphdef, cfg, tokenizer, batch_size=args.batch, max_len=max_len,
                      length_buckets=(args.obs, args.prompt, 256))
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, cfg.vocab_size - 2, (args.batch, args.prompt)).tolist()
    observations = rng.integers(1, cfg.vocab_size - 2, (args.turns, args.obs)).tolist()
    result = {"bench": "generate_multi_turn", "preset": args.preset, "backend": jax.default_backend(),
              "batch": args.batch, "turns": args.turns, "prompt": args.prompt, "obs": args.obs, "new": args.new}
    for mode in ("persistent", "reencode"):
        run_episode(sampler, params, prompts, observations, args.new, reencode=mode == "reencode")  # compile
        seconds, generated = min(
            run_episode(sampler, params, prompts, observations, args.new, reencode=mode == "reencode")
            for _ in range(3)
        )
        result[f"{mode}_s"] = round(seconds, 4)
        result[f"{mode}_new_tok_s"] = round(generated / seconds, 1)
    result["speedup"] = round(result["reencode_s"] / result["persistent_s"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
