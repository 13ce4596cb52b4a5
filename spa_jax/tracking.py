"""Run tracking: metrics as JSONL + TensorBoard, standard plots, progress bars, timings, device memory.

Only the main process writes; on other processes the writer and progress bars are silent no-ops.
"""

import contextlib
import json
import math
import pathlib
import time
from typing import Iterable, Mapping

import jax
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from spa_jax import distributed  # noqa: E402
from spa_jax.workspace import Workspace  # noqa: E402


def _scalar(value) -> float:
  """A float; None (an undefined value as JSON keeps it, e.g. a checkpoint's stored fit) is NaN."""
  return math.nan if value is None else float(np.asarray(value))


class MetricsWriter:
  """Writes `{"step", "time", **scalars}` lines to metrics/<stage>.jsonl and TensorBoard tb/<stage>/.

  A fresh writer starts the JSONL file over (a redone stage); `append=True` continues it (a resumed one).
  """

  def __init__(self, ws: Workspace, stage: str, tensorboard: bool = True, append: bool = False):
    self.enabled = distributed.is_main_process()
    self.path = ws.metrics_path(stage)
    self._jsonl = open(self.path, "a" if append else "w") if self.enabled else None
    self._tb = None
    if self.enabled and tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(str(ws.tb_dir(stage)))

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    """Records scalars (floats, numpy or JAX scalars; None for undefined) at `step`."""
    if not self.enabled:
      return
    values = {name: _scalar(value) for name, value in scalars.items()}
    self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **values}) + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      for name, value in values.items():
        if math.isfinite(value):  # undefined values (a correlation of constant data) stay out of the plots
          self._tb.add_scalar(name, value, int(step))

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()

  def __enter__(self) -> "MetricsWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def read_metrics(jsonl_path: str | pathlib.Path) -> list[dict]:
  with open(jsonl_path) as f:
    return [json.loads(line) for line in f if line.strip()]


def plot_metrics(jsonl_path: str | pathlib.Path, out_png: str | pathlib.Path, title: str = "") -> list[str]:
  """One panel per scalar (loss, reward, score, ...) against step; returns the plotted names."""
  rows = read_metrics(jsonl_path)
  names = sorted({key for row in rows for key in row} - {"step", "time"})
  if not names:
    raise ValueError(f"{jsonl_path} holds no scalars to plot.")
  cols = min(3, len(names))
  nrows = math.ceil(len(names) / cols)
  fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.2 * nrows), squeeze=False)
  for ax, name in zip(axes.flat, names):
    points = [(row["step"], row[name]) for row in rows if name in row]
    ax.plot(*zip(*points), marker="." if len(points) < 50 else None)
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(names):]:
    ax.axis("off")
  fig.suptitle(title or pathlib.Path(jsonl_path).stem)
  fig.tight_layout()
  pathlib.Path(out_png).parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out_png, dpi=100)
  plt.close(fig)
  return names


def plot_eval_bars(results: Mapping[str, Mapping[str, float]], out_png: str | pathlib.Path,
                   metrics: Iterable[str] = ("score", "success_rate", "purchase_rate", "grounding")) -> None:
  """Grouped bars: one group per metric, one bar per policy (`results[policy][metric]`)."""
  metrics = [m for m in metrics if any(m in r for r in results.values())]
  if not metrics:
    raise ValueError("No known metric in the eval results to plot.")
  width = 0.8 / max(1, len(results))
  fig, ax = plt.subplots(figsize=(1.8 * len(metrics) + 2, 3.5))
  for i, (policy, values) in enumerate(results.items()):
    xs = np.arange(len(metrics)) + i * width
    ax.bar(xs, [values.get(m, 0.0) for m in metrics], width, label=policy)
  ax.set_xticks(np.arange(len(metrics)) + width * (len(results) - 1) / 2, metrics)
  ax.legend()
  ax.grid(axis="y", alpha=0.3)
  fig.tight_layout()
  pathlib.Path(out_png).parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out_png, dpi=100)
  plt.close(fig)


def progress(total: int | None, desc: str, unit: str = "it", enabled: bool = True) -> tqdm:
  """A tqdm bar shown on the main process only; use `.set_postfix(...)` for rates."""
  return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True,
              disable=not (enabled and distributed.is_main_process()))


def peak_memory_gb() -> float | None:
  """High-water mark of the first local device's allocator since the process started, in GB (1e9
  bytes); None where the backend keeps no such count (CPU)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return None if peak is None else peak / 1e9


@contextlib.contextmanager
def timed(record: dict, name: str):
  """Records the `with` block's wall seconds as `record[name]`.

  JAX dispatches asynchronously: the block must end with its results on the host (or call
  `jax.block_until_ready`) for the time to be its own work's."""
  start = time.perf_counter()
  yield
  record[name] = time.perf_counter() - start
