"""Train state: (graphdef, trainable params, frozen state, optimizer state, step, rng) as one pytree.

The model is split once outside jit (`nnx.split`) and merged inside the jitted steps. Which
variables train is a filter chosen by name:

- `"full"`: every `nnx.Param` (full fine-tuning; a scalar head, if any, trains too);
- `"lora"`: only `nnx.LoRAParam` adapters (base weights are frozen and bit-identical after updates);
- `"lora_and_head"`: LoRA adapters plus the parameters of a submodule named `head` (a LoRA critic
  or progress estimator with a fresh `ScalarHead`).

The optimizer state is created on the parameters' shardings, so a sharded model gives a sharded
train state. `rng` is the run's random stream (sampling, shuffling), checkpointed with the rest;
update steps are deterministic and do not consume it.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spa_jax.sharding import state_shardings

TRAINABLE_FILTERS = {
    "full": nnx.Param,
    "lora": nnx.LoRAParam,
    "lora_and_head": nnx.Any(nnx.LoRAParam, nnx.All(nnx.Param, nnx.PathContains("head"))),
}


class TrainState(struct.PyTreeNode):
  """Everything one update step reads and writes; `graphdef` and `tx` are static."""

  graphdef: Any = struct.field(pytree_node=False)
  tx: optax.GradientTransformation = struct.field(pytree_node=False)
  params: nnx.State
  frozen: nnx.State
  opt_state: optax.OptState
  step: jax.Array
  rng: jax.Array

  def model(self) -> nnx.Module:
    """The module with the current parameters (call inside jit)."""
    return nnx.merge(self.graphdef, self.params, self.frozen)

  def with_params(self, params: nnx.State) -> "TrainState":
    """Same state with other trainable parameters (e.g. zeroed LoRA for the reference policy)."""
    return self.replace(params=params)

  def apply_gradients(self, grads: nnx.State) -> "TrainState":
    """One optimizer update; increments `step`."""
    updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
    return self.replace(params=optax.apply_updates(self.params, updates), opt_state=opt_state,
                        step=self.step + 1)


def _opt_state_shardings(tx: optax.GradientTransformation, params: nnx.State) -> Any | None:
  """Shardings of `tx.init(params)`: each moment as its parameter, scalars replicated."""
  param_shardings = jax.tree.map(lambda p: p.sharding, params)
  mesh = getattr(jax.tree.leaves(param_shardings)[0], "mesh", None)
  if mesh is None:
    return None
  replicated = NamedSharding(mesh, PartitionSpec())
  return optax.tree_map_params(tx, lambda _, sharding: sharding, jax.eval_shape(tx.init, params),
                               param_shardings, transform_non_params=lambda _: replicated)


def _split_trainable(model: nnx.Module, trainable: str):
  if trainable not in TRAINABLE_FILTERS:
    raise ValueError(f"unknown trainable={trainable!r}; choose one of {sorted(TRAINABLE_FILTERS)}")
  graphdef, params, frozen = nnx.split(model, TRAINABLE_FILTERS[trainable], ...)
  if not jax.tree.leaves(params):
    raise ValueError(f"trainable={trainable!r} selects no parameters of {type(model).__name__}; "
                     "apply LoRA first (spa_jax.models.apply_lora) or use trainable='full'")
  return graphdef, params, frozen


def create_train_state(model: nnx.Module, tx: optax.GradientTransformation, *,
                       trainable: str = "full", seed: int = 0) -> TrainState:
  """Split `model` into trainable params / frozen state and initialise the optimizer on them."""
  graphdef, params, frozen = _split_trainable(model, trainable)
  opt_state = jax.jit(tx.init, out_shardings=_opt_state_shardings(tx, params))(params)
  return TrainState(graphdef=graphdef, tx=tx, params=params, frozen=frozen, opt_state=opt_state,
                    step=jnp.zeros((), jnp.int32), rng=jax.random.PRNGKey(seed))


def frozen_train_state(model: nnx.Module) -> TrainState:
  """`model` as a train state that is never updated (every parameter held, no optimizer moments):
  for forward passes such as the reference policy or the progress estimator."""
  return create_train_state(model, optax.set_to_zero(), trainable="full")


def abstract_train_state(model_fn: Callable[[], nnx.Module], tx: optax.GradientTransformation, *,
                         trainable: str, mesh: Mesh) -> TrainState:
  """The train state `create_train_state(model_fn(), tx, trainable=...)` would give on `mesh`, as
  `jax.ShapeDtypeStruct`s carrying their target shardings (nothing is allocated): the restore
  target for checkpoints, valid on any device count."""
  def with_shardings(abstract, shardings):
    return jax.tree.map(
        lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
        abstract, shardings)

  graphdef, params, frozen = _split_trainable(nnx.eval_shape(model_fn), trainable)
  params = with_shardings(params, state_shardings(params, mesh))
  frozen = with_shardings(frozen, state_shardings(frozen, mesh))
  opt_state = with_shardings(jax.eval_shape(tx.init, params), _opt_state_shardings(tx, params))
  replicated = NamedSharding(mesh, PartitionSpec())
  return TrainState(
      graphdef=graphdef, tx=tx, params=params, frozen=frozen, opt_state=opt_state,
      step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
      rng=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated))


def count_params(params: nnx.State) -> int:
  """Number of scalar parameters in a state."""
  return sum(x.size for x in jax.tree.leaves(params))
