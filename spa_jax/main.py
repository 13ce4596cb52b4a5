"""Entry point: `python -m spa_jax.main [--config=configs/<stage>.py[:preset]] [--config.x.y=v] [--workdir=DIR]`.

With no arguments it runs the whole chain sft -> explore -> prm -> label -> ppo -> eval on the
embedded catalogue with the tiny model (configs/eval.py:tiny), in runs/default.
Stages already done with the same config are reused; see WORKSPACE.md.
"""

import logging
from typing import Sequence

from absl import app, flags
import ml_collections
from ml_collections import config_flags

from spa_jax import configuration, distributed, pipeline
from spa_jax.workspace import Workspace

DEFAULT_CONFIG = str(configuration.CONFIGS_DIR / "eval.py")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  config_flags.DEFINE_config_file(
      "config", DEFAULT_CONFIG, "Stage config file, optionally with ':<preset>'.",
      flag_values=flag_values, lock_config=True)
  flags.DEFINE_string("workdir", None, "Run workspace; overrides config.workspace.",
                      flag_values=flag_values)


def resolve_config(flag_values: flags.FlagValues = flags.FLAGS) -> ml_collections.ConfigDict:
  """The parsed config with --workdir applied, validated (raises ValueError naming each problem)."""
  cfg = flag_values.config
  if flag_values.workdir:
    cfg.workspace = flag_values.workdir
  return configuration.validate(cfg)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}; settings go in --config.<field>=<value>.")
  try:
    cfg = resolve_config()
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  distributed.initialize(cfg.distributed)
  ws = Workspace(cfg.workspace)
  if distributed.is_main_process():
    ws.write_config(cfg.to_dict())
  summaries = pipeline.run_pipeline(cfg, ws)
  for stage, summary in summaries.items():
    logging.info("%s: %s", stage, summary)


if __name__ == "__main__":
  define_flags()
  app.run(main)
