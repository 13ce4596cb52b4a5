"""Explore stage: K sampled episodes per train task from the workspace's SFT policy, on the env pool."""

import pytest

from spa_jax.rollout.trajectory_store import decode_trajectory, open_array_record, read_trajectories
from spa_jax.stages import common, explore
from spa_jax.tracking import read_metrics
from spa_jax.workspace import Workspace


@pytest.mark.slow
def test_explore_writes_k_sampled_trajectories_per_train_task(micro_config):
  cfg = micro_config("explore", {"explore.array_record": True})
  ws = Workspace(cfg.workspace)
  tokenizer = common.load_tokenizer(cfg, ws)
  model_cfg, model = common.init_policy(cfg, tokenizer, common.make_mesh(cfg))
  common.save_policy(ws, "sft", model, model_cfg)  # a random "SFT" policy: explore only reads it

  summary = explore.run(cfg, ws)

  records = read_trajectories(ws, "explore")
  train = set(common.load_catalogue(cfg).split(cfg.env.train_split))
  assert summary["episodes"] == len(records) == 4
  assert sorted((r["task_id"], r["rollout"]) for r in records) == [
      (t, k) for t in common.split_tasks(cfg, cfg.env.train_split, 2) for k in (0, 1)]
  for record in records:
    assert record["task_id"] in train and record["policy"] == "sft"
    assert record["env"]["split"] == "train" and record["env"]["noun_tagger"]
    assert len(record["tokens"]) == len(record["action_mask"]) > 0
    for step in record["steps"]:
      assert 1 <= len(step["token_logprobs"]) <= 16 and max(step["token_logprobs"]) <= 0.0
  # temperature 1: the two rollouts of a task differ somewhere
  outputs = {}
  for record in records:
    outputs.setdefault(record["task_id"], []).append([s["model_output"] for s in record["steps"]])
  assert any(a != b for a, b in outputs.values())
  assert read_metrics(ws.metrics_path("explore"))[0]["episodes"] == 4
  source = open_array_record(summary["outputs"][-1])  # the ArrayRecord copy
  assert sorted(decode_trajectory(source[i])["rollout"] for i in range(len(source))) == [0, 0, 1, 1]
  assert all((ws.root / path).exists() for path in summary["outputs"])


@pytest.mark.slow
def test_a_rerun_replaces_every_shard_of_the_trajectory_set(micro_config):
  cfg = micro_config("explore", {"explore.max_tasks": 1, "explore.samples_per_task": 1})
  ws = Workspace(cfg.workspace)
  stale = ws.trajectories_path("explore", shard=1)  # left by an earlier two-process run
  stale.write_text('{"task_id": 999999, "rollout": 0}\n')
  tokenizer = common.load_tokenizer(cfg, ws)
  model_cfg, model = common.init_policy(cfg, tokenizer, common.make_mesh(cfg))
  common.save_policy(ws, "sft", model, model_cfg)
  explore.run(cfg, ws)
  assert not stale.exists() and [r["task_id"] for r in read_trajectories(ws, "explore")] == \
      common.split_tasks(cfg, cfg.env.train_split, 1)


def test_a_too_small_vocabulary_or_context_is_named_with_the_value_to_pass(micro_config):
  cfg = micro_config("explore", {"tokenizer.vocab_size": 64})
  with pytest.raises(ValueError, match=r"^config.tokenizer.vocab_size=64 is too small .* "
                                       r"pass --config.tokenizer.vocab_size=\d+ or more$"):
    common.load_tokenizer(cfg, Workspace(cfg.workspace))
  cfg = micro_config("explore", {"agent.max_context": 64})
  with pytest.raises(ValueError, match=r"^config.agent.max_context=64 cannot hold an episode's first turn "
                                       r"\(\d+ tokens .*\): pass --config.agent.max_context=\d+ or more$"):
    common.load_tokenizer(cfg, Workspace(cfg.workspace))
