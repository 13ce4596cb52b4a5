"""Entry point: `python -m spa_jax.main [--config=configs/<stage>.py[:preset]] [--config.x.y=v] [--workdir=DIR]`.

With no arguments it runs the whole chain sft -> explore -> prm -> label -> ppo -> eval on the
embedded catalogue with the tiny model (configs/eval.py:tiny), in runs/default.
Stages already done with the same config are reused; see WORKSPACE.md.
"""

import contextlib
import json
import logging
import sys
from typing import Sequence

from absl import app, flags
import ml_collections
from ml_collections import config_flags

from spa_jax import configuration, distributed, host_memory, pipeline, user_cache
from spa_jax.errors import InputFileError
from spa_jax.workspace import Workspace, WorkspaceBusy
from webshop.errors import DataFileError

QUIET_LIBRARIES = ("orbax",)  # their INFO lines drown the run's own; warnings still show


class _QuietLibraries(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or not any(f"/{lib}/" in record.pathname for lib in QUIET_LIBRARIES)

DEFAULT_CONFIG = str(configuration.CONFIGS_DIR / "eval.py")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  config_flags.DEFINE_config_file(
      "config", DEFAULT_CONFIG, "Stage config file, optionally with ':<preset>'.",
      flag_values=flag_values, lock_config=True)
  flags.DEFINE_string("workdir", None, "Run workspace; overrides config.workspace.",
                      flag_values=flag_values)


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing where a bad flag (e.g. a mistyped --config.<field>) exits with one line, not a traceback."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError) as error:  # ml_collections raises the last two for unknown fields
    while error.args and isinstance(error.args[0], Exception):
      error = error.args[0]
    detail = " ".join(str(error.args[0] if error.args else error).split())
    sys.exit(f"FATAL Flags parsing error: {detail} (the fields are those of the --config file, configs/<stage>.py)")


def resolve_config(flag_values: flags.FlagValues = flags.FLAGS) -> ml_collections.ConfigDict:
  """The parsed config with --workdir applied, validated (raises ValueError naming each problem)."""
  cfg = flag_values.config
  if flag_values.workdir:
    cfg.workspace = flag_values.workdir
  return configuration.validate(cfg)


def resolve_weights(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Sets model.hf_path to model.gguf's HF directory, imported once into the cache (when hf_path is unset)."""
  if cfg.model.gguf and not cfg.model.hf_path:
    from spa_jax.models.gguf_import import cached_import
    cfg.model.hf_path = str(cached_import(cfg.model.gguf))
  return cfg


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}; settings go in --config.<field>=<value>.")
  try:
    cfg = resolve_weights(resolve_config())
  except (ValueError, FileNotFoundError) as error:
    raise app.UsageError(str(error)) from error
  for handler in logging.getLogger().handlers + logging.getLogger("absl").handlers:
    handler.addFilter(_QuietLibraries())
  if cfg.run.compilation_cache:
    logging.info("XLA compilation cache: %s", user_cache.enable_compilation_cache())
  distributed.initialize(cfg.distributed)
  ws = Workspace(cfg.workspace)
  try:  # process 0 holds the workspace for the whole run; the run's other processes follow it
    with ws.lock() if distributed.is_main_process() else contextlib.nullcontext():
      run(cfg, ws)
  except (WorkspaceBusy, InputFileError, DataFileError) as error:  # their messages name the fix
    sys.exit(f"FATAL {error}")


def run(cfg: ml_collections.ConfigDict, ws: Workspace) -> None:
  """Runs the pipeline in `ws` and prints the evaluation table when eval is a target."""
  if distributed.is_main_process():
    ws.write_config(cfg.to_dict())
  summaries = pipeline.run_pipeline(cfg, ws)
  for stage, summary in summaries.items():
    logging.info("%s: %s", stage, summary)
  if "eval" in configuration.split_names(cfg.run.targets) and distributed.is_main_process():
    print_eval_table(ws)


def print_eval_table(ws: Workspace) -> None:
  """Prints reports/eval.json as the final table (also when eval was reused, not rerun)."""
  from spa_jax.stages.eval import REPORT, format_table
  report = json.loads(ws.report_path(REPORT).read_text())
  print(f"\nEvaluation on {report['split']} ({report['tasks']} tasks, workspace {ws.root}):")
  print(format_table(report["policies"], report.get("order")), flush=True)


if __name__ == "__main__":
  host_memory.reexec_with_huge_pages()
  define_flags()
  app.run(main, flags_parser=parse_flags)
