#!/usr/bin/env bash
# Deletes the slice (billing stops).   scripts/tpu/delete.sh --name spa --zone us-east5-a
source "$(dirname "$0")/common.sh"
gcloud compute tpus tpu-vm delete "$NAME" "${GCLOUD_ARGS[@]}" --quiet
