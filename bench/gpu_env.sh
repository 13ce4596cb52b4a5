# Source on a GPU machine without a package index, from the repository root, before running bench
# scripts there: installs the wheels carried in .whl/ (packages the GPU image lacks: ml_collections,
# thefuzz, rapidfuzz, gguf, tensorboardX; bench/gpu_wheels.sh downloads them) into /tmp/site and puts
# them, this checkout and the webshop package on PYTHONPATH; processes share the GPU (no preallocation).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/envs/webshop XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
