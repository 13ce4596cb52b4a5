"""Stage resolution through the workspace, with fake stages that record their calls."""

import json

import pytest

from spa_jax import configuration, pipeline
from spa_jax.workspace import Workspace


class FakeStages(dict):
  """Stage functions that write one output file and log the order they ran in."""

  def __init__(self):
    super().__init__({name: self._make(name) for name in configuration.STAGES})
    self.calls: list[str] = []

  def _make(self, name):
    def run(cfg, ws):
      self.calls.append(name)
      out = ws.stage_dir(name) / "out.txt"
      out.write_text(name)
      return {"outputs": [str(out)], "value": len(self.calls)}
    return run


@pytest.fixture
def cfg(tmp_path):
  cfg = configuration.load_config("export")
  cfg.run.targets = "eval"
  cfg.workspace = str(tmp_path / "ws")
  return cfg


def run(cfg, stages):
  stages.calls.clear()
  pipeline.run_pipeline(cfg, Workspace(cfg.workspace), stages)
  return list(stages.calls)


def test_default_target_runs_the_whole_chain_in_dependency_order(cfg):
  stages = FakeStages()
  assert run(cfg, stages) == ["sft", "explore", "prm", "label", "ppo", "eval"]
  done = Workspace(cfg.workspace).done_record("eval")
  assert done["summary"]["value"] == 6
  assert set(done["inputs"]) == {"sft", "ppo"}
  assert json.loads((Workspace(cfg.workspace).root / "eval" / "config.json").read_text())["eval"]["policies"] == cfg.eval.policies


def test_current_stages_are_not_redone(cfg):
  stages = FakeStages()
  run(cfg, stages)
  assert run(cfg, stages) == []


def test_config_change_redoes_the_stage_and_everything_downstream_only(cfg):
  stages = FakeStages()
  run(cfg, stages)
  cfg.explore.temperature = 0.7
  assert run(cfg, stages) == ["explore", "prm", "label", "ppo", "eval"]
  cfg.eval.max_new_tokens = 32
  assert run(cfg, stages) == ["eval"]


def test_shared_section_change_redoes_everything(cfg):
  stages = FakeStages()
  run(cfg, stages)
  cfg.env.max_steps = 7
  assert run(cfg, stages) == ["sft", "explore", "prm", "label", "ppo", "eval"]


def test_missing_output_or_done_record_reruns_that_stage(cfg):
  stages = FakeStages()
  run(cfg, stages)
  ws = Workspace(cfg.workspace)
  (ws.root / "prm" / "out.txt").unlink()
  assert run(cfg, stages) == ["prm", "label", "ppo", "eval"]
  (ws.root / "eval" / "DONE.json").unlink()
  assert run(cfg, stages) == ["eval"]


def test_target_whose_inputs_are_missing_runs_only_what_it_needs(cfg):
  stages = FakeStages()
  cfg.eval.policies = "sft"
  assert run(cfg, stages) == ["sft", "eval"]
  cfg.run.targets = "export"
  cfg.export.policy = "sft"
  assert run(cfg, stages) == ["export"]
  cfg.export.policy = "untrained"
  assert pipeline.dependencies("export", cfg) == ()


def test_eval_depends_on_the_stages_of_its_policies(cfg):
  cfg.eval.policies = "untrained,sft,ppo_sparse,ppo_spa"
  assert pipeline.dependencies("eval", cfg) == ("sft", "ppo")
  cfg.eval.policies = "untrained"
  assert pipeline.dependencies("eval", cfg) == ()


def test_ppo_needs_the_estimator_only_for_spa_rewards_an_estimator_critic_or_offline_data(cfg):
  cfg.eval.policies = "sft,ppo_sparse"
  cfg.ppo.reward_modes = "sparse,grounding_only"
  assert pipeline.dependencies("ppo", cfg) == ("sft",)
  assert run(cfg, FakeStages()) == ["sft", "ppo", "eval"]
  for setting, value in (("reward_modes", "sparse,spa"), ("critic_init", "prm"), ("mode", "offline")):
    changed = cfg.copy_and_resolve_references()
    changed.ppo[setting] = value
    assert pipeline.dependencies("ppo", changed) == ("label",), setting


def test_force_reruns_a_current_stage_and_its_dependents(cfg):
  stages = FakeStages()
  run(cfg, stages)
  cfg.run.force = "label"
  assert run(cfg, stages) == ["label", "ppo", "eval"]


def test_failed_stage_leaves_no_done_record_and_is_retried(cfg):
  stages = FakeStages()
  run(cfg, stages)
  cfg.prm.learning_rate = 1e-4
  working_prm = stages["prm"]

  def broken(cfg, ws):
    raise RuntimeError("boom")

  stages["prm"] = broken
  with pytest.raises(RuntimeError):
    run(cfg, stages)
  assert Workspace(cfg.workspace).done_record("prm") is None
  stages["prm"] = working_prm
  assert run(cfg, stages) == ["prm", "label", "ppo", "eval"]
