#!/usr/bin/env bash
# Copies a run's workspace (reports, metrics, plots, trajectories, checkpoints)
# from its bucket to ./runs/<name>.
#   scripts/tpu/fetch_results.sh --name spa --zone us-east5-a --bucket gs://my-bucket/runs/spa3b
source "$(dirname "$0")/common.sh"
[ -n "$BUCKET" ] || { echo "--bucket is required" >&2; exit 2; }
mkdir -p "runs/$NAME"
gcloud storage cp -r "$BUCKET/*" "runs/$NAME/"
echo "results in runs/$NAME"
