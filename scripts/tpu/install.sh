#!/usr/bin/env bash
# Copies this checkout to every host of the slice and installs it there (a venv with jax[tpu]).
#   scripts/tpu/install.sh --name spa --zone us-east5-a [--project P]
# Your model weights (a local HF directory) and WebShop data are copied separately, or read from a
# bucket you mount; see README.md, "Cloud TPU VMs".
source "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/../.."
archive=$(mktemp /tmp/spa_jax.XXXX.tar.gz)
git archive --format=tar.gz -o "$archive" HEAD
gcloud compute tpus tpu-vm scp "$archive" "$NAME":/tmp/spa_jax.tar.gz "${GCLOUD_ARGS[@]}" --worker=all
rm -f "$archive"
# gcsfuse mounts the workspace bucket on every host (run.sh); Google's apt repository for it:
on_all_hosts 'command -v gcsfuse >/dev/null || { echo "deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -cs) main" | sudo tee /etc/apt/sources.list.d/gcsfuse.list \
  && curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null \
  && sudo apt-get update -q && sudo apt-get install -y -q gcsfuse; }'
on_all_hosts "set -e; mkdir -p $REPO_DIR && tar -xzf /tmp/spa_jax.tar.gz -C $REPO_DIR && cd $REPO_DIR \
  && python3 -m venv .venv && .venv/bin/pip install -q -U pip && .venv/bin/pip install -q 'jax[tpu]' \
  && bash scripts/install.sh && .venv/bin/python -c 'import jax; print(jax.process_index(), jax.device_count())'"
