"""Orbax checkpoints of a train state plus JSON metadata.

`Checkpointer` wraps `ocp.CheckpointManager`: a save every `save_every` steps (and forced ones),
the newest `keep` checkpoints kept, saves asynchronous (training continues while arrays are
written; call `wait_until_finished()` before reading them and at exit: the context manager does).
Each checkpoint holds the state pytree and a JSON dict: the data-loader position, the config hash,
the layer layout (unscanned Llama layers) and whatever else the stage records.

Restores go into an abstract tree of `jax.ShapeDtypeStruct`s with shardings
(`train_state.abstract_train_state` or `abstract_like`), so each array is read straight onto its
target shards, on the same or a different device count.
"""

import hashlib
import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

LAYER_LAYOUT = "unscanned"  # spa_jax.models.Llama keeps a Python list of layers


def config_hash(config: Any) -> str:
  """Short stable hash of a JSON-serialisable config (ml_collections: pass `cfg.to_dict()`)."""
  text = json.dumps(config, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs (with the arrays' shardings) of a concrete tree: a same-layout restore target."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class Checkpointer:
  """Periodic, asynchronous, keep-N checkpoints of a train state with JSON metadata."""

  def __init__(self, directory: str | os.PathLike, *, save_every: int, keep: int | None = 3,
               async_save: bool = True):
    if save_every < 1:
      raise ValueError(f"save_every={save_every} must be >= 1")
    options = ocp.CheckpointManagerOptions(save_interval_steps=save_every, max_to_keep=keep,
                                           enable_async_checkpointing=async_save, create=True)
    self._manager = ocp.CheckpointManager(os.path.abspath(directory), options=options)

  def save(self, step: int, state: Any, metadata: dict[str, Any], *, force: bool = False) -> bool:
    """Saves if `step` is due (a multiple of save_every) or `force`; returns whether it saved."""
    metadata = {"layer_layout": LAYER_LAYOUT, **metadata}
    return self._manager.save(
        step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                      metadata=ocp.args.JsonSave(metadata)), force=force)

  def latest_step(self) -> int | None:
    """The newest saved step, or None when there is none."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """(state, metadata) of `step` (default: the newest), placed per `abstract_state`'s shardings."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self._manager.directory}")
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                      metadata=ocp.args.JsonRestore()))
    metadata = restored["metadata"]
    if metadata.get("layer_layout") != LAYER_LAYOUT:
      raise ValueError(f"checkpoint step {step} has layer layout {metadata.get('layer_layout')!r}, "
                       f"this code uses {LAYER_LAYOUT!r}; convert it before restoring")
    return restored["state"], metadata

  def wait_until_finished(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases the manager."""
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
