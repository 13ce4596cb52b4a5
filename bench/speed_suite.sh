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
# ROOT (default /tmp/speed); STEPS (default "decode rollout ppo"); CACHE (default 4096, the pretrained
# presets' agent.max_context); ENVS (default 256; on a GPU under 100 GB, 128: 256 rows of 4,096 slots
# are 117 GB of bf16 cache); ITERATIONS (default 4); PPO_ATTENTION (default dense). The benchmarks
# do not append to bench/RESULTS.md here (--no-results): copy their tables there with the commit.
set -uo pipefail
ROOT=${ROOT:-/tmp/speed} STEPS=${STEPS:-decode rollout ppo} CACHE=${CACHE:-4096} ITERATIONS=${ITERATIONS:-4}
PPO_ATTENTION=${PPO_ATTENTION:-dense}
if [ "${QUICK:-0}" = 1 ]; then
  DECODE=(--quick) ROLLOUT=(--num-envs 8 --episodes-per-env 1 --max-steps 3 --max-context 2048 --ceiling-prompt 128)
  PPO=(--quick --iterations "$ITERATIONS") TOKENS="16"
else
  if [ -z "${ENVS:-}" ]; then
    GB=$(python3 -c "import jax; print(int((jax.devices()[0].memory_stats() or {}).get('bytes_limit', 0) / 1e9))") || exit 1
    ENVS=$([ "$GB" -ge 100 ] && echo 256 || echo 128)
  fi
  DECODE=(--decode-batches "64,$ENVS" --decode-slots "0,$CACHE")
  ROLLOUT=(--preset llama3.2-3b --num-envs "$ENVS" --episodes-per-env 1 --max-steps 10 --max-context "$CACHE" --workers 8)
  PPO=(--num-envs 64 --iterations "$ITERATIONS" --workers 8) TOKENS="64 32 128"
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
