"""Scalar heads on the Llama backbone: values / progress estimates per token."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from spa_jax.models.llama import Llama


class ScalarHead(nnx.Module):
  """`hidden_btd -> values_bt` linear map (float32), zero-initialised unless `init_std > 0`."""

  def __init__(self, hidden_size: int, rngs: nnx.Rngs, *, init_std: float = 0.0):
    kernel = (
        init_std * jax.random.normal(rngs.params(), (hidden_size,), jnp.float32)
        if init_std > 0 else jnp.zeros((hidden_size,), jnp.float32)
    )
    self.kernel = nnx.Param(kernel, logical_axes=("embed",))
    self.bias = nnx.Param(jnp.zeros((), jnp.float32), logical_axes=())

  def __call__(self, hidden_btd: jax.Array) -> jax.Array:
    return hidden_btd.astype(jnp.float32) @ self.kernel[...] + self.bias[...]


class ValueModel(nnx.Module):
  """Backbone + `ScalarHead`: the critic or the progress estimator.

  Pass a fresh `Llama` for a separate network, or the policy's own `Llama` object to share its
  backbone (NNX keeps one copy of shared modules in `nnx.split`).
  """

  def __init__(self, backbone: Llama, rngs: nnx.Rngs, *, init_std: float = 0.0):
    self.backbone = backbone
    self.head = ScalarHead(backbone.cfg.hidden_size, rngs, init_std=init_std)

  def __call__(
      self, tokens_bt: jax.Array, positions_bt: jax.Array, *, attn_mask_bt: jax.Array | None = None
  ) -> jax.Array:
    """values_bt (float32) for every token."""
    _, hidden_btd, _ = self.backbone(
        tokens_bt, positions_bt, attn_mask_bt=attn_mask_bt, compute_logits=False
    )
    return self.head(hidden_btd)
