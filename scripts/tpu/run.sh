#!/usr/bin/env bash
# Runs one stage on every host of the slice (one JAX process per host; jax.distributed initialises
# itself from the TPU metadata). All hosts share one workspace: the bucket is mounted with gcsfuse
# at ~/spa_ws on every host (install.sh installs gcsfuse) and gs://BUCKET/PREFIX becomes
# ~/spa_ws/PREFIX, an ordinary folder to the workspace code and to Orbax.
#   scripts/tpu/run.sh --name spa --zone us-east5-a --bucket gs://my-bucket/runs/spa3b \
#       [--preset llama3.2-3b-tpu] [--stage ppo] [-- --config.model.hf_path=/mnt/llama-3.2-3b ...]
source "$(dirname "$0")/common.sh"
[[ "$BUCKET" == gs://*/* ]] || { echo "--bucket gs://BUCKET/PREFIX is required (the shared workspace)" >&2; exit 2; }
PRESET=${PRESET:-llama3.2-3b-tpu}
path=${BUCKET#gs://}; bucket_name=${path%%/*}; prefix=${path#*/}
on_all_hosts "mkdir -p ~/spa_ws && (mountpoint -q ~/spa_ws || gcsfuse --implicit-dirs $bucket_name ~/spa_ws) \
  && cd $REPO_DIR && .venv/bin/python -m spa_jax.main --config=configs/$STAGE.py:$PRESET \
  --config.workspace=\$HOME/spa_ws/$prefix --config.distributed.initialize=always $EXTRA 2>&1 | tee -a ~/spa_jax_run.log"
