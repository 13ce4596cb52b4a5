"""A language-model backbone with a scalar head: the progress estimator and the PPO critic.

The head reads the final hidden state at chosen token indices: the end of each action for the
progress estimator (c_s), the end of each action's prompt for the critic (V(state_s)). LM logits
are never computed.
"""

import jax
from flax import nnx

from spa_jax.training.batch import gather_steps


class ValueModel(nnx.Module):
  """`backbone(tokens_bt, positions_bt, compute_logits=False) -> (_, hidden_btd, _)` + `head`.

  `head` maps hidden states [..., D] to scalars [...] (e.g. `spa_jax.models.ScalarHead`); it is
  stored under the attribute name `head`, which the "lora_and_head" trainable filter relies on.
  """

  def __init__(self, backbone: nnx.Module, head: nnx.Module):
    self.backbone = backbone
    self.head = head

  def step_values(self, tokens_bt: jax.Array, positions_bt: jax.Array,
                  idx_bs: jax.Array) -> jax.Array:
    """Head outputs at token indices `idx_bs` (-1 padding reads index 0; mask it): [B, S]."""
    _, hidden_btd, _ = self.backbone(tokens_bt, positions_bt, compute_logits=False)
    return self.head(gather_steps(hidden_btd, idx_bs)).astype(jax.numpy.float32)
