"""ppo stage: an online iteration changes the policy, a crashed run resumes from its checkpoint to
the uninterrupted result, and offline PPO trains on the label stage's rewards."""

import numpy as np
import pytest
from safetensors.numpy import load_file

from spa_jax.stages import label, ppo
from spa_jax.tracking import read_metrics
from spa_jax.workspace import Workspace
from spa_workspace import make_config, workspace_copy

ONLINE = {"env.max_steps": 3}


def _weights(ws: Workspace, policy: str) -> dict[str, np.ndarray]:
  return load_file(str(ws.root / "policies" / policy / "model.safetensors"))


@pytest.mark.slow
def test_online_ppo_changes_the_policy_and_resumes_after_a_crash(tmp_path_factory, tmp_path, monkeypatch):
  straight = Workspace(workspace_copy(tmp_path_factory, tmp_path / "straight"))
  crashed = Workspace(workspace_copy(tmp_path_factory, tmp_path / "crashed"))
  summary = ppo.run(make_config(straight.root, ONLINE), straight)
  assert summary["resumed"] == {"spa": False}
  rows = read_metrics(straight.metrics_path("ppo_spa"))
  assert [row["step"] for row in rows] == [1, 2]
  for key in ("policy_loss", "value_loss", "kl", "clip_frac", "score", "task_return", "kl_coef"):
    assert np.isfinite(rows[-1][key])
  assert rows[0]["trajectories"] == 2 and rows[0]["skipped"] == 0.0
  sft, trained = _weights(straight, "sft"), _weights(straight, "ppo_spa")
  assert sft.keys() == trained.keys()
  changed = [k for k in sft if not np.array_equal(sft[k], trained[k])]
  assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed)  # LoRA q, v merged
  assert straight.plot_path("ppo_spa").exists()

  real_update = ppo.update

  def crash_in_second_iteration(shared, step_fn, state, batch, iteration):
    if iteration == 1:
      raise RuntimeError("simulated crash")
    return real_update(shared, step_fn, state, batch, iteration)

  monkeypatch.setattr(ppo, "update", crash_in_second_iteration)
  with pytest.raises(RuntimeError, match="simulated crash"):
    ppo.run(make_config(crashed.root, ONLINE), crashed)
  assert [row["step"] for row in read_metrics(crashed.metrics_path("ppo_spa"))] == [1]
  monkeypatch.setattr(ppo, "update", real_update)
  resumed = ppo.run(make_config(crashed.root, ONLINE), crashed)
  assert resumed["resumed"] == {"spa": True}
  assert [row["step"] for row in read_metrics(crashed.metrics_path("ppo_spa"))] == [1, 2]
  again = _weights(crashed, "ppo_spa")
  for key in trained:
    np.testing.assert_array_equal(again[key], trained[key], err_msg=key)


@pytest.mark.slow
def test_offline_ppo_trains_on_the_label_stage_rewards(tmp_path_factory, tmp_path):
  ws = Workspace(workspace_copy(tmp_path_factory, tmp_path))
  overrides = {"ppo.mode": "offline", "ppo.reward_modes": "sparse,spa", "ppo.iterations": 1,
               "ppo.rollouts_per_iteration": 3, "ppo.mini_batch_size": 1,
               "eval.policies": "ppo_sparse,ppo_spa"}
  cfg = make_config(ws.root, overrides)
  label.run(cfg, ws)
  labels = label.read_labels(ws)
  assert len(labels) == 3  # the held-out task's three trajectories
  summary = ppo.run(cfg, ws)
  spa, sparse = read_metrics(ws.metrics_path("ppo_spa"))[0], read_metrics(ws.metrics_path("ppo_sparse"))[0]
  spa_return = np.mean([sum(row["reward"] for row in rows) for rows in labels.values()])
  final = np.mean([rows[0]["final_reward"] for rows in labels.values()])
  assert spa["task_return"] == pytest.approx(spa_return, abs=1e-5)
  assert sparse["task_return"] == pytest.approx(final, abs=1e-6)
  assert summary["spa_task_return"] == pytest.approx(spa_return, abs=1e-5)
  assert not np.array_equal(_weights(ws, "ppo_spa")["model.layers.0.self_attn.q_proj.weight"],
                            _weights(ws, "sft")["model.layers.0.self_attn.q_proj.weight"])


def test_config_errors_name_the_setting(tmp_path):
  cfg = make_config(tmp_path / "ws", {"ppo.rollouts_per_iteration": 3, "ppo.mode": "replay"})
  with pytest.raises(ValueError, match=r"ppo.mode='replay'.*\n.*rollouts_per_iteration=3 must be a multiple"):
    ppo.check_config(cfg)
