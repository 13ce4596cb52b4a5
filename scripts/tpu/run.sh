#!/usr/bin/env bash
# Runs one stage on every host of the slice (one JAX process per host; jax.distributed initialises
# itself from the TPU metadata). The workspace must be a bucket path that every host can write.
#   scripts/tpu/run.sh --name spa --zone us-east5-a --bucket gs://my-bucket/runs/spa3b \
#       [--preset llama3.2-3b-tpu] [--stage ppo] [-- --config.model.hf_path=/mnt/llama-3.2-3b ...]
source "$(dirname "$0")/common.sh"
[ -n "$BUCKET" ] || { echo "--bucket gs://... is required (the shared workspace)" >&2; exit 2; }
PRESET=${PRESET:-llama3.2-3b-tpu}
on_all_hosts "cd $REPO_DIR && .venv/bin/python -m spa_jax.main --config=configs/$STAGE.py:$PRESET \
  --config.workspace=$BUCKET --config.distributed.initialize=always $EXTRA 2>&1 | tee -a ~/spa_jax_run.log"
