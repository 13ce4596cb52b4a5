"""Step rewards r_t = progress_coef * c_t + grounding_coef * g_t; spa-rl.md §1 and §7.1-7.3."""

import ml_collections

from spa_jax.configuration import load_sibling


def label_section() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      progress_coef=1.0,  # alpha
      # beta (the released code's). It pays per valid step, so with beta * env.max_steps above the
      # final reward's 1, ten valid steps without a purchase earn more than a perfect purchase: only
      # the KL penalty keeps a policy from stalling (bench/RESULTS.md, 2026-12-06).
      grounding_coef=0.5,
      # "bonus": + beta for a valid step (the paper's beta * g_t); "penalty": - beta for an invalid one
      # and nothing for a valid one (the same per-step preference, no payment for longer episodes)
      grounding_form="bonus",
  ))


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  cfg = load_sibling(__file__, "prm").get_config(preset)
  cfg.run.targets = "label"
  cfg.label = label_section()
  return cfg
