"""Progress estimator training on exploration trajectories; spa-rl.md §2.4, §4 and §7.6."""

import ml_collections

from spa_jax.configuration import load_sibling


def prm_section(preset: str) -> ml_collections.ConfigDict:
  real = load_sibling(__file__, "base").is_real(preset)
  return ml_collections.ConfigDict(dict(
      finetune="full",  # "full" | "lora"
      epochs=1 if real else 2,
      batch_size=16 if real else 8,
      micro_batch_size=2 if real else 8,
      learning_rate=3e-6 if real else 1e-3,
      warmup_steps=500 if real else 2,
      weight_decay=0.01,
      grad_clip=1.0,
      max_len=4096 if real else 2048,
      holdout_fraction=0.1,  # tasks held out to report estimator MSE out of sample
  ))


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  cfg = load_sibling(__file__, "explore").get_config(preset)
  cfg.run.targets = "prm"
  cfg.prm = prm_section(cfg.preset)
  return cfg
