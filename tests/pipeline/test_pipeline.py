"""Stage resolution through the workspace, with fake stages that record their calls."""

import hashlib
import json

import pytest

from spa_jax import configuration, pipeline
from spa_jax.digests import DigestCache
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


def test_ppo_seed_redoes_ppo_only_and_its_time_budget_nothing(cfg):
  stages = FakeStages()
  run(cfg, stages)
  cfg.ppo.seed = 3  # PPO seeds share the SFT policy, exploration and estimator of config.seed
  assert run(cfg, stages) == ["ppo", "eval"]
  cfg.ppo.time_budget_s = 60.0  # bounds how long a run goes on, not what it computes
  assert run(cfg, stages) == []
  cfg.ppo.eval_every, cfg.ppo.eval_tasks = 5, 100  # the held-out evaluation only watches
  assert run(cfg, stages) == []


def test_memory_for_compute_settings_redo_nothing(cfg):
  stages = FakeStages()
  run(cfg, stages)
  cfg.model.remat_policy = "full" if cfg.model.remat_policy != "full" else "none"
  cfg.model.scan_layers = not cfg.model.scan_layers
  assert run(cfg, stages) == []


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
  cfg.prm.learning_rate *= 2  # a config change: prm and its dependents are due again
  working_prm = stages["prm"]

  def broken(cfg, ws):
    raise RuntimeError("boom")

  stages["prm"] = broken
  with pytest.raises(RuntimeError):
    run(cfg, stages)
  assert Workspace(cfg.workspace).done_record("prm") is None
  stages["prm"] = working_prm
  assert run(cfg, stages) == ["prm", "label", "ppo", "eval"]


ALL_STAGES = ["sft", "explore", "prm", "label", "ppo", "eval"]


def test_a_split_file_edited_in_place_redoes_the_stages_that_read_it(cfg, tmp_path):
  split = tmp_path / "eval_indices.json"
  split.write_text("[0, 1, 2]")
  cfg.env.eval_split = f"file:{split}"
  stages = FakeStages()
  assert run(cfg, stages) == ALL_STAGES
  assert run(cfg, stages) == []
  split.write_text("[3, 4]")  # env is a section every stage reads, so its files count for every stage
  assert run(cfg, stages) == ALL_STAGES
  done = Workspace(cfg.workspace).done_record("eval")
  assert done["files"] == {"env.eval_split": hashlib.sha256(b"[3, 4]").hexdigest()}


def test_replaced_webshop_data_and_sft_data_files_redo_their_stages(cfg, tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  (data / "items_shuffle_9.json").write_text("[]")
  (data / "items_ins_v2_9.json").write_text("{}")
  cfg.env.catalogue, cfg.env.data_dir, cfg.env.eval_split = "dir", str(data), "paper_test"
  sft_data = tmp_path / "webshop_sft.json"
  sft_data.write_text("[]")
  cfg.sft.data = str(sft_data)
  stages = FakeStages()
  assert run(cfg, stages) == ALL_STAGES
  (data / "items_ins_v2_9.json").write_text('{"B0": {}}')
  assert run(cfg, stages) == ALL_STAGES
  sft_data.write_text('[{"id": 1}]')
  assert run(cfg, stages) == ALL_STAGES  # sft and everything downstream of it
  assert set(Workspace(cfg.workspace).done_record("sft")["files"]) == {
      "env.data_dir:items_shuffle_9.json", "env.data_dir:items_ins_v2_9.json", "sft.data"}
  assert set(Workspace(cfg.workspace).done_record("explore")["files"]) == {
      "env.data_dir:items_shuffle_9.json", "env.data_dir:items_ins_v2_9.json"}


def test_an_output_whose_content_changed_is_not_reused(cfg):
  """A truncated output (e.g. policies/sft/model.safetensors) is caught by its digest, even though it exists."""
  stages = FakeStages()
  run(cfg, stages)
  ws = Workspace(cfg.workspace)
  assert ws.done_record("prm")["outputs"] == {"prm/out.txt": hashlib.sha256(b"prm").hexdigest()}
  (ws.root / "prm" / "out.txt").write_text("pr")
  assert run(cfg, stages) == ["prm", "label", "ppo", "eval"]
  (ws.root / "prm" / "DONE.json").write_text('{"stage": "prm", "fingerp')  # an unreadable record: redo
  assert run(cfg, stages) == ["prm", "label", "ppo", "eval"]


def test_digests_are_cached_per_file_stat_and_follow_every_write(tmp_path):
  path = tmp_path / "weights.bin"
  path.write_bytes(b"abc")
  cache = DigestCache(tmp_path / "cache" / "digests.json")
  assert cache.digest(path) == hashlib.sha256(b"abc").hexdigest()
  cache.save()
  assert DigestCache(cache.path).digest(path) == hashlib.sha256(b"abc").hexdigest()
  entries = json.loads(cache.path.read_text())
  entries[str(path.resolve())]["sha256"] = "cached"  # stands for a hash not recomputed while the stat holds
  cache.path.write_text(json.dumps(entries))
  assert DigestCache(cache.path).digest(path) == "cached"
  path.write_bytes(b"ab")
  assert DigestCache(cache.path).digest(path) == hashlib.sha256(b"ab").hexdigest()
  (tmp_path / "dir").mkdir()
  (tmp_path / "dir" / "a.json").write_text("1")
  before = cache.digest(tmp_path / "dir")
  (tmp_path / "dir" / ".hidden").write_text("ignored")
  assert cache.digest(tmp_path / "dir") == before
  (tmp_path / "dir" / "b.json").write_text("2")
  assert cache.digest(tmp_path / "dir") != before
