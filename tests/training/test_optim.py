"""Optimizer schedules, weight-decay mask and gradient clipping."""

import jax.numpy as jnp
import numpy as np
import pytest

from spa_jax.training.optim import OptimizerConfig, learning_rate_schedule, make_optimizer


def test_warmup_cosine_schedule_values():
  # peak 1e-3, warmup 2 of 10 steps: 0, 5e-4, 1e-3, then cosine over the remaining 8 steps:
  # step 6 is halfway: 1e-3 * 0.5 (1 + cos(pi / 2)) = 5e-4; step 10: 0.
  schedule = learning_rate_schedule(
      OptimizerConfig(1e-3, schedule="warmup_cosine", warmup_steps=2, total_steps=10))
  np.testing.assert_allclose([schedule(s) for s in (0, 1, 2, 6, 10)],
                             [0.0, 5e-4, 1e-3, 5e-4, 0.0], atol=1e-9)


def test_constant_schedule_with_warmup():
  schedule = learning_rate_schedule(OptimizerConfig(3e-6, warmup_steps=4))
  np.testing.assert_allclose([schedule(s) for s in (0, 2, 4, 100)], [0.0, 1.5e-6, 3e-6, 3e-6],
                             atol=1e-12)


def test_weight_decay_skips_vectors():
  params = {"kernel": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
  tx = make_optimizer(OptimizerConfig(0.1, weight_decay=0.5, grad_clip_norm=None))
  zero_grads = {"kernel": jnp.zeros((2, 2)), "scale": jnp.zeros((2,))}
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  # with zero gradients only decay acts: -lr * wd * p = -0.05 on matrices, 0 on vectors
  np.testing.assert_allclose(updates["kernel"], -0.05)
  np.testing.assert_allclose(updates["scale"], 0.0)


def _second_adam_update(grad_clip_norm):
  tx = make_optimizer(OptimizerConfig(1.0, grad_clip_norm=grad_clip_norm, eps=0.0))
  params = jnp.zeros(())
  state = tx.init(params)
  _, state = tx.update(jnp.array(100.0), state, params)
  updates, _ = tx.update(jnp.array(1.0), state, params)
  return float(updates)


def test_gradient_clipping():
  # grads 100 then 1 (b1 0.9, b2 0.999). Unclipped second step:
  #   m_hat = (0.09 * 100 + 0.1 * 1) / 0.19 = 47.895, v_hat = (0.000999 * 1e4 + 0.001) / 0.001999
  #   = 4998.0 -> update -47.895 / 70.697 = -0.67747.
  # Clipped to norm 1, both grads are 1: m_hat = 1, v_hat = 1 -> update -1.
  np.testing.assert_allclose(_second_adam_update(None), -0.67747, rtol=1e-4)
  np.testing.assert_allclose(_second_adam_update(1.0), -1.0, rtol=1e-4)


def test_config_errors():
  with pytest.raises(ValueError, match="total_steps"):
    OptimizerConfig(1e-3, schedule="warmup_cosine")
  with pytest.raises(ValueError, match="schedule"):
    OptimizerConfig(1e-3, schedule="linear")
  with pytest.raises(ValueError, match="warmup_steps"):
    OptimizerConfig(1e-3, warmup_steps=5, total_steps=3)
