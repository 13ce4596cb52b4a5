"""bench/compile_bench.py's reading of its child runs: medians over rounds, each variant against the first."""

import pathlib
import sys
import types

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))
import compile_bench  # noqa: E402


def _run(variant: str, lower: float, compile_s: float, step: float, loss: float = 1.0) -> dict:
  return {"program": "sft", "variant": variant, "lower_s": lower, "compile_s": compile_s, "first_call_s": 1.0,
          "step_s": step, "temp_GB": 0.5, "loss": loss, "backend": "gpu", "device": "H100"}


def test_every_variant_is_read_against_the_first_listed_from_median_rounds():
  runs = [_run("scanned", 2.0, 20.0, 0.20), _run("scanned", 2.0, 24.0, 0.22), _run("scanned", 2.0, 30.0, 0.21),
          _run("scanned_autotune0", 2.0, 9.0, 0.25, loss=1.0001), _run("scanned_autotune0", 2.0, 10.0, 0.26, loss=1.0001),
          _run("scanned_autotune0", 2.0, 11.0, 0.24, loss=1.0001)]
  summary = compile_bench.summarize(runs, ["sft"], ["scanned", "scanned_autotune0"])
  assert summary["baseline"] == "scanned" and summary["sft"]["scanned"]["compile_s"] == 24.0  # median of 3 rounds
  against = summary["sft"]["against_baseline"]["scanned_autotune0"]
  assert against["compile_speedup"] == pytest.approx((2.0 + 24.0) / (2.0 + 10.0))
  assert against["step_time_ratio"] == pytest.approx(0.25 / 0.21)  # > 1: the variant's step is slower
  assert against["loss_difference"] == pytest.approx(1e-4)
  table = compile_bench.markdown(summary, types.SimpleNamespace(preset="smollm2-135m", seq=1536, rounds=3, steps=10,
                                                                programs="sft", variants="scanned,scanned_autotune0"))
  assert "scanned_autotune0 compiles **2.17x as fast** as scanned" in table
  assert "step time scanned_autotune0 / scanned **1.190**" in table


def test_a_variant_child_runs_scanned_with_its_xla_flags_added_to_the_callers(monkeypatch):
  seen = {}

  def fake_run(command, env, **kwargs):
    seen.update(command=command, env=env)
    return types.SimpleNamespace(stdout='{"lower_s": 1, "compile_s": 2, "step_s": 0.1, "loss": 1.0}\n')

  monkeypatch.setattr(compile_bench.subprocess, "run", fake_run)
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
  args = types.SimpleNamespace(preset="smollm2-135m", seq=128, steps=2)
  compile_bench.measure(args, "sft", "scanned_autotune0")
  assert "--scan" in seen["command"] and seen["env"]["JAX_ENABLE_COMPILATION_CACHE"] == "false"
  assert seen["env"]["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2 --xla_gpu_autotune_level=0"
  compile_bench.measure(args, "sft", "unrolled")
  assert "--scan" not in seen["command"] and seen["env"]["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
