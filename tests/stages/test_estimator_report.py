"""bench/estimator_report.py on the stage tests' workspace: it recomputes the label and prm stages'
figures from the files alone, and PPO's first-update advantages as ppo_targets makes them."""

import math
import pathlib
import sys

import pytest

from spa_jax.rollout.trajectory_store import read_trajectories
from spa_jax.stages import common, label, prm
from spa_jax.workspace import Workspace
from spa_workspace import make_config, workspace_copy

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))
import estimator_report  # noqa: E402


def test_estimator_report_recomputes_the_stage_figures(tmp_path_factory, tmp_path):
  ws = Workspace(workspace_copy(tmp_path_factory, tmp_path))
  cfg = make_config(ws.root)
  labelled = label.run(cfg, ws)
  result = estimator_report.report(ws, cfg, read_trajectories(ws, prm.EXPLORE), common.load_tokenizer(cfg, ws))
  assert (result["trajectories"], result["train"], result["heldout"]) == (12, 9, 3)
  assert result["heldout_fit"]["mse"] == pytest.approx(labelled["heldout_mse"], rel=1e-5)
  baseline = ws.done_record("prm")["summary"]["heldout_baseline_r2"]
  assert (math.isnan(result["heldout_baseline_r2"]) if baseline is None
          else result["heldout_baseline_r2"] == pytest.approx(baseline))
  # per task: the expert's purchase (0 ungrounded), its first step alone and the damaged copy (2)
  assert result["reward_by_ungrounded"][2] == [4, 0.0]
  assert sum(n for n, _ in result["reward_by_ungrounded"].values()) == 12
  # sparse: only the held-out purchase earns a reward, so after whitening the other two trajectories'
  # last steps are below 0 and the purchase's is above
  assert result["first_update"]["sparse"]["last_step_negative_share"] == pytest.approx(2 / 3)
  assert set(result["first_update"]) == {"spa", "spa_penalty", "sparse", "grounding_only", "grounding_only_penalty"}
  # the penalty form differs from the bonus by a constant per step (beta), which GAE turns into a
  # return-to-go that shrinks toward the last step: the bonus form's last steps sit lower
  bonus, penalty = result["first_update"]["grounding_only"], result["first_update"]["grounding_only_penalty"]
  assert bonus["last_step"] < penalty["last_step"] and bonus["first_step"] > penalty["first_step"]
  prm_summary = ws.done_record("prm")["summary"]
  assert result["probe"]["probe_heldout_r2"] == prm_summary["probe_heldout_r2"]
  assert f"held-out R^2 {prm_summary['probe_heldout_r2']:.3f}." in estimator_report.markdown(result)
  # one held-out goal: no interval over goals, as in the prm stage's summary
  assert math.isnan(result["heldout_r2_ci95"][0]) and prm_summary["heldout_r2_ci95"] == [None, None]
