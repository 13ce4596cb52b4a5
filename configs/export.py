"""Export a trained policy as HF safetensors (LoRA merged) with its tokenizer."""

import ml_collections
from ml_collections import config_dict

from spa_jax.configuration import load_sibling


def export_section() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      policy="ppo_spa",  # "untrained" | "sft" | "ppo_<mode>"
      out_dir=config_dict.placeholder(str),  # default: <workspace>/export/hf
  ))


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  cfg = load_sibling(__file__, "eval").get_config(preset)
  cfg.run.targets = "export"
  cfg.export = export_section()
  return cfg
