"""A micro version of the tiny pipeline config for stage tests (seconds per stage on CPU)."""

import pytest

from spa_jax import configuration

# config path -> value; applied to a loaded config (`micro_config`) or passed as --config flags.
MICRO = {
    "model.arch.hidden_size": 64, "model.arch.intermediate_size": 128, "model.arch.num_layers": 1,
    "model.arch.num_heads": 2, "model.arch.num_kv_heads": 1, "model.arch.head_dim": 32,
    "sft.expert_episodes": 4, "sft.epochs": 1, "sft.batch_size": 2, "sft.micro_batch_size": 2,
    "sft.checkpoint_every": 1, "env.num_envs": 2, "env.pool_workers": 1,
    "explore.max_tasks": 2, "explore.samples_per_task": 2, "explore.max_new_tokens": 16,
    "eval.max_tasks": 2, "eval.max_new_tokens": 16, "tracking.progress": False,
    "tracking.tensorboard": False,
}


def apply(cfg, overrides: dict):
  """Sets each path whose section the config has (a stage config lacks its dependents' sections)."""
  for path, value in overrides.items():
    if path.split(".")[0] not in cfg:
      continue
    *parents, key = path.split(".")
    node = cfg
    for parent in parents:
      node = node[parent]
    node[key] = value
  return cfg


def as_flags(overrides: dict) -> list[str]:
  return [f"--config.{path}={value}" for path, value in overrides.items()]


@pytest.fixture
def micro_config(tmp_path):
  """`make(stage, **{"a.b": v})`: configs/<stage>.py with MICRO and the overrides, workspace in tmp."""
  def make(stage: str = "eval", overrides: dict | None = None):
    cfg = configuration.load_config(stage)
    cfg.workspace = str(tmp_path / "ws")
    return configuration.validate(apply(cfg, {**MICRO, **(overrides or {})}))
  return make
