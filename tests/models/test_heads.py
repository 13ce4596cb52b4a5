"""Scalar heads: value model on its own or on the policy's backbone."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spa_jax.models import ScalarHead, ValueModel


def test_scalar_head_zero_init_and_shapes():
  head = ScalarHead(8, nnx.Rngs(0))
  hidden_btd = jax.random.normal(jax.random.key(0), (2, 3, 8))
  np.testing.assert_array_equal(head(hidden_btd), np.zeros((2, 3), np.float32))
  small = ScalarHead(8, nnx.Rngs(0), init_std=0.01)
  values_bt = small(hidden_btd.astype(jnp.bfloat16))
  assert values_bt.shape == (2, 3) and values_bt.dtype == jnp.float32
  np.testing.assert_allclose(values_bt, hidden_btd.astype(jnp.bfloat16).astype(jnp.float32) @ small.kernel[...], rtol=1e-6)


def test_value_model_shares_or_owns_backbone(micro_cfg, micro_model):
  policy = micro_model
  shared = ValueModel(policy, nnx.Rngs(1), init_std=0.02)
  tokens_bt = jax.random.randint(jax.random.key(2), (2, 5), 0, micro_cfg.vocab_size)
  positions_bt = jnp.broadcast_to(jnp.arange(5), (2, 5))

  @nnx.jit
  def values(model, tokens_bt, positions_bt):
    return model(tokens_bt, positions_bt)

  values_bt = values(shared, tokens_bt, positions_bt)
  hidden_btd = nnx.jit(lambda m, t, p: m(t, p)[1])(policy, tokens_bt, positions_bt)
  np.testing.assert_allclose(values_bt, hidden_btd @ shared.head.kernel[...], atol=1e-5)

  # One copy of the shared backbone in the split state; a separate critic has its own.
  both = nnx.List([policy, shared])
  n_policy = sum(x.size for x in jax.tree.leaves(nnx.state(policy)))
  assert sum(x.size for x in jax.tree.leaves(nnx.state(both))) == n_policy + micro_cfg.hidden_size + 1

  # Gradients reach the head and (through it) the backbone.
  @nnx.jit
  def grads(model):
    return nnx.grad(lambda m: jnp.sum(m(tokens_bt, positions_bt) ** 2))(model)

  g = grads(shared)
  assert float(jnp.abs(g.head.kernel[...]).sum()) > 0
  assert float(jnp.abs(g.backbone.embed[...]).sum()) > 0
