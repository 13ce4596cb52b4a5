"""Trajectory shards and the ArrayRecord round trip."""

import numpy as np

from spa_jax.rollout import agent_format as af
from spa_jax.rollout import trajectory_store as store
from spa_jax.workspace import Workspace


def record(task, rollout, reward):
  return {"task_id": task, "rollout": rollout, "final_reward": reward,
          "steps": [{"observation": "Observation:\nx", "model_output": "Action: click[a]"}]}


def test_shards_of_several_processes_read_back_as_one_ordered_set(tmp_path):
  ws = Workspace(tmp_path)
  with store.TrajectoryWriter(ws, "explore", shard=1) as writer:
    writer(record(2, 0, 1.0))
    writer(record(0, 1, 0.5))
  with store.TrajectoryWriter(ws, "explore", shard=0) as writer:
    writer(record(0, 0, 0.0))
  assert [p.name for p in ws.trajectory_shards("explore")] == ["explore.p0.jsonl", "explore.p1.jsonl"]
  assert [(r["task_id"], r["rollout"]) for r in store.read_trajectories(ws, "explore")] == [(0, 0), (0, 1), (2, 0)]


def test_trajectory_array_record_round_trip(tmp_path):
  records = [record(task, k, task / 10) for task in range(5) for k in range(2)]
  dataset_dir = store.write_array_record(Workspace(tmp_path).array_record_dir("explore"), "trajectory", records)
  source = store.open_array_record(dataset_dir)
  assert len(source) == len(records)
  assert [store.decode_trajectory(source[i]) for i in range(len(source))] == records
  assert int(source[3]["task_id"]) == 1 and np.isclose(source[3]["final_reward"], 0.1)
  assert list(store.process_slice(len(source))) == list(range(len(source)))  # one process: everything


def test_sft_array_record_round_trip(tmp_path):
  examples = [af.SftExample(ids=list(range(n)), loss_mask=[0] * (n - 2) + [1, 1],
                            step_mask=[0] * (n - 1) + [1], step_ends=[n - 1]) for n in (4, 7)]
  source = store.open_array_record(store.write_array_record(tmp_path / "sft", "sft", examples))
  for i, example in enumerate(examples):
    assert np.asarray(source[i]["ids"]).tolist() == example.ids
    assert np.asarray(source[i]["loss_mask"]).tolist() == example.loss_mask
    assert np.asarray(source[i]["step_ends"]).tolist() == example.step_ends
