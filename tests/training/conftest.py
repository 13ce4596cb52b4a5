"""Shared tiny model and trajectory batch for the training tests."""

import numpy as np
import pytest
from flax import nnx

from spa_jax.models import Llama, LlamaConfig
from spa_jax.training.batch import make_trajectory_batch

# C's "tiny" preset shrunk further so CPU compiles stay short.
TINY = dict(num_layers=1, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
            head_dim=16, vocab_size=256)


def tiny_config() -> LlamaConfig:
  return LlamaConfig.preset("tiny", **TINY)


def tiny_llama(seed: int = 0) -> Llama:
  return Llama(tiny_config(), rngs=nnx.Rngs(seed))


def toy_trajectories(num_rows: int = 4, seq_len: int = 32, max_steps: int = 4, seed: int = 0):
  """Trajectories of 1-3 steps: prompt tokens, then (action, observation) turns, right-padded."""
  rng = np.random.default_rng(seed)
  token_rows, mask_rows = [], []
  for row in range(num_rows):
    num_steps = 1 + row % 3
    tokens, mask = list(rng.integers(1, 256, size=4)), [0] * 4
    for _ in range(num_steps):
      action = list(rng.integers(1, 256, size=3))
      observation = list(rng.integers(1, 256, size=2))
      tokens += action + observation
      mask += [1] * 3 + [0] * 2
    token_rows.append(tokens[:-2])  # the episode ends with an action
    mask_rows.append(mask[:-2])
  rewards = rng.uniform(size=num_rows)
  return make_trajectory_batch(token_rows, mask_rows, rewards, seq_len=seq_len,
                               max_steps=max_steps)


@pytest.fixture
def toy_batch():
  return toy_trajectories()
