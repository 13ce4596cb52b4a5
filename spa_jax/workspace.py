"""A run workspace: one directory holding every stage's artifacts, configs and completion records.

Layout (documented in WORKSPACE.md):
  config.json                 the full config of the latest invocation
  lock                        flock-ed by the run using the workspace (`Workspace.lock`)
  <stage>/config.json         the config the stage last ran with
  <stage>/DONE.json           fingerprint, input and output digests, summary; written when the stage finishes
  checkpoints/<stage>/        Orbax checkpoints
  trajectories/<name>.p<k>.jsonl  one trajectory per line, written by process k
  arrayrecord/<name>/         optional tensorflow-datasets ArrayRecord copy
  metrics/<stage>.jsonl       {"step", "time", **scalars} per line
  tb/<stage>/                 TensorBoard event files
  plots/<name>.png, reports/<name>.json
"""

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import socket
import time
from typing import Any, Iterator

DONE_FILE = "DONE.json"
LOCK_FILE = "lock"


class WorkspaceBusy(RuntimeError):
  """Another run holds the workspace."""


def canonical_json(obj: Any) -> str:
  """Key-sorted compact JSON; the basis of fingerprints."""
  return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def fingerprint(obj: Any) -> str:
  """A short stable hash of a JSON-able object."""
  return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]


def write_json_atomic(path: pathlib.Path, obj: Any) -> None:
  """Writes JSON through a temporary file so readers never see half a file."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
  os.replace(tmp, path)


class Workspace:
  """Paths of one run's artifacts under `root`; directories are created on first use."""

  def __init__(self, root: str | os.PathLike):
    self.root = pathlib.Path(root).expanduser().resolve()

  def _dir(self, *parts: str) -> pathlib.Path:
    path = self.root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path

  def stage_dir(self, stage: str) -> pathlib.Path:
    return self._dir(stage)

  def checkpoint_dir(self, stage: str) -> pathlib.Path:
    return self._dir("checkpoints", stage)

  def trajectories_path(self, name: str, shard: int | None = None) -> pathlib.Path:
    """`trajectories/<name>.jsonl`, or process `shard`'s part `trajectories/<name>.p<shard>.jsonl`."""
    return self._dir("trajectories") / (f"{name}.jsonl" if shard is None else f"{name}.p{shard}.jsonl")

  def trajectory_shards(self, name: str) -> list[pathlib.Path]:
    """Every process's part of the trajectory set `name`, in shard order."""
    shards = self._dir("trajectories").glob(f"{name}.p*.jsonl")
    return sorted(shards, key=lambda p: int(p.name[len(name) + 2:-len(".jsonl")]))

  def array_record_dir(self, name: str) -> pathlib.Path:
    """`arrayrecord/<name>/`: a tensorflow-datasets ArrayRecord copy of a dataset."""
    return self._dir("arrayrecord", name)

  def metrics_path(self, stage: str) -> pathlib.Path:
    return self._dir("metrics") / f"{stage}.jsonl"

  def tb_dir(self, stage: str) -> pathlib.Path:
    return self._dir("tb", stage)

  def plot_path(self, name: str) -> pathlib.Path:
    return self._dir("plots") / f"{name}.png"

  def report_path(self, name: str) -> pathlib.Path:
    return self._dir("reports") / f"{name}.json"

  def write_config(self, config_dict: dict, stage: str | None = None) -> pathlib.Path:
    """Records a config: the run's (`config.json`) or the one a stage runs with."""
    path = (self.stage_dir(stage) if stage else self._dir()) / "config.json"
    write_json_atomic(path, config_dict)
    return path

  def done_record(self, stage: str) -> dict | None:
    """The stage's DONE.json contents, or None when it never finished (or the record is unreadable)."""
    try:
      return json.loads((self.root / stage / DONE_FILE).read_text())
    except (OSError, ValueError):
      return None

  def is_current(self, stage: str, stage_fingerprint: str, digests) -> bool:
    """True when the stage finished with this fingerprint and each recorded output still exists with
    the content it was recorded with (`digests`: a spa_jax.digests.DigestCache)."""
    record = self.done_record(stage)
    if record is None or record.get("fingerprint") != stage_fingerprint:
      return False
    outputs = record.get("outputs")
    return isinstance(outputs, dict) and all(
        (self.root / rel).exists() and digests.digest(self.root / rel) == digest for rel, digest in outputs.items())

  def mark_done(self, stage: str, stage_fingerprint: str, inputs: dict[str, str], summary: dict, digests,
                files: dict[str, str] | None = None) -> None:
    """Writes `<stage>/DONE.json`: the fingerprint, the dependencies' fingerprints (`inputs`), the
    digests of the files the stage read (`files`) and of `summary["outputs"]` (paths relative to root,
    checked on reuse), the summary and the time."""
    outputs = [pathlib.Path(p).resolve().relative_to(self.root) if pathlib.Path(p).is_absolute()
               else pathlib.Path(p) for p in summary.get("outputs", [])]
    write_json_atomic(self.stage_dir(stage) / DONE_FILE, {
        "stage": stage, "fingerprint": stage_fingerprint, "inputs": inputs, "files": files or {},
        "outputs": {str(rel): digests.digest(self.root / rel) for rel in outputs},
        "summary": summary, "finished_at": time.time()})

  @contextlib.contextmanager
  def lock(self) -> Iterator[None]:
    """Holds the workspace for one run (an exclusive flock on `<root>/lock`, released when the process
    ends, even by SIGKILL); raises WorkspaceBusy at once, naming the holder, while another run holds it."""
    self.root.mkdir(parents=True, exist_ok=True)
    with open(self.root / LOCK_FILE, "a+") as f:
      try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        raise WorkspaceBusy(f"Workspace {self.root} is in use by {holder}: wait for that run to end (or stop "
                            "it), or pass another --workdir.") from None
      f.truncate(0)
      f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
      f.flush()
      try:
        yield
      finally:
        f.truncate(0)  # the holder's note goes with the lock

  def clear_done(self, stage: str) -> None:
    (self.root / stage / DONE_FILE).unlink(missing_ok=True)
