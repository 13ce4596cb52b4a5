"""Multi-process setup: `jax.distributed` initialisation from config/env and process helpers.

Every process runs the same program; only the main process (index 0) writes shared files.
"""

import os
from typing import Sequence, TypeVar

import jax
import ml_collections
import numpy as np

T = TypeVar("T")
_COORDINATOR_ENV = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")


def _coordinator_from_env() -> str | None:
  return next((os.environ[k] for k in _COORDINATOR_ENV if os.environ.get(k)), None)


def should_initialize(dist_cfg: ml_collections.ConfigDict) -> bool:
  """"always" / "never" as said; "auto" when the config or the environment names a coordinator."""
  if dist_cfg.initialize in ("always", "never"):
    return dist_cfg.initialize == "always"
  return bool(dist_cfg.coordinator_address or _coordinator_from_env())


def initialize(dist_cfg: ml_collections.ConfigDict) -> bool:
  """Calls `jax.distributed.initialize` when the run spans processes; returns whether it did.

  Must run before any JAX computation. Unset fields are left to JAX's cluster auto-detection
  (TPU pods, SLURM, ...) or read from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID.
  """
  if not should_initialize(dist_cfg):
    return False
  env_int = lambda key: int(os.environ[key]) if os.environ.get(key) else None
  jax.distributed.initialize(
      coordinator_address=dist_cfg.coordinator_address or _coordinator_from_env(),
      num_processes=dist_cfg.num_processes if dist_cfg.num_processes is not None
      else env_int("JAX_NUM_PROCESSES"),
      process_id=dist_cfg.process_id if dist_cfg.process_id is not None
      else env_int("JAX_PROCESS_ID"))
  return True


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def is_main_process() -> bool:
  return jax.process_index() == 0


def process_share(items: Sequence[T]) -> list[T]:
  """This process's round-robin share of `items` (all of them with one process)."""
  return list(items[process_index()::process_count()])


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (no-op with one process)."""
  if process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def main_process_decides(flag: bool) -> bool:
  """The main process's `flag`, on every process (a decision such as "stop now" taken from one clock,
  so no process leaves a loop the others stay in)."""
  if process_count() == 1:
    return flag
  from jax.experimental import multihost_utils
  return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag, np.bool_)))
