"""Assemble a global, batch-sharded batch from each process's local numpy rows.

Every process loads its own B_local rows (the same B_local everywhere) and calls
`to_global_batch(local, mesh)`; `jax.make_array_from_process_local_data` stitches them into
global arrays of B_local * process_count rows, sharded over the mesh axes of the logical axis
"batch" (("data", "fsdp") in `spa_jax.sharding`). Single-process runs use the same call.
`global_batch_shapes` gives the same arrays' shapes, dtypes and shardings without making them
(to compile a step for them ahead of time).
"""

from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh

from spa_jax.sharding import logical_to_sharding


def batch_devices(mesh: Mesh) -> int:
  """The devices a global batch's rows are split over (mesh axes "data" and "fsdp")."""
  return mesh.shape["data"] * mesh.shape["fsdp"]


def global_batch_shapes(local: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """The abstract global arrays [B_local * process_count, ...] `to_global_batch(local, mesh)` returns."""
  sizes = {np.shape(x)[0] for x in local.values()}
  if len(sizes) != 1:
    raise ValueError(f"all batch arrays need the same leading (batch) size, got {sorted(sizes)}")
  global_rows = sizes.pop() * jax.process_count()
  if global_rows % batch_devices(mesh):
    raise ValueError(f"global batch of {global_rows} rows does not divide over the "
                     f"{batch_devices(mesh)} devices of mesh axes ('data', 'fsdp'); pad or resize it")
  out = {}
  for name, x in local.items():
    global_shape = (global_rows,) + np.shape(x)[1:]
    sharding = logical_to_sharding(("batch",) + (None,) * (len(global_shape) - 1), mesh, global_shape)
    out[name] = jax.ShapeDtypeStruct(global_shape, np.asarray(x).dtype, sharding=sharding)
  return out


def to_global_batch(local: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Global arrays [B_local * process_count, ...] sharded along the batch dimension."""
  return {name: jax.make_array_from_process_local_data(shape.sharding, np.asarray(local[name]), shape.shape)
          for name, shape in global_batch_shapes(local, mesh).items()}
