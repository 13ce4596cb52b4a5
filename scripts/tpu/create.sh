#!/usr/bin/env bash
# Creates a Cloud TPU VM slice.
#   scripts/tpu/create.sh --name spa --zone us-east5-a --accelerator-type v5p-16 [--project P] [--version V]
# --version defaults to the runtime for the accelerator family (v5e: v2-alpha-tpuv5-lite,
# v5p: v2-alpha-tpuv5, v6e: v2-alpha-tpuv6e, others: tpu-ubuntu2204-base).
source "$(dirname "$0")/common.sh"
[ -n "$ACCEL" ] || { echo "--accelerator-type is required (e.g. v5litepod-16, v5p-16, v6e-16)" >&2; exit 2; }
if [ -z "$VERSION" ]; then
  case "$ACCEL" in
    v5litepod-*|v5e-*) VERSION=v2-alpha-tpuv5-lite;;
    v5p-*) VERSION=v2-alpha-tpuv5;;
    v6e-*) VERSION=v2-alpha-tpuv6e;;
    *) VERSION=tpu-ubuntu2204-base;;
  esac
fi
gcloud compute tpus tpu-vm create "$NAME" "${GCLOUD_ARGS[@]}" --accelerator-type="$ACCEL" --version="$VERSION"
gcloud compute tpus tpu-vm describe "$NAME" "${GCLOUD_ARGS[@]}" --format='value(state,acceleratorType)'
