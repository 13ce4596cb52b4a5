"""The pretrained preset end to end, shortened (no one-shot demo and full remat keep the CPU SFT step
in a few GB): `--config=configs/eval.py:smollm2-135m` imports the
wheel's GGUF (here: the session's cached import), fine-tunes SmolLM2 on expert demonstrations and
evaluates it greedily on the embedded catalogue."""

import json
import os
import subprocess
import sys

import pytest

from spa_jax import configuration
from spa_jax.workspace import Workspace

REPO = configuration.CONFIGS_DIR.parent
SHORT = {
    "eval.policies": "sft", "eval.max_tasks": 1, "eval.max_new_tokens": 24, "env.max_steps": 6,
    "sft.expert_episodes": 2, "sft.epochs": 1, "sft.batch_size": 2, "sft.micro_batch_size": 1,
    "model.dtype": "float32", "model.remat_policy": "full", "agent.one_shot": False, "env.search_backend": "bm25", "env.num_envs": 1, "env.pool_workers": 1,
    "tracking.progress": False,
}


@pytest.mark.slow
def test_smollm2_preset_fine_tunes_and_evaluates(tmp_path, gguf_cache, smollm2_dir):
  result = subprocess.run(
      [sys.executable, "-m", "spa_jax.main", "--config=configs/eval.py:smollm2-135m", f"--workdir={tmp_path}",
       *(f"--config.{path}={value}" for path, value in SHORT.items())],
      cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu", "SPA_JAX_CACHE": str(gguf_cache)},
      capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-4000:]
  ws = Workspace(tmp_path)
  assert json.loads((tmp_path / "config.json").read_text())["model"]["hf_path"] == str(smollm2_dir)
  assert json.loads((tmp_path / "policies" / "sft" / "config.json").read_text())["vocab_size"] == 49152
  sft = [json.loads(line) for line in ws.metrics_path("sft").read_text().splitlines()]
  assert sft and all(row["loss"] > 0 for row in sft if "loss" in row)
  report = json.loads(ws.report_path("eval").read_text())
  assert report["policies"]["sft"]["episodes"] == 1
  assert "Evaluation on test" in result.stdout


def test_missing_gguf_file_fails_before_any_work(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "spa_jax.main", "--config=configs/eval.py:smollm2-135m", f"--workdir={tmp_path / 'ws'}",
       f"--config.model.gguf={tmp_path / 'absent.gguf'}"],
      cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  assert "config.model.gguf" in result.stderr and "no such file" in result.stderr
  assert not (tmp_path / "ws").exists()
