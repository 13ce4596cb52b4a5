"""Eval stage: greedy episodes per policy on the eval split, report, bar chart and table."""

import json

import pytest

from spa_jax.rollout.trajectory_store import read_trajectories
from spa_jax.stages import common, eval as eval_stage
from spa_jax.workspace import Workspace


@pytest.mark.slow
def test_eval_reports_every_policy_on_the_eval_split(micro_config):
  cfg = micro_config("eval", {"eval.policies": "untrained,sft"})
  ws = Workspace(cfg.workspace)
  tokenizer = common.load_tokenizer(cfg, ws)
  model_cfg, model = common.init_policy(cfg, tokenizer, common.make_mesh(cfg))
  common.save_policy(ws, "sft", model, model_cfg)  # the untrained weights saved as "sft"

  summary = eval_stage.run(cfg, ws)

  report = json.loads(ws.report_path("eval").read_text())
  assert report["order"] == ["untrained", "sft"] and report["tasks"] == 2
  assert report["env"]["split"] == "test" and report["env"]["noun_tagger"] and report["env"]["search_backend"]
  test_tasks = set(common.split_tasks(cfg, "test", 2))
  for policy in ("untrained", "sft"):
    metrics = report["policies"][policy]
    assert metrics["episodes"] == 2 and 0 <= metrics["score"] <= 100 and 1 <= metrics["mean_steps"] <= 10
    records = read_trajectories(ws, f"eval_{policy}")
    assert {r["task_id"] for r in records} == test_tasks
  # the same weights under two names, decoded greedily: identical episodes and metrics
  assert report["policies"]["untrained"] == report["policies"]["sft"]
  outputs = [[s["model_output"] for s in r["steps"]] for r in read_trajectories(ws, "eval_untrained")]
  assert outputs == [[s["model_output"] for s in r["steps"]] for r in read_trajectories(ws, "eval_sft")]
  assert ws.plot_path("eval").stat().st_size > 0
  assert summary["sft_score"] == metrics["score"]
  table = eval_stage.format_table(report["policies"], report["order"]).splitlines()
  assert table[0].split()[:3] == ["policy", "score", "SR"] and table[2].startswith("untrained")


def test_table_lists_policies_in_order_with_one_decimal():
  table = eval_stage.format_table(
      {"sft": {"score": 51.25, "success_rate": 20.0, "purchase_rate": 90.0, "grounding": 80.0,
               "mean_steps": 5.5, "episodes": 16},
       "ppo_spa": {"score": 60.0, "success_rate": 30.0, "purchase_rate": 95.0, "grounding": 85.0,
                   "mean_steps": 5.0, "episodes": 16}}, ["ppo_spa", "sft"]).splitlines()
  assert table[2].split() == ["ppo_spa", "60.0", "30.0", "95.0", "85.0", "5.0", "16", "0"]
  assert table[3].split() == ["sft", "51.2", "20.0", "90.0", "80.0", "5.5", "16", "0"]


def _record(task_id: int, reward: float, termination: str) -> dict:
  steps = [{"valid": True}] * (3 if termination == "purchase" else 1)
  return {"task_id": task_id, "final_reward": reward, "success": reward == 1.0,
          "purchased": termination == "purchase", "num_steps": len(steps), "steps": steps,
          "termination": termination}


def test_episodes_lost_to_a_failed_env_are_counted_apart_and_left_out_of_the_scores():
  records = [_record(0, 1.0, "purchase"), _record(1, 0.5, "purchase"), _record(2, 0.0, "env_failed")]
  metrics = eval_stage.policy_metrics(records)
  assert metrics["failed"] == 1 and metrics["episodes"] == 2
  assert metrics["score"] == 75.0 and metrics["success_rate"] == 50.0 and metrics["mean_steps"] == 3.0
  header, _, row = eval_stage.format_table({"sft": metrics}).splitlines()
  assert header.split()[-2:] == ["episodes", "failed"] and row.split()[-2:] == ["2", "1"]
  assert eval_stage.policy_metrics([_record(0, 0.0, "env_failed")]) == {"episodes": 0, "failed": 1}
