#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) the wheels that the device machine's image lacks and
# bench/gpu_env.sh installs there: ml_collections, thefuzz, rapidfuzz (CPython 3.12, manylinux
# x86_64), gguf, tensorboardX. Run here (PyPI reachable), then carry .whl with the device call.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PY=${PYTHON:-.venv/bin/python}
$PY -m pip download -q --no-deps --only-binary :all: --dest .whl --python-version 3.12 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
  ml_collections thefuzz rapidfuzz gguf tensorboardX
ls -la .whl
