"""Exploration: sample rollouts of the SFT policy on the train tasks; spa-rl.md §2.2 and §4."""

import ml_collections
from ml_collections import config_dict

from spa_jax.configuration import load_sibling


def explore_section(preset: str) -> ml_collections.ConfigDict:
  base = load_sibling(__file__, "base")
  real = base.is_real(preset)
  cfg = ml_collections.ConfigDict(dict(
      samples_per_task=5 if real else 2,
      temperature=1.0,
      top_p=1.0,
      max_new_tokens=512 if real else 96,
      max_tasks=config_dict.placeholder(int) if real else 16,  # None: the whole train split
      array_record=False,  # also write a tensorflow-datasets ArrayRecord copy (arrayrecord/explore)
  ))
  if preset == base.SMOLLM2:  # one GPU: 256 train goals x 4 samples; a ReAct reply is ~30-60 tokens
    cfg.update(dict(samples_per_task=4, max_new_tokens=128, max_tasks=256))
  return cfg


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  cfg = load_sibling(__file__, "sft").get_config(preset)
  cfg.run.targets = "explore"
  cfg.explore = explore_section(cfg.preset)
  return cfg
