"""Metrics JSONL + TensorBoard, plots, and the distributed helpers on one process."""

import json

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from spa_jax import distributed, tracking
from spa_jax.workspace import Workspace


def test_metrics_writer_writes_jsonl_and_tensorboard(tmp_path):
  ws = Workspace(tmp_path)
  with tracking.MetricsWriter(ws, "sft") as writer:
    for step in range(3):
      writer.write(step, {"loss": jnp.float32(1.0 / (step + 1)), "lr": np.float64(0.1)})
  rows = [json.loads(line) for line in ws.metrics_path("sft").read_text().splitlines()]
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert rows[2]["loss"] == pytest.approx(1 / 3) and rows[0]["lr"] == 0.1 and "time" in rows[0]
  with tracking.MetricsWriter(ws, "sft", tensorboard=False, append=True) as writer:
    writer.write(3, {"loss": 0.2})
  assert len(ws.metrics_path("sft").read_text().splitlines()) == 4
  with tracking.MetricsWriter(ws, "sft", tensorboard=False) as writer:
    writer.write(0, {"loss": 0.9})
  assert len(ws.metrics_path("sft").read_text().splitlines()) == 1
  assert tensorboard_scalars(ws.tb_dir("sft"), "loss") == pytest.approx([1.0, 0.5, 1 / 3])


def test_undefined_values_stay_in_jsonl_but_out_of_tensorboard(tmp_path):
  ws = Workspace(tmp_path)
  with tracking.MetricsWriter(ws, "prm") as writer:
    writer.write(0, {"pearson": float("nan"), "mse": 0.5})
    writer.write(1, {"pearson": 0.25, "mse": 0.4})
    writer.write(2, {"pearson": None, "mse": 0.3})  # undefined as JSON stores it
  rows = [json.loads(line) for line in ws.metrics_path("prm").read_text().splitlines()]
  assert np.isnan(rows[0]["pearson"]) and rows[1]["pearson"] == 0.25 and np.isnan(rows[2]["pearson"])
  assert tensorboard_scalars(ws.tb_dir("prm"), "pearson") == [0.25]
  assert tensorboard_scalars(ws.tb_dir("prm"), "mse") == pytest.approx([0.5, 0.4, 0.3])


def tensorboard_scalars(tb_dir, tag):
  """Scalar values of `tag` from TFRecord-framed event files (u64 length, u32 crc, data, u32 crc)."""
  import struct

  from tensorboardX.proto.event_pb2 import Event
  values = []
  for path in sorted(tb_dir.glob("events.out.tfevents.*")):
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset:offset + 8])
      event = Event.FromString(data[offset + 12:offset + 12 + length])
      offset += 12 + length + 4
      values += [v.simple_value for v in event.summary.value if v.tag == tag]
  return values


def test_plots_are_written(tmp_path):
  ws = Workspace(tmp_path)
  with tracking.MetricsWriter(ws, "ppo", tensorboard=False) as writer:
    for step in range(4):
      writer.write(step, {"policy_loss": step * 0.1, "score": 10.0 * step})
      writer.write(step, {"kl": 0.01})
  assert tracking.plot_metrics(ws.metrics_path("ppo"), ws.plot_path("ppo")) == ["kl", "policy_loss", "score"]
  assert ws.plot_path("ppo").stat().st_size > 1000
  tracking.plot_eval_bars({"sft": {"score": 50.0, "success_rate": 20.0}, "ppo": {"score": 60.0}},
                          ws.plot_path("eval"))
  assert ws.plot_path("eval").stat().st_size > 1000
  (tmp_path / "empty.jsonl").write_text('{"step": 0, "time": 1.0}\n')
  with pytest.raises(ValueError, match="no scalars"):
    tracking.plot_metrics(tmp_path / "empty.jsonl", tmp_path / "empty.png")


def test_distributed_helpers_on_one_process(monkeypatch):
  cfg = ml_collections.ConfigDict(dict(initialize="auto", coordinator_address=None,
                                       num_processes=None, process_id=None))
  monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
  monkeypatch.delenv("COORDINATOR_ADDRESS", raising=False)
  assert not distributed.should_initialize(cfg) and not distributed.initialize(cfg)
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
  assert distributed.should_initialize(cfg)
  cfg.initialize = "never"
  assert not distributed.should_initialize(cfg)
  assert distributed.is_main_process() and distributed.process_share([3, 1, 2]) == [3, 1, 2]
  distributed.barrier("single-process")
