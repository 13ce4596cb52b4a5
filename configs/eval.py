"""Greedy evaluation of policies on the eval split; spa-rl.md §4 and §5.

Policies: "untrained", "sft", "ppo_<mode>" for each mode in ppo.reward_modes.
This is the default config of `python -m spa_jax.main`: the whole chain up to eval.
"""

import ml_collections
from ml_collections import config_dict

from spa_jax.configuration import load_sibling


def eval_section(preset: str) -> ml_collections.ConfigDict:
  base = load_sibling(__file__, "base")
  real = base.is_real(preset)
  return ml_collections.ConfigDict(dict(
      # comma-separated; each one is evaluated and reported (the untrained row is cheap on tiny);
      # "ppo_*" stands for ppo_<mode> of every mode in ppo.reward_modes
      policies="sft,ppo_*" if real or preset == base.SMOLLM2 else "untrained,sft,ppo_*",
      temperature=0.0,
      top_p=1.0,
      max_new_tokens=512 if real else (128 if preset == base.SMOLLM2 else 96),
      # None: the whole eval split. tiny: 64 of the 200 test goals (~2 min on 2 cores for the four
      # policies); on 16 goals one seed's score moves by +-10 points with the goals drawn.
      max_tasks=config_dict.placeholder(int) if real else 64,
  ))


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  cfg = load_sibling(__file__, "ppo").get_config(preset)
  cfg.run.targets = "eval"
  return cfg
