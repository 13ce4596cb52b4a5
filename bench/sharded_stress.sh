#!/usr/bin/env bash
# Repeats tests/training/sharded_equivalence.py (sharded SFT and PPO updates against one device, a checkpoint
# moved from 8 devices to 1) on 8 forced host devices RUNS times and counts the runs that fail: XLA:CPU runs
# independent collectives of one program concurrently, so an update whose collectives are not ordered by data
# deadlocks only now and then (a rendezvous timeout aborts the process). Run from the repository root:
#
#   bash bench/sharded_stress.sh              # 30 runs
#   RUNS=100 bash bench/sharded_stress.sh
#
# Each failing run's log stays in $LOGS (default /tmp/sharded_stress); the last line is "failed F of N runs".
set -uo pipefail
RUNS=${RUNS:-30} LOGS=${LOGS:-/tmp/sharded_stress}
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
mkdir -p "$LOGS"
failed=0
for run in $(seq 1 "$RUNS"); do
  workdir=$(mktemp -d)
  if PYTHONPATH="$PWD/tests/training${PYTHONPATH:+:$PYTHONPATH}" JAX_PLATFORMS=cpu \
     XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=8 --xla_cpu_collective_timeout_seconds=20" \
     timeout 300 "$PYTHON" tests/training/sharded_equivalence.py "$workdir" > "$LOGS/run_$run.log" 2>&1 &&
     grep -q SHARDED_OK "$LOGS/run_$run.log"; then
    rm "$LOGS/run_$run.log"
  else
    failed=$((failed + 1)); echo "run $run failed: $LOGS/run_$run.log" >&2
  fi
  rm -rf "$workdir"
  echo "$(date -u +%H:%M:%S) run $run of $RUNS: $failed failed so far" >&2
done
echo "failed $failed of $RUNS runs"
