"""prm stage: trajectory sequences (agent actions only), task-level held-out split, training with
held-out metrics, estimator export and reload, checkpoint resume."""

import json
import logging
import types

import numpy as np
import pytest

from spa_jax.rollout import agent_format as af
from spa_jax.rollout.trajectory_store import TrajectoryWriter
from spa_jax.stages import common, prm
from spa_jax.training.batch import steps_from_action_mask
from spa_jax.tracking import read_metrics
from spa_jax.workspace import Workspace
from spa_workspace import expert_records, make_config, workspace_copy


@pytest.fixture
def workspace(tmp_path_factory, tmp_path):
  return workspace_copy(tmp_path_factory, tmp_path)


def test_sequences_have_one_step_per_agent_action_never_the_prompt_turns(tmp_path):
  cfg = make_config(tmp_path / "ws", {"agent.one_shot": True})
  tokenizer = common.load_tokenizer(cfg, Workspace(cfg.workspace))
  records = expert_records(cfg)[:3]
  for record in records:
    record["one_shot"] = True  # instruction, "OK" and four demonstration turns before the episode
    sequence = prm.trajectory_sequence(record, tokenizer)
    assert sequence.num_steps == record["num_steps"]
    _, _, end_s = steps_from_action_mask(sequence.action_mask, max_steps=10)
    ends = end_s[end_s >= 0]
    assert len(ends) == record["num_steps"]  # the demo's and "OK"'s assistant turns are not steps
    assert all(sequence.tokens[i] == tokenizer.end_of_turn_id for i in ends)  # c_t is read at each action's end
    assert ends[-1] == len(sequence.tokens) - 1  # the sequence ends with the last action
    actions = [tokenizer.decode([t for t, m in zip(sequence.tokens, sequence.action_mask) if m])]
    assert af.ACKNOWLEDGEMENT + "\n" not in actions[0] and "Action:" in actions[0]


def test_recorded_tokens_cut_after_the_last_completed_step():
  # an episode ended by the context limit mid-generation: 2 steps, 3 action spans in the mask; step 0
  # ended at a stop string (its end-of-turn token 4 was appended), step 1 with the policy's own end token
  steps = [{"valid": True, "parsed_action": "search[a]", "finish_reason": "stop", "token_logprobs": [-0.5]},
           {"valid": False, "parsed_action": None, "finish_reason": "eos", "token_logprobs": [-1.5]}]
  record = {"task_id": 1, "rollout": 0, "num_steps": 2, "final_reward": 0.0, "steps": steps,
            "tokens": list(range(1, 13)), "action_mask": [0, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1, 1]}
  sequence = prm.trajectory_sequence(record, tokenizer=None)
  assert sequence.tokens == list(range(1, 8)) and sequence.action_mask == [0, 0, 1, 1, 0, 0, 1]
  assert sequence.grounding == [1.0, 0.0]
  assert sequence.forced_mask == [0, 0, 0, 1, 0, 0, 0]
  assert sequence.sampler_logprobs == [0.0, 0.0, -0.5, 0.0, 0.0, 0.0, -1.5]
  with pytest.raises(ValueError, match="3 action spans .* for 1 steps"):
    prm.trajectory_sequence(record | {"num_steps": 1}, tokenizer=None)
  corrupt = [steps[0] | {"token_logprobs": [-0.5, -0.1]}, steps[1]]
  with pytest.raises(ValueError, match="2 recorded log-probs for an action of 1 sampled tokens"):
    prm.trajectory_sequence(record | {"steps": corrupt}, tokenizer=None)


def test_holdout_split_is_by_task_and_deterministic():
  tasks = [5, 5, 9, 1, 1, 1, 7, 3, 3, 8]
  train, held = prm.holdout_split(tasks, 0.34, seed=0)
  assert sorted(train + held) == [1, 3, 5, 7, 8, 9] and not set(train) & set(held) and len(held) == 3
  assert (train, held) == prm.holdout_split(tasks, 0.34, seed=0)
  assert prm.holdout_split(tasks, 0.0, seed=0) == ([1, 3, 5, 7, 8, 9], [])
  assert prm.holdout_split([4, 4], 0.5, seed=0) == ([4], [])  # one task: nothing to hold out


def test_reward_spread_warns_when_nearly_every_trajectory_has_one_reward(caplog):
  def trajectories(*rewards):
    return [types.SimpleNamespace(final_reward=r) for r in rewards]
  with caplog.at_level(logging.WARNING):
    varied = prm.reward_spread(trajectories(1.0, 0.5, 0.0, 1.0))
  assert varied == {"reward_std": pytest.approx(np.std([1.0, 0.5, 0.0, 1.0])), "reward_modal_share": 0.5}
  assert not caplog.records
  with caplog.at_level(logging.WARNING):
    saturated = prm.reward_spread(trajectories(*[1.0] * 9, 0.25))
  assert saturated["reward_modal_share"] == 0.9
  assert "share one final reward" in caplog.text and "sft.expert_episodes" in caplog.text


def test_fit_metrics_and_the_warning_catch_an_estimator_that_only_counts_steps(caplog):
  # longer episodes fail more often here; an estimator paying 0.2 per step predicts the opposite
  steps, rewards = [3, 4, 4, 5, 6, 7], [1.0, 1.0, 0.8, 0.5, 0.0, 0.0]
  ungrounded = [0, 0, 1, 1, 3, 4]
  sequences = [types.SimpleNamespace(key=str(k), num_steps=n, final_reward=r, grounding=[0.0] * u + [1.0] * (n - u))
               for k, (n, r, u) in enumerate(zip(steps, rewards, ungrounded))]
  counting = {str(k): np.full(n, 0.2, np.float32) for k, n in enumerate(steps)}
  fit = prm.fit_metrics(sequences, counting)
  assert fit["steps_pearson"] == pytest.approx(1.0) and fit["pearson"] < -0.9
  assert fit["r2"] == pytest.approx(1 - fit["mse"] / np.var(rewards)) and fit["r2"] < 0
  with caplog.at_level(logging.WARNING):
    assert prm.warn_if_uninformative(fit, "held-out")
  assert "R^2 -" in caplog.text and "prm.validation_fraction" in caplog.text
  caplog.clear()

  # the two-count line: least squares on four trajectories, R^2 on the other two
  fit_on, judge = [0, 1, 2, 4], [3, 5]
  features = np.array([[1, n, u] for n, u in zip(steps, ungrounded)], float)
  coef, *_ = np.linalg.lstsq(features[fit_on], np.array(rewards)[fit_on], rcond=None)
  judged = np.array(rewards)[judge]
  expected = 1 - np.mean((features[judge] @ coef - judged) ** 2) / np.var(judged)
  assert prm.counting_baseline_r2([sequences[i] for i in fit_on], [sequences[i] for i in judge]) == pytest.approx(expected)
  assert np.isnan(prm.counting_baseline_r2(sequences[:4], []))
  # ... and it fits all six better than the counting estimator: a warning even at R^2 > 0 below it
  baseline = prm.counting_baseline_r2(sequences, sequences)
  assert baseline > 0.9
  with caplog.at_level(logging.WARNING):
    assert prm.warn_if_uninformative({**fit, "r2": 0.5}, "held-out", baseline)
  caplog.clear()
  fitting = {str(k): np.full(n, (r + 0.05 * (-1) ** k) / n, np.float32)
             for k, (n, r) in enumerate(zip(steps, rewards))}
  good = prm.fit_metrics(sequences, fitting)
  assert good["r2"] > 0.95 and good["pearson"] > 0.95
  with caplog.at_level(logging.WARNING):
    assert not prm.warn_if_uninformative(good, "held-out")
    assert not prm.warn_if_uninformative(prm.fit_metrics(sequences[:2], counting), "held-out")  # R constant
  assert not caplog.records


def test_prm_stage_reports_held_out_fit_and_exports_the_estimator(workspace):
  ws = Workspace(workspace)
  cfg = make_config(workspace)
  summary = ws.done_record("prm")["summary"]
  split = json.loads((ws.root / "prm" / "split.json").read_text())
  assert len(split["heldout"]) == 1 and not set(split["train"]) & set(split["heldout"])
  assert summary["train_trajectories"] == 9 and summary["heldout_trajectories"] == 3
  assert summary["dropped"] == {"no_steps": 0, "too_long": 0}
  assert 0 < summary["reward_std"] and summary["reward_modal_share"] < 1

  rows = read_metrics(ws.metrics_path("prm"))
  epochs = [row for row in rows if "epoch" in row]
  assert [row["epoch"] for row in epochs] == [1, 2]
  for row in epochs:
    assert all(np.isfinite(row[key]) for key in ("train_mse", "heldout_mse", "train_pearson", "heldout_pearson"))
  # The rewards are 0 or 1, so a zero head's MSE is the mean reward: the trained sums fit better.
  assert all(row["train_mse"] < 0.9 * row["train_mean_reward"] for row in epochs)
  assert summary["probe_l2"] in prm.PROBE_L2_GRID and np.isfinite(summary["probe_heldout_r2"])
  # the held-out rewards follow the number of ungrounded steps here: a zero-initialised head learns
  # only the mean reward per step in these few steps (R^2 about 0), the probed head the outcome
  assert summary["heldout_r2"] > 0.5
  assert summary["heldout_r2_ci95"] == [None, None]  # one held-out goal: no interval over goals
  assert ws.plot_path("prm").exists() and ws.plot_path(prm.PROGRESS_PLOT).exists()

  # the exported estimator reproduces the reported held-out fit
  tokenizer = common.load_tokenizer(cfg, ws)
  mesh = common.make_mesh(cfg)
  sequences, _ = prm.load_sequences(
      [r for r in expert_records(cfg) if r["task_id"] in split["heldout"]], tokenizer, cfg.prm.max_len)
  progress = prm.estimate_progress(prm.load_estimator(cfg, ws, mesh), sequences,
                                   **prm.estimator_forward(cfg, tokenizer, mesh))
  fit = prm.fit_metrics(sequences, progress)
  np.testing.assert_allclose(fit["mse"], summary["heldout_mse"], rtol=1e-4)
  train_sequences, _ = prm.load_sequences(
      [r for r in expert_records(cfg) if r["task_id"] in split["train"]], tokenizer, cfg.prm.max_len)
  baseline = prm.counting_baseline_r2(train_sequences, sequences)
  assert baseline == pytest.approx(summary["heldout_baseline_r2"]) if np.isfinite(baseline) else summary["heldout_baseline_r2"] is None
  np.testing.assert_allclose(fit["pearson"], summary["heldout_pearson"], rtol=1e-4, atol=1e-6)


def test_prm_resumes_from_its_checkpoint(workspace):
  ws = Workspace(workspace)
  cfg = make_config(workspace)
  before = ws.done_record("prm")["summary"]
  again = prm.run(cfg, ws)  # every step is checkpointed: nothing left to train
  assert again["resumed"] and again["steps"] == before["steps"]
  assert again["probe_l2"] == before["probe_l2"]  # the probe's summary travels in the checkpoint metadata
  np.testing.assert_allclose(again["heldout_mse"], before["heldout_mse"], rtol=1e-5)


def test_linear_probe_recovers_a_linear_reward_and_picks_a_strong_penalty_for_noise():
  rng = np.random.default_rng(0)
  groups = np.repeat(np.arange(40), 4)  # 40 tasks x 4 rollouts
  steps = rng.integers(2, 8, size=groups.size).astype(float)
  features = rng.normal(size=(groups.size, 6)) * 3.0
  kernel, bias = np.array([0.2, -0.1, 0.0, 0.05, 0.0, 0.3]), 0.04
  rewards = features @ kernel + bias * steps + 0.01 * rng.normal(size=groups.size)
  probe = prm.fit_linear_probe(features, steps, rewards, groups, seed=0)
  np.testing.assert_allclose(probe.kernel, kernel, atol=0.01)
  assert probe.bias == pytest.approx(bias, abs=0.01) and probe.cv_r2 > 0.99 and probe.l2 == min(prm.PROBE_L2_GRID)

  noise = rng.normal(size=(groups.size, 60))  # 60 features unrelated to a 0/1 reward
  outcome = (rng.random(groups.size) < 0.5).astype(float)
  probe = prm.fit_linear_probe(noise, steps, outcome, groups, seed=0)
  assert probe.l2 >= 1.0 and probe.cv_r2 < 0.1
  constant = prm.fit_linear_probe(noise, steps, np.ones(groups.size), groups, seed=0)  # nothing to cross-validate
  assert np.isnan(constant.cv_r2) and constant.l2 in prm.PROBE_L2_GRID


def test_probed_head_sums_equal_the_probe_on_summed_features(workspace):
  # the invariant that makes the probe the head's own fit: sum_t c_t of the estimator's forward pass
  # equals features @ kernel + num_steps * bias, with the features from forward_step_features
  ws = Workspace(workspace)
  cfg = make_config(workspace)
  tokenizer = common.load_tokenizer(cfg, ws)
  mesh = common.make_mesh(cfg)
  forward = prm.estimator_forward(cfg, tokenizer, mesh)
  sequences, _ = prm.load_sequences(expert_records(cfg), tokenizer, cfg.prm.max_len)
  train, heldout = sequences[:9], sequences[9:]
  _, backbone = prm.load_backbone(cfg, common.policy_dir(ws, "sft"), mesh, prm.activation_dtype(cfg))
  model = prm._estimator_module(backbone, cfg, cfg.seed)
  summary = prm.initial_head(cfg, model, train, heldout, forward)
  assert set(summary) == {"probe_l2", "probe_cv_r2", "probe_heldout_r2", "probe_heldout_pearson"}
  state = prm.frozen_train_state(model)
  features = prm.step_features(state, train, **forward)
  steps = np.array([s.num_steps for s in train], float)
  kernel, bias = np.asarray(model.head.kernel[...], float), float(model.head.bias[...])
  sums = np.array([v.sum() for v in prm.estimate_progress(state, train, **forward).values()])
  order = list(prm.estimate_progress(state, train, **forward))
  expected = dict(zip([s.key for s in train], features @ kernel + steps * bias))
  np.testing.assert_allclose(sums, [expected[k] for k in order], rtol=1e-4, atol=1e-4)
  # the probe fits its train set at least as well as the best head that only counts steps
  rewards = np.array([s.final_reward for s in train])
  counting = np.sum(rewards * steps) / np.sum(steps * steps) * steps
  probed = np.array([expected[s.key] for s in train])
  assert np.mean((probed - rewards) ** 2) <= np.mean((counting - rewards) ** 2) + 1e-6
  assert prm.fit_metrics(heldout, prm.estimate_progress(state, heldout, **forward))["r2"] == pytest.approx(
      summary["probe_heldout_r2"], abs=1e-6)


def test_r2_interval_resamples_whole_goals():
  rng = np.random.default_rng(1)
  sequences = [types.SimpleNamespace(key=f"{t}/{k}", task_id=t, num_steps=3, final_reward=float(rng.random() < 0.6))
               for t in range(30) for k in range(4)]
  exact = {s.key: np.full(3, s.final_reward / 3, np.float32) for s in sequences}
  assert prm.r2_interval(sequences, exact, seed=0) == pytest.approx((1.0, 1.0))
  noisy = {s.key: np.full(3, (s.final_reward + rng.normal(0, 0.4)) / 3, np.float32) for s in sequences}
  low, high = prm.r2_interval(sequences, noisy, seed=0)
  assert low < prm.fit_metrics(sequences, noisy)["r2"] < high and high - low > 0.05
  assert prm.r2_interval(sequences, noisy, seed=0) == (low, high)  # seeded
  one_goal = [s for s in sequences if s.task_id == 0]
  assert all(np.isnan(prm.r2_interval(one_goal, noisy, seed=0)))


def test_prm_ships_the_epoch_that_fits_the_validation_tasks_best(workspace):
  # a learning rate far too high for the micro backbone: fine-tuning makes the fit worse than the
  # probe, and the stage must ship the epoch (0: the probed head) with the lowest validation MSE
  ws = Workspace(workspace)
  cfg = make_config(workspace, {"prm.validation_fraction": 0.3, "prm.learning_rate": 0.05, "prm.epochs": 2})
  summary = prm.run(cfg, ws)
  split = prm.read_split(ws)
  assert [len(split[k]) for k in ("train", "validation", "heldout")] == [2, 1, 1]
  assert sorted(split["train"] + split["validation"] + split["heldout"]) == sorted({r["task_id"] for r in expert_records(cfg)})
  assert summary["train_trajectories"] == 6 and summary["validation_trajectories"] == 3

  epochs = {row["epoch"]: row["validation_mse"] for row in read_metrics(ws.metrics_path("prm")) if "epoch" in row}
  assert sorted(epochs) == [0, 1, 2], epochs
  assert summary["kept_epoch"] == min(epochs, key=epochs.get) == 0
  assert summary["validation_mse"] == pytest.approx(epochs[0], rel=1e-5)

  # the exported estimator is the kept one: it reproduces the kept epoch's validation fit
  tokenizer = common.load_tokenizer(cfg, ws)
  mesh = common.make_mesh(cfg)
  sequences, _ = prm.load_sequences(
      [r for r in expert_records(cfg) if r["task_id"] in split["validation"]], tokenizer, cfg.prm.max_len)
  progress = prm.estimate_progress(prm.load_estimator(cfg, ws, mesh), sequences,
                                   **prm.estimator_forward(cfg, tokenizer, mesh))
  np.testing.assert_allclose(prm.fit_metrics(sequences, progress)["mse"], epochs[0], rtol=1e-4)
  again = prm.run(cfg, ws)  # resumed after the last step: the choice travels in the checkpoint metadata
  assert again["resumed"] and again["kept_epoch"] == 0
  np.testing.assert_allclose(again["heldout_mse"], summary["heldout_mse"], rtol=1e-5)


def test_prm_trains_and_ships_an_estimator_when_every_exploration_reward_is_equal(workspace):
  # a random policy's exploration earns 0 everywhere (bench/ppo_bench.py's 3B shape): R^2 and the
  # correlations are undefined on every split, and the stage still trains, validates and ships
  ws = Workspace(workspace)
  cfg = make_config(workspace, {"prm.validation_fraction": 0.3, "prm.epochs": 1})
  with TrajectoryWriter(ws, prm.EXPLORE) as write:
    for record in expert_records(cfg):
      write({**record, "final_reward": 0.0, "success": False})
  summary = prm.run(cfg, ws)
  assert summary["kept_epoch"] in (0, 1) and summary["reward_std"] == 0
  assert summary["validation_r2"] is None and summary["heldout_r2"] is None
  rows = {row["epoch"]: row for row in read_metrics(ws.metrics_path("prm")) if "epoch" in row}
  assert sorted(rows) == [0, 1] and np.isnan(rows[0]["validation_r2"]) and np.isfinite(rows[0]["validation_mse"])
  assert prm.load_estimator(cfg, ws, common.make_mesh(cfg)) is not None


@pytest.mark.parametrize("validation_fraction", [0.0, 0.3])
def test_prm_with_no_epochs_ships_the_linear_probe(workspace, validation_fraction):
  # prm.epochs=0 (with head_init=probe): no optimizer step, and the exported estimator is the probed
  # head on the SFT backbone: its held-out fit is the probe's own, with or without validation tasks
  ws = Workspace(workspace)
  cfg = make_config(workspace, {"prm.validation_fraction": validation_fraction, "prm.epochs": 0})
  summary = prm.run(cfg, ws)
  assert summary["steps"] == 0 and summary["kept_epoch"] == 0
  assert summary["heldout_r2"] == pytest.approx(summary["probe_heldout_r2"], rel=1e-4, abs=1e-6)
  assert not [row for row in read_metrics(ws.metrics_path("prm")) if "progress_loss" in row]  # nothing trained
  split = prm.read_split(ws)
  tokenizer, mesh = common.load_tokenizer(cfg, ws), common.make_mesh(cfg)
  sequences, _ = prm.load_sequences([r for r in expert_records(cfg) if r["task_id"] in split["heldout"]],
                                    tokenizer, cfg.prm.max_len)
  progress = prm.estimate_progress(prm.load_estimator(cfg, ws, mesh), sequences,
                                   **prm.estimator_forward(cfg, tokenizer, mesh))
  np.testing.assert_allclose(prm.fit_metrics(sequences, progress)["mse"], summary["heldout_mse"], rtol=1e-4)
