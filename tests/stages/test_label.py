"""label stage: r_t = alpha c_t + beta g_t from the trained estimator's own outputs, out of sample."""

import json

import numpy as np
import pytest

from spa_jax.stages import common, label, prm
from spa_jax.workspace import Workspace
from spa_workspace import expert_records, make_config, workspace_copy


@pytest.fixture
def workspace(tmp_path_factory, tmp_path):
  return workspace_copy(tmp_path_factory, tmp_path)


def test_label_formula_on_real_estimator_outputs(workspace):
  cfg = make_config(workspace)
  ws = Workspace(workspace)
  tokenizer, mesh = common.load_tokenizer(cfg, ws), common.make_mesh(cfg)
  records = expert_records(cfg)[:3]
  one_step, invalid = records[1], records[2]
  assert one_step["num_steps"] == 1 and [s["valid"] for s in invalid["steps"]][:2] == [False, False]
  sequences, _ = prm.load_sequences([one_step, invalid], tokenizer, cfg.prm.max_len)
  progress = prm.estimate_progress(prm.load_estimator(cfg, ws, mesh), sequences,
                                   **prm.estimator_forward(cfg, tokenizer, mesh))
  assert [len(progress[s.key]) for s in sequences] == [1, invalid["num_steps"]]
  assert np.abs(np.concatenate(list(progress.values()))).max() > 1e-4  # a trained head, not zeros

  rows = label.label_sequences(sequences, progress, alpha=0.7, beta=0.5)
  assert len(rows) == 1 + invalid["num_steps"]
  assert [(r["trajectory"], r["step"]) for r in rows[:3]] == [(sequences[0].key, 0), (sequences[1].key, 0),
                                                             (sequences[1].key, 1)]
  for row in rows:
    c_t = float(progress[row["trajectory"]][row["step"]])
    g_t = 1.0 if row["grounding"] else 0.0
    assert row["progress"] == pytest.approx(c_t) and row["reward"] == pytest.approx(0.7 * c_t + 0.5 * g_t, abs=1e-6)
  assert [r["grounding"] for r in rows[1:3]] == [0.0, 0.0]  # invalid actions: progress only
  assert rows[0]["final_reward"] == 0.0 and rows[0]["num_steps"] == 1  # no (T - t - 1) factor, no zeroed last step


def test_label_stage_labels_only_held_out_trajectories(workspace):
  cfg = make_config(workspace, {"label.grounding_coef": 0.25})
  ws = Workspace(workspace)
  summary = label.run(cfg, ws)
  heldout = set(json.loads((ws.root / "prm" / "split.json").read_text())["heldout"])
  labels = label.read_labels(ws)
  expected = {f"{r['task_id']}:{r['rollout']}": r for r in expert_records(cfg) if r["task_id"] in heldout}
  assert set(labels) == set(expected) and summary["trajectories"] == len(expected)
  for key, rows in labels.items():
    assert [r["step"] for r in rows] == list(range(expected[key]["num_steps"]))
    assert [r["grounding"] for r in rows] == [float(s["valid"]) for s in expected[key]["steps"]]
    for r in rows:
      assert r["reward"] == pytest.approx(r["progress"] + 0.25 * r["grounding"], abs=1e-6)
      assert r["final_reward"] == expected[key]["final_reward"]
  assert summary["steps"] == sum(len(rows) for rows in labels.values())
