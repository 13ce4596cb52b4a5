"""On-policy PPO with step rewards from the frozen progress estimator; spa-rl.md §2.7, §4, §7.5.

The default command's config: the whole chain, then the eval table of SFT, sparse PPO and SPA.
"""

import ml_collections

from spa_jax.configuration import load_sibling


def ppo_section(preset: str) -> ml_collections.ConfigDict:
  real = load_sibling(__file__, "base").is_real(preset)
  return ml_collections.ConfigDict(dict(
      finetune="lora",  # "lora" | "full"
      # One PPO run per mode, each from the SFT policy, writing policy "ppo_<mode>":
      # "spa" (progress + grounding), "sparse" (final reward only), "grounding_only".
      reward_modes="sparse,spa",
      iterations=50 if real else 2,  # rollout + update rounds
      rollouts_per_iteration=32 if real else 8,  # trajectories per PPO step (global)
      mini_batch_size=2 if real else 4,
      grad_accum=4 if real else 1,
      ppo_epochs=4 if real else 2,
      learning_rate=1e-5 if real else 1e-4,
      gamma=0.99,
      gae_lambda=0.95,
      clip_ratio=0.2,
      value_clip=0.2,
      vf_coef=0.1,
      entropy_coef=0.0,
      max_mean_ratio=10.0,  # skip a batch whose mean ratio exceeds this
      whiten_advantages=True,
      kl=ml_collections.ConfigDict(dict(adaptive=True, init_coef=0.3, target=6.0, horizon=10000)),
      temperature=1.0,
      top_p=1.0,
      max_new_tokens=512 if real else 96,
      max_len=4096 if real else 2048,
  ))


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  cfg = load_sibling(__file__, "label").get_config(preset)
  cfg.run.targets = "ppo,eval"
  cfg.ppo = ppo_section(cfg.preset)
  cfg.eval = load_sibling(__file__, "eval").eval_section(cfg.preset)
  return cfg
