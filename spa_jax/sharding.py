"""Device mesh and THE table of logical-axis -> mesh-axis rules.

Modules name logical axes only (parameters carry them as the `logical_axes` metadata of their
`nnx.Variable`s; activations through `constrain`). This file alone decides how those names map
onto the mesh axes `data`, `fsdp`, `tensor`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

MeshAxes = str | tuple[str, ...] | None

# Logical axis -> mesh axis (or axes). Every logical name used in the code base must appear here.
LOGICAL_AXIS_RULES: tuple[tuple[str, MeshAxes], ...] = (
    # activations
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    # parameters
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    ("lora_rank", None),
    ("layers", None),
    ("value_out", None),
)
_RULES = dict(LOGICAL_AXIS_RULES)

LogicalAxes = Sequence[str | None]


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh over all global devices; one size may be -1 (inferred)."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1:
    raise ValueError(f"At most one mesh axis may be -1, got data={data}, fsdp={fsdp}, tensor={tensor}.")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices are not divisible by fsdp*tensor*... = {known}.")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(
        f"Mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} needs {math.prod(sizes)} devices,"
        f" but {len(devices)} are available; pass -1 for one axis to infer it."
    )
  return jax.make_mesh(
      tuple(sizes), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3, devices=devices
  )


def _mesh_axes_for(name: str | None) -> tuple[str, ...]:
  if name is None:
    return ()
  if name not in _RULES:
    raise KeyError(f"Logical axis {name!r} has no rule in spa_jax.sharding.LOGICAL_AXIS_RULES; add one.")
  rule = _RULES[name]
  if rule is None:
    return ()
  return (rule,) if isinstance(rule, str) else tuple(rule)


def logical_to_spec(
    logical_axes: LogicalAxes, axis_sizes: dict[str, int], shape: Sequence[int] | None = None
) -> PartitionSpec:
  """PartitionSpec for `logical_axes` on a mesh with `axis_sizes`.

  A mesh axis is used at most once per spec (first dimension wins); mesh axes of size 1 are
  dropped; when `shape` is given, a dimension whose size the mesh axes do not divide is replicated.
  """
  used: set[str] = set()
  spec = []
  for dim, name in enumerate(logical_axes):
    axes = tuple(a for a in _mesh_axes_for(name) if a not in used and axis_sizes.get(a, 1) > 1)
    if shape is not None and axes and shape[dim] % math.prod(axis_sizes[a] for a in axes):
      axes = ()
    used.update(axes)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*spec)


def logical_to_sharding(
    logical_axes: LogicalAxes, mesh: Mesh, shape: Sequence[int] | None = None
) -> NamedSharding:
  """NamedSharding of an array with the given logical axes (see `logical_to_spec`)."""
  return NamedSharding(mesh, logical_to_spec(logical_axes, dict(mesh.shape), shape))


def variable_logical_axes(variable: nnx.Variable) -> tuple[str | None, ...]:
  """The logical axes stored on a parameter (replicated if it has none)."""
  axes = variable.get_metadata().get("logical_axes")
  ndim = len(variable.get_value().shape)
  if axes is None:
    return (None,) * ndim
  if len(axes) != ndim:
    raise ValueError(f"logical_axes {axes} do not match the parameter's rank {ndim}.")
  return tuple(axes)


def _is_variable(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def state_shardings(state: Any, mesh: Mesh) -> Any:
  """NamedShardings for an NNX state (or abstract state): same tree, NamedSharding leaves."""
  return jax.tree.map(
      lambda v: v.replace(
          logical_to_sharding(variable_logical_axes(v), mesh, v.get_value().shape)
      ),
      state,
      is_leaf=_is_variable,
  )


def state_partition_specs(state: Any, mesh: Mesh) -> Any:
  """PartitionSpecs for an NNX state: same tree, PartitionSpec leaves."""
  return jax.tree.map(lambda s: s.spec, state_shardings(state, mesh))


def create_sharded(constructor: Callable[[], nnx.Module], mesh: Mesh | None = None) -> nnx.Module:
  """Build `constructor()` inside `jax.jit`, each parameter created directly on its shards.

  The model is first traced abstractly (`nnx.eval_shape`), then initialised with `out_shardings`
  from the rules table, so no device ever holds a full unsharded copy (with `mesh=None` the
  parameters land on the default device; jitted init is also much faster than eager init).
  `constructor` must create its own `nnx.Rngs` (it runs under tracing).
  """
  abstract = nnx.eval_shape(constructor)
  graphdef, abstract_state = nnx.split(abstract)
  shardings = None if mesh is None else state_shardings(abstract_state, mesh)

  def init():
    return nnx.state(constructor())

  state = jax.jit(init, out_shardings=shardings)()
  return nnx.merge(graphdef, state)


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
  """Move an existing model's parameters onto the shardings the rules table gives (in place)."""
  state = nnx.state(model)
  nnx.update(model, jax.device_put(state, state_shardings(state, mesh)))
  return model


def current_axis_sizes() -> dict[str, int]:
  """Axis sizes of the mesh set by `jax.set_mesh` (empty dict when none is set)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return {}
  return dict(mesh.shape)


def constrain(x: jax.Array, logical_axes: LogicalAxes) -> jax.Array:
  """Activation sharding constraint by logical axes; a no-op when no mesh is set (`jax.set_mesh`)."""
  axis_sizes = current_axis_sizes()
  if not axis_sizes or all(s == 1 for s in axis_sizes.values()):
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes, axis_sizes, np.shape(x)))
