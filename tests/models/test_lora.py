"""LoRA: identity at init, gradients only reach adapters under the filter, merge == unmerged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spa_jax.models import apply_lora, has_lora, merge_lora, trainable_filter
from spa_jax.models.lora import FROZEN_BASE_FILTER


def _logits(graphdef, state, tokens_bt):
  positions_bt = jnp.broadcast_to(jnp.arange(tokens_bt.shape[1]), tokens_bt.shape)
  return nnx.merge(graphdef, state)(tokens_bt, positions_bt)[0]


_jit_logits = jax.jit(_logits, static_argnums=0)


@pytest.fixture
def model_and_tokens(micro_cfg, micro_model):
  model = micro_model
  tokens_bt = jax.random.randint(jax.random.key(1), (2, 6), 0, micro_cfg.vocab_size)
  return model, tokens_bt


def _perturb_lora_b(model):
  """Give every adapter a non-zero B so LoRA changes the output."""
  lora_state = nnx.state(model, nnx.LoRAParam)
  bumped = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(7), x.shape), lora_state)
  nnx.update(model, bumped)


def test_apply_lora_keeps_outputs_and_adds_only_adapters(model_and_tokens):
  model, tokens_bt = model_and_tokens
  before = _jit_logits(*nnx.split(model), tokens_bt)
  base_count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  apply_lora(model, rank=4, alpha=8, rngs=nnx.Rngs(3))
  assert has_lora(model) and trainable_filter(model) is nnx.LoRAParam
  lora_leaves = jax.tree.leaves(nnx.state(model, nnx.LoRAParam))
  cfg = model.cfg
  per_layer = 4 * (cfg.hidden_size + cfg.num_heads * cfg.head_dim) + 4 * (cfg.hidden_size + cfg.num_kv_heads * cfg.head_dim)
  assert sum(x.size for x in lora_leaves) == cfg.num_layers * per_layer
  assert sum(x.size for x in jax.tree.leaves(nnx.state(model, FROZEN_BASE_FILTER))) == base_count
  np.testing.assert_array_equal(_jit_logits(*nnx.split(model), tokens_bt), before)


def test_gradients_reach_only_lora_params(model_and_tokens):
  model, tokens_bt = model_and_tokens
  apply_lora(model, rank=4, alpha=8, rngs=nnx.Rngs(3))
  graphdef, trainable, frozen = nnx.split(model, trainable_filter(model), ...)
  assert all(isinstance(v, nnx.LoRAParam) for v in jax.tree.leaves(trainable, is_leaf=lambda x: isinstance(x, nnx.Variable)))

  @jax.jit
  def grads(trainable, frozen):
    def loss(trainable):
      logits_btv = nnx.merge(graphdef, trainable, frozen)(tokens_bt, jnp.broadcast_to(jnp.arange(6), (2, 6)))[0]
      return jnp.mean(jax.nn.log_softmax(logits_btv)[..., 0])
    return jax.grad(loss)(trainable)

  g = grads(trainable, frozen)
  assert jax.tree.structure(g) == jax.tree.structure(trainable)
  grad_norms = {k: float(jnp.linalg.norm(v)) for k, v in nnx.to_flat_state(g)}
  # With B = 0 the gradient flows to B (A's gradient is B^T-weighted, hence zero).
  assert all(norm > 0 for path, norm in grad_norms.items() if path[-1] == "b")
  assert all(norm == 0 for path, norm in grad_norms.items() if path[-1] == "a")


def test_merge_lora_equals_unmerged_forward(model_and_tokens):
  model, tokens_bt = model_and_tokens
  base_logits = _jit_logits(*nnx.split(model), tokens_bt)
  base_structure = jax.tree.structure(nnx.state(model))
  apply_lora(model, rank=4, alpha=8, targets=("q_proj", "v_proj", "down_proj", "lm_head"), rngs=nnx.Rngs(3))
  _perturb_lora_b(model)
  unmerged = _jit_logits(*nnx.split(model), tokens_bt)
  assert not np.allclose(unmerged, base_logits, atol=1e-3)
  merge_lora(model)
  assert not has_lora(model)
  assert jax.tree.structure(nnx.state(model)) == base_structure
  np.testing.assert_allclose(_jit_logits(*nnx.split(model), tokens_bt), unmerged, atol=1e-5)


def test_bad_lora_arguments(model_and_tokens):
  model, _ = model_and_tokens
  with pytest.raises(ValueError, match="Unknown LoRA targets"):
    apply_lora(model, 4, 8, targets=("qproj",), rngs=nnx.Rngs(0))
  tied = nnx.eval_shape(lambda: type(model)(model.cfg.replace(tie_embeddings=True), rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match=r"No projection named \['lm_head'\]"):
    apply_lora(tied, 4, 8, targets=("q_proj", "lm_head"), rngs=nnx.Rngs(0))
  apply_lora(model, 4, 8, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="twice"):
    apply_lora(model, 4, 8, rngs=nnx.Rngs(0))
