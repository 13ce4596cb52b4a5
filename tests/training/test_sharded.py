"""Sharded update steps on 8 forced CPU devices (a subprocess: the device count is fixed at start)."""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent


@pytest.mark.slow
def test_sharded_step_equals_single_device_and_restores_across_device_counts(tmp_path):
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
  result = subprocess.run([sys.executable, str(HERE / "sharded_equivalence.py"), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0 and "SHARDED_OK" in result.stdout, result.stderr[-5000:]
