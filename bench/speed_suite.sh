#!/usr/bin/env bash
# Issue 18's speed measurements on one GPU, each benchmark in the same process as its ceiling and
# every comparison side by side: (1) batched decode of the 3B shape with a KV cache sized to the
# context and one of CACHE slots, dense masked reads against the ragged Pallas kernel
# (bench/model_bench.py); (2) exploration with ENVS environments, the one-shot prompt, 10 steps and
# 64, 32 and 128 new tokens per turn, both decode attentions, against pure decode at as many rows
# (bench/rollout_bench.py); (3) ITERATIONS online PPO iterations of 64 episodes, steady state against
# the training-step and decode ceilings (bench/ppo_bench.py) with PPO_ATTENTION. Run from the
# repository root (on a GPU machine without a package index, `source bench/gpu_env.sh` first):
#
#   bash bench/speed_suite.sh                  # everything; JSON and logs under $ROOT (and $OUT when set)
#   STEPS="decode rollout" bash bench/speed_suite.sh
#   QUICK=1 bash bench/speed_suite.sh          # the tiny model, small sizes (a CPU smoke run)
#
# ROOT (default /tmp/speed); STEPS (default "decode rollout ppo"); CACHE (KV-cache slots per row,
# default 2048) and ENVS (default 256 where 125 GB are usable, else 128): 256 rows of 2,048 slots are
# 59 GB of bf16 cache, and a 512-token prefill chunk's dense attention holds float32 logits of
# rows x 24 heads x 512 x slots (26 GB), so 4,096 slots at 256 rows do not fit an H200;
# TOKENS (new tokens per turn of the rollout step, default "64 32 128"); ITERATIONS (default 4);
# PPO_ATTENTION (default dense); MEM_FRACTION (default 0.92 of the GPU memory for each process). The benchmarks do not append to bench/RESULTS.md here (--no-results): copy their
# tables there with the commit.
set -uo pipefail
ROOT=${ROOT:-/tmp/speed} STEPS=${STEPS:-decode rollout ppo} CACHE=${CACHE:-2048} ITERATIONS=${ITERATIONS:-4}
PPO_ATTENTION=${PPO_ATTENTION:-dense}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${MEM_FRACTION:-0.92}
if [ "${QUICK:-0}" = 1 ]; then
  DECODE=(--quick) ROLLOUT=(--num-envs 8 --episodes-per-env 1 --max-steps 3 --max-context 2048 --ceiling-prompt 128)
  PPO=(--quick --iterations "$ITERATIONS") TOKENS=${TOKENS:-16}
else
  if [ -z "${ENVS:-}" ]; then
    GB=$(python3 -c "import jax; print(int((jax.devices()[0].memory_stats() or {}).get('bytes_limit', 0) / 1e9))") || exit 1
    ENVS=$([ "$GB" -ge 125 ] && echo 256 || echo 128)
  fi
  echo "envs $ENVS, cache slots $CACHE" >&2
  DECODE=(--decode-batches "64,$ENVS" --decode-slots "0,$CACHE")
  ROLLOUT=(--preset llama3.2-3b --num-envs "$ENVS" --episodes-per-env 1 --max-steps 10 --max-context "$CACHE" --workers 8)
  PPO=(--num-envs 64 --iterations "$ITERATIONS" --workers 8) TOKENS=${TOKENS:-64 32 128}
fi
mkdir -p "$ROOT"
publish() { [ -n "${OUT:-}" ] && cp "$ROOT"/*.json "$ROOT"/*.log "$OUT"/ 2>/dev/null; true; }
for step in $STEPS; do
  echo "$(date -u +%H:%M:%S) $step" >&2
  case $step in
    decode)
      python3 bench/model_bench.py --skip-train --decode-attention dense,ragged "${DECODE[@]}" \
        2> "$ROOT/decode.log" | tail -1 > "$ROOT/decode.json" || echo "decode failed: $ROOT/decode.log" >&2 ;;
    rollout)
      for tokens in $TOKENS; do
        python3 bench/rollout_bench.py "${ROLLOUT[@]}" --max-new-tokens "$tokens" --one-shot --search-backend bm25 \
          --prefix on --decode-attention dense,ragged --no-results 2> "$ROOT/rollout_$tokens.log" \
          | tail -1 > "$ROOT/rollout_$tokens.json" || echo "rollout $tokens failed: $ROOT/rollout_$tokens.log" >&2
        publish
      done ;;
    ppo)
      OUT=${OUT:-$ROOT} python3 bench/ppo_bench.py "${PPO[@]}" --decode-attention "$PPO_ATTENTION" --no-results \
        2> "$ROOT/ppo.log" | tail -1 > "$ROOT/ppo.json" || echo "ppo failed: $ROOT/ppo.log" >&2 ;;
    *) echo "unknown step $step (decode, rollout, ppo)" >&2; exit 2 ;;
  esac
  publish
done
echo "$(date -u +%H:%M:%S) done" >&2
