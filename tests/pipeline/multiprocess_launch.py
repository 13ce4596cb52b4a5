"""Start `python -m spa_jax.main` as N JAX processes on this machine's CPUs and wait for them.

The processes of one run meet at a localhost coordinator (`--config.distributed.*`); JAX's CPU
collectives (gloo, jax 0.10's default) carry the all-gathers and all-reduces between them.
Each process sees `devices_per_process` CPU devices (`--xla_force_host_platform_device_count`).
Every Python process of the run records the files it writes (write_audit/sitecustomize.py).
"""

import dataclasses
import os
import pathlib
import socket
import subprocess
import sys
import time

from spa_jax import configuration

REPO = configuration.CONFIGS_DIR.parent
WRITE_AUDIT = pathlib.Path(__file__).parent / "write_audit"
# The cluster variables `spa_jax.distributed` falls back on; removed so only the flags decide.
_CLUSTER_ENV = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def log_path(workdir: pathlib.Path, k: int) -> pathlib.Path:
  """Where process k of the run in `workdir` logs (stdout and stderr)."""
  return workdir.parent / f"{workdir.name}.p{k}.log"


def write_log_path(workdir: pathlib.Path, k: int) -> pathlib.Path:
  """Where process k of the run in `workdir` (and its Python children) records the files it writes."""
  return workdir.parent / f"{workdir.name}.p{k}.writes"


def written_files(workdir: pathlib.Path, k: int) -> set[str]:
  """Paths relative to `workdir` that process k (or its children) opened for writing, renamed into
  place or removed."""
  root = workdir.resolve()
  paths = {pathlib.Path(line) for line in write_log_path(workdir, k).read_text().splitlines()}
  return {str(p.relative_to(root)) for p in paths if p.is_relative_to(root)}


@dataclasses.dataclass
class Run:
  """The processes of one `spa_jax.main` invocation; process k logs to `log_path(workdir, k)`."""
  workdir: pathlib.Path
  processes: list[subprocess.Popen]

  def log_tail(self, k: int, chars: int = 4000) -> str:
    return log_path(self.workdir, k).read_text(errors="replace")[-chars:]


def start(workdir: pathlib.Path, config_file: str, overrides: dict, *, processes: int,
          devices_per_process: int) -> Run:
  """Launches the run's processes (without waiting); `overrides` are `--config.<path>` values."""
  env = {k: v for k, v in os.environ.items() if k not in _CLUSTER_ENV}
  env |= {"JAX_PLATFORMS": "cpu",
          "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}",
          "PYTHONPATH": os.pathsep.join(filter(None, [str(WRITE_AUDIT), env.get("PYTHONPATH")]))}
  command = [sys.executable, "-m", "spa_jax.main", f"--config=configs/{config_file}",
             f"--workdir={workdir}", *(f"--config.{path}={value}" for path, value in overrides.items())]
  if processes > 1:
    command += [f"--config.distributed.coordinator_address=127.0.0.1:{free_port()}",
                f"--config.distributed.num_processes={processes}"]
  run = Run(workdir, [])
  for k in range(processes):
    with open(log_path(workdir, k), "w") as out:
      process_flag = [f"--config.distributed.process_id={k}"] if processes > 1 else []
      write_log = {"SPA_TEST_WRITE_LOG": str(write_log_path(workdir, k))}
      run.processes.append(subprocess.Popen(command + process_flag, cwd=REPO, env=env | write_log,
                                            stdout=out, stderr=subprocess.STDOUT))
  return run


def wait(runs: list[Run], timeout_s: float) -> None:
  """Waits for every process of `runs`; raises with its log's tail when one fails or time runs out.

  A failed process leaves its peers blocked at the next collective, so they are killed too."""
  deadline = time.time() + timeout_s
  pending = [(run, k) for run in runs for k in range(len(run.processes))]
  failure = None
  while pending and failure is None:
    for run, k in list(pending):
      code = run.processes[k].poll()
      if code is None:
        continue
      pending.remove((run, k))
      if code != 0:
        failure = f"{run.workdir.name} process {k} exited with {code}:\n{run.log_tail(k)}"
    if time.time() > deadline and failure is None:
      run, k = pending[0]
      failure = f"{run.workdir.name} process {k} still running after {timeout_s} s:\n{run.log_tail(k)}"
    time.sleep(0.2)
  for run, k in pending:
    run.processes[k].kill()
    run.processes[k].wait()
  if failure:
    raise AssertionError(failure)
