"""Pure losses (SFT, progress estimator, PPO, GAE over steps), train state + jitted update steps,
Orbax checkpoints. The batch layout all of them share is documented in `batch.py`."""

from spa_jax.training.batch import (check_has_agent_tokens, make_trajectory_batch,
                                    steps_from_action_mask, token_logprobs)
from spa_jax.training.checkpoint import Checkpointer, abstract_like, config_hash
from spa_jax.training.gae import gae_over_steps
from spa_jax.training.global_batch import to_global_batch
from spa_jax.training.kl import (AdaptiveKLController, FixedKLController, kl_shaped_rewards,
                                 make_kl_controller, step_kl)
from spa_jax.training.losses import (ppo_policy_loss, predicted_returns, progress_loss, sft_loss,
                                     value_loss)
from spa_jax.training.optim import OptimizerConfig, learning_rate_schedule, make_optimizer
from spa_jax.training.ppo_targets import ppo_targets
from spa_jax.training.rewards import REWARD_MODES, step_rewards
from spa_jax.training.stats import masked_mean, masked_whiten, pearson
from spa_jax.training.steps import (PPOConfig, PPOState, forward_logprobs, forward_step_values,
                                    lora_reference, make_ppo_step, make_progress_step,
                                    make_sft_step)
from spa_jax.training.sum_count import SumCount
from spa_jax.training.train_state import (TrainState, abstract_train_state, count_params,
                                          create_train_state, frozen_train_state)

__all__ = [
    "AdaptiveKLController", "Checkpointer", "FixedKLController", "OptimizerConfig", "PPOConfig",
    "PPOState", "REWARD_MODES", "SumCount", "TrainState", "abstract_like", "abstract_train_state",
    "check_has_agent_tokens", "config_hash", "count_params", "create_train_state", "frozen_train_state",
    "forward_logprobs", "forward_step_values", "gae_over_steps", "kl_shaped_rewards",
    "learning_rate_schedule", "lora_reference", "make_kl_controller", "make_optimizer",
    "make_ppo_step", "make_progress_step", "make_sft_step", "make_trajectory_batch",
    "masked_mean", "masked_whiten", "pearson", "ppo_policy_loss", "ppo_targets",
    "predicted_returns", "progress_loss", "sft_loss", "step_kl", "step_rewards",
    "steps_from_action_mask", "to_global_batch", "token_logprobs", "value_loss",
]
