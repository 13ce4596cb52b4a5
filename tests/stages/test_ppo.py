"""ppo stage: an online iteration changes the policy, a killed run resumes from its checkpoint to the
uninterrupted result, the held-out evaluation during PPO watches without changing the run and ends
on what the eval stage measures, offline PPO trains on the label stage's rewards, reward modes, and the
invariants of one online iteration (sampler log-probs = old-policy log-probs, only sampled tokens
trained on, KL 0 to an unchanged reference; config errors: tests/pipeline/test_config.py)."""

import dataclasses
import json
import shutil
import types

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from spa_jax.models import llama
from spa_jax.models.decode_attention import ragged_cached_attention
from spa_jax.stages import common, eval as eval_stage, label, ppo, prm
from spa_jax.rollout.trajectory_store import read_trajectories
from spa_jax.tracking import peak_memory_gb, read_metrics
from spa_jax.training.global_batch import to_global_batch
from spa_jax.training.rewards import purchases_a_stall_outearns, step_rewards
from spa_jax.workspace import Workspace
from spa_workspace import make_config, workspace_copy

ONLINE = {"env.max_steps": 3}


def _weights(ws: Workspace, policy: str) -> dict[str, np.ndarray]:
  return load_file(str(ws.root / "policies" / policy / "model.safetensors"))


@pytest.mark.slow
def test_online_ppo_changes_the_policy_and_resumes_after_a_kill(tmp_path_factory, tmp_path):
  straight = Workspace(workspace_copy(tmp_path_factory, tmp_path / "straight"))
  summary = ppo.run(make_config(straight.root, ONLINE), straight)
  assert summary["resumed"] == {"spa": False}
  rows = read_metrics(straight.metrics_path("ppo_spa"))
  assert [row["step"] for row in rows] == [1, 2]
  for key in ("policy_loss", "value_loss", "kl", "clip_frac", "score", "task_return", "kl_coef", "progress_mse",
              "progress_mean_predicted"):
    assert np.isfinite(rows[-1][key])
  for row in rows:  # every phase of every iteration is timed
    assert all(row[f"time_{phase}_s"] > 0 for phase in ("rollout", "rewards", "targets", "update"))
    # the sampler ran the policy the update starts from (a sampler copy that wrote its merged LoRA
    # back into the train state failed this from the second iteration on)
    assert row["sampler_logp_gap_max"] < 2e-4
  assert ("peak_memory_gb" in rows[0]) == (peak_memory_gb() is not None)  # absent on CPU
  assert rows[0]["trajectories"] == 2 and rows[0]["skipped"] == 0.0
  sft, trained = _weights(straight, "sft"), _weights(straight, "ppo_spa")
  assert sft.keys() == trained.keys()
  changed = [k for k in sft if not np.array_equal(sft[k], trained[k])]
  assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed)  # LoRA q, v merged
  assert straight.plot_path("ppo_spa").exists()

  # the state of a run killed during its second iteration: checkpoint 1, one metrics line, no policy
  killed = Workspace(tmp_path / "killed")
  shutil.copytree(straight.root, killed.root)
  (checkpoint_2,) = killed.root.glob("checkpoints/ppo/*/spa/2")
  shutil.rmtree(checkpoint_2)
  shutil.rmtree(killed.root / "policies" / "ppo_spa")
  metrics = killed.metrics_path("ppo_spa")
  metrics.write_text(metrics.read_text().splitlines(keepends=True)[0])
  resumed = ppo.run(make_config(killed.root, ONLINE), killed)
  assert resumed["resumed"] == {"spa": True}
  assert [row["step"] for row in read_metrics(metrics)] == [1, 2]
  again = _weights(killed, "ppo_spa")
  for key in trained:  # the same rollouts and updates as the uninterrupted run
    np.testing.assert_array_equal(again[key], trained[key], err_msg=key)

  # a time budget every iteration overruns: stops after iteration 1 with that iteration's policy ...
  budget = Workspace(workspace_copy(tmp_path_factory, tmp_path / "budget"))
  stopped = ppo.run(make_config(budget.root, ONLINE | {"ppo.time_budget_s": 1e-6}), budget)
  assert stopped["iterations"] == {"spa": 1}
  assert [row["step"] for row in read_metrics(budget.metrics_path("ppo_spa"))] == [1]
  first = _weights(budget, "ppo_spa")
  assert any(not np.array_equal(first[k], trained[k]) for k in trained)  # not yet the 2-iteration policy
  # ... and a rerun without it goes on from that checkpoint to the uninterrupted result
  went_on = ppo.run(make_config(budget.root, ONLINE), budget)
  assert went_on["resumed"] == {"spa": True} and went_on["iterations"] == {"spa": 2}
  for key in trained:
    np.testing.assert_array_equal(_weights(budget, "ppo_spa")[key], trained[key], err_msg=key)

  # another ppo.seed, from the same SFT policy and estimator: other rollouts, another policy
  reseeded = Workspace(workspace_copy(tmp_path_factory, tmp_path / "reseeded"))
  ppo.run(make_config(reseeded.root, ONLINE | {"ppo.seed": 1}), reseeded)
  other = _weights(reseeded, "ppo_spa")
  assert any(not np.array_equal(other[k], trained[k]) for k in trained)

  # critic warm-up: iteration 1 trains only the critic, so iteration 2 samples the SFT policy itself
  # (KL exactly 0) and only its update moves the policy
  warm = Workspace(workspace_copy(tmp_path_factory, tmp_path / "warm"))
  ppo.run(make_config(warm.root, ONLINE | {"ppo.critic_warmup": 1}), warm)
  rows = read_metrics(warm.metrics_path("ppo_spa"))
  assert [row["kl"] for row in rows] == [0.0, 0.0]
  warmed = _weights(warm, "ppo_spa")
  assert any(not np.array_equal(warmed[k], sft[k]) for k in sft)
  assert any(not np.array_equal(warmed[k], trained[k]) for k in trained)


@pytest.mark.slow
def test_held_out_evaluation_during_ppo_watches_without_changing_the_run(tmp_path_factory, tmp_path):
  plain = Workspace(workspace_copy(tmp_path_factory, tmp_path / "plain"))
  ppo.run(make_config(plain.root, ONLINE), plain)
  watched = Workspace(workspace_copy(tmp_path_factory, tmp_path / "watched"))
  watch = ONLINE | {"ppo.eval_every": 2, "ppo.eval_tasks": 2, "eval.max_tasks": 2, "eval.policies": "ppo_spa"}
  cfg = make_config(watched.root, watch)
  ppo.run(cfg, watched)

  # the same rollouts, updates and policy as the run without it
  assert not plain.metrics_path("ppo_spa_eval").exists()
  trained = _weights(plain, "ppo_spa")
  for key, value in _weights(watched, "ppo_spa").items():
    np.testing.assert_array_equal(value, trained[key], err_msg=key)
  assert ([row["score"] for row in read_metrics(watched.metrics_path("ppo_spa"))]
          == [row["score"] for row in read_metrics(plain.metrics_path("ppo_spa"))])

  # evaluated before the first iteration (the SFT policy) and after the last (every 2nd: iteration 2)
  curve = read_metrics(watched.metrics_path("ppo_spa_eval"))
  assert [row["step"] for row in curve] == [0, 2]
  eval_tasks = common.split_tasks(cfg, cfg.env.eval_split, 2)
  for row in curve:
    records = read_trajectories(watched, f"ppo_spa_eval{row['step']:04d}")
    assert sorted(r["task_id"] for r in records) == sorted(eval_tasks)
    assert all(r["policy"] == f"ppo_spa@{row['step']}" for r in records)
  assert watched.plot_path("ppo_spa_eval").exists()

  # the curve's last point is what the eval stage measures for the exported policy (greedy, same
  # goals): the evaluation ran the weights that were trained and saved, not the SFT policy it started from
  eval_stage.run(cfg, watched)
  report = json.loads(watched.report_path("eval").read_text())["policies"]["ppo_spa"]
  for metric in ppo.EVAL_METRICS:
    assert curve[-1][f"eval_{metric}"] == pytest.approx(report[metric]), metric
  def episodes_of(name):
    records = sorted(read_trajectories(watched, name), key=lambda r: r["task_id"])
    return ([s["model_output"] for r in records for s in r["steps"]],
            np.concatenate([s["token_logprobs"] for r in records for s in r["steps"]]))
  (final, final_logp), (last, last_logp) = episodes_of("eval_ppo_spa"), episodes_of("ppo_spa_eval0002")
  assert final == last
  np.testing.assert_allclose(last_logp, final_logp, atol=1e-5)
  _, start_logp = episodes_of("ppo_spa_eval0000")
  assert start_logp.shape != last_logp.shape or np.abs(start_logp - last_logp).max() > 1e-3


@pytest.mark.slow
def test_offline_ppo_trains_on_the_label_stage_rewards(tmp_path_factory, tmp_path):
  ws = Workspace(workspace_copy(tmp_path_factory, tmp_path))
  overrides = {"ppo.mode": "offline", "ppo.iterations": 1, "ppo.rollouts_per_iteration": 3,
               "ppo.mini_batch_size": 1}
  cfg = make_config(ws.root, overrides)
  label.run(cfg, ws)
  labels = label.read_labels(ws)
  assert len(labels) == 3  # the held-out task's three trajectories
  summary = ppo.run(cfg, ws)
  spa = read_metrics(ws.metrics_path("ppo_spa"))[0]
  spa_return = np.mean([sum(row["reward"] for row in rows) for rows in labels.values()])
  assert spa["task_return"] == pytest.approx(spa_return, abs=1e-5) and spa["trajectories"] == 3
  assert summary["spa_task_return"] == pytest.approx(spa_return, abs=1e-5)
  assert not np.array_equal(_weights(ws, "ppo_spa")["model.layers.0.self_attn.q_proj.weight"],
                            _weights(ws, "sft")["model.layers.0.self_attn.q_proj.weight"])


def test_reward_modes_of_one_batch(tmp_path):
  cfg = make_config(tmp_path / "ws", {"label.progress_coef": 2.0, "label.grounding_coef": 0.5})
  sequences = [prm.TrajectorySequence(1, 0, [5, 6, 7, 8, 9], [0, 1, 0, 0, 1], [1.0, 0.0], ["search[a]", None], 0.75),
               prm.TrajectorySequence(2, 0, [5, 6, 7], [0, 0, 1], [1.0], ["click[b]"], 0.0)]
  progress = {"1:0": np.array([0.5, -0.25], np.float32), "2:0": np.array([0.125], np.float32)}
  rows = {mode: ppo.reward_batch(cfg, mode, sequences, progress, pad_id=0)["task_rewards_bs"][:2, :3]
          for mode in ("spa", "sparse", "grounding_only")}
  # spa: 2 c_t + 0.5 g_t; sparse: R at the last step; grounding_only: 0.5 g_t + R at the last step
  np.testing.assert_allclose(rows["spa"], [[1.5, -0.5, 0.0], [0.75, 0.0, 0.0]])
  np.testing.assert_allclose(rows["sparse"], [[0.0, 0.75, 0.0], [0.0, 0.0, 0.0]])
  np.testing.assert_allclose(rows["grounding_only"], [[0.5, 0.75, 0.0], [0.5, 0.0, 0.0]])
  # the per-iteration fit of the progress sums (0.25, 0.125) to the final rewards (0.75, 0), spa only
  fit = ppo.progress_fit("spa", sequences, progress)
  assert fit["progress_mean_predicted"] == pytest.approx(0.1875)
  assert fit["progress_mse"] == pytest.approx((0.5 ** 2 + 0.125 ** 2) / 2)
  assert fit["progress_pearson"] == pytest.approx(1.0) and fit["progress_steps_pearson"] == pytest.approx(1.0)
  assert ppo.progress_fit("sparse", sequences, progress) == ppo.progress_fit("grounding_only", sequences, progress) == {}


def test_the_stall_warning_says_what_the_step_rewards_pay(tmp_path):
  """purchases_a_stall_outearns against training.rewards.step_rewards itself: an episode of valid steps up to
  the cap without a purchase (R = 0) out-earns a purchase (R = 1) at step k exactly for k up to its answer;
  the penalty form never pays a stall more. The stage warns for the modes with a grounding bonus only."""
  def episode_return(steps: int, final_reward: float, beta: float, form: str) -> float:
    mask = np.zeros((1, 16), np.float32)
    mask[0, :steps] = 1.0
    rewards = step_rewards("grounding_only", progress_bs=np.zeros_like(mask), grounding_bs=mask, step_mask_bs=mask,
                           final_reward_b=np.array([final_reward], np.float32), alpha=1.0, beta=beta,
                           grounding_form=form)
    return float(np.sum(rewards))

  for beta, max_steps, expected in ((0.5, 10, 7), (0.25, 12, 7), (0.125, 10, 1), (0.25, 4, 0)):
    last = purchases_a_stall_outearns(beta, max_steps, "bonus")
    assert last == expected
    stall = episode_return(max_steps, 0.0, beta, "bonus")
    assert [stall > episode_return(k, 1.0, beta, "bonus") for k in range(1, max_steps + 1)] == [
        k <= last for k in range(1, max_steps + 1)]
    assert purchases_a_stall_outearns(beta, max_steps, "penalty") == 0
    assert episode_return(max_steps, 0.0, beta, "penalty") < episode_return(max_steps, 1.0, beta, "penalty")
  cfg = make_config(tmp_path, {"env.max_steps": 10, "label.grounding_coef": 0.5})
  assert "more than any purchase by step 7" in ppo.stall_warning(cfg, "spa")
  assert ppo.stall_warning(cfg, "grounding_only") and ppo.stall_warning(cfg, "sparse") is None
  cfg.label.grounding_form = "penalty"
  assert ppo.stall_warning(cfg, "spa") is None


def _perturbed_lora(policy, scale: float, seed: int):
  """The policy train state with every LoRA parameter moved by scale * N(0, 1)."""
  keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(policy.params))))
  return policy.with_params(jax.tree.map(lambda x: x + scale * jax.random.normal(next(keys), x.shape, x.dtype),
                                         policy.params))


def _state_arrays(policy) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves((policy.params, policy.frozen))]


def test_sampling_model_and_export_leave_the_train_state_unchanged(tmp_path_factory, tmp_path):
  ws = Workspace(workspace_copy(tmp_path_factory, tmp_path))
  cfg = make_config(ws.root)
  mesh = common.make_mesh(cfg)
  _, state = ppo.initial_state(cfg, ws, mesh, ppo.optimizers(cfg))
  policy = _perturbed_lora(state.policy, 0.05, seed=1)
  before = _state_arrays(policy)
  merged_twice = [ppo.sampling_model(policy) for _ in range(2)]
  common.save_policy(ws, "ppo_probe", ppo.sampling_model(policy), merged_twice[0].cfg)
  for old, new in zip(before, _state_arrays(policy), strict=True):
    np.testing.assert_array_equal(old, new)  # the frozen base never takes the LoRA delta
  first, second = (nnx.state(m, nnx.Param) for m in merged_twice)
  for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # merging again gives the same model


@pytest.mark.slow
@pytest.mark.parametrize("decode_attention", ["dense", "ragged"])
def test_online_iteration_invariants(tmp_path_factory, tmp_path, decode_attention, monkeypatch):
  """On the policy's own fresh samples: the sampler's recorded log-probs are the update's old-policy
  log-probs (with either decode attention: every cache slot read, or each row's filled slots only);
  only sampled tokens are trained on; KL to the (unchanged) reference is 0, to a perturbed reference
  positive; a policy moved away from the reference also samples a positive KL."""
  ws = Workspace(workspace_copy(tmp_path_factory, tmp_path))
  cfg = make_config(ws.root, {**ONLINE, "ppo.rollouts_per_iteration": 4, "ppo.mini_batch_size": 2,
                              "ppo.max_new_tokens": 24, "ppo.reward_modes": "sparse",
                              "eval.policies": "sft,ppo_sparse", "model.decode_attention": decode_attention})
  traced = []  # the ragged kernel's traces (one per layer of each compiled decode loop)
  monkeypatch.setattr(llama, "ragged_cached_attention", lambda *args: traced.append(1) or ragged_cached_attention(*args))
  shared = ppo.Shared(cfg=cfg, ws=ws, tokenizer=common.load_tokenizer(cfg, ws), mesh=common.make_mesh(cfg))
  _, state = ppo.initial_state(cfg, ws, shared.mesh, ppo.optimizers(cfg))
  eot = shared.tokenizer.end_of_turn_id
  with ppo.rollouts(shared):
    for iteration, policy in enumerate([state.policy, _perturbed_lora(state.policy, 0.3, seed=2)]):
      state = state.replace(policy=policy)
      sequences, _ = ppo.online_sequences(shared, "sparse", iteration, state)
      batch = ppo.reward_batch(cfg, "sparse", sequences, ppo.progress_of(shared, "sparse", sequences),
                               shared.tokenizer.pad_id)
      full, stats = ppo.targets_batch(shared, state, batch, kl_coef=0.05)
      trained = full["loss_mask_bt"] > 0
      # every trained token was sampled (it has the sampler's log-prob) and every forced token is
      # the end-of-turn token appended after a stop string
      assert trained.any() and np.all(full["sampler_logp_bt"][trained] != 0)
      assert np.all(full["sampler_logp_bt"][~trained] == 0)
      forced_tokens = [s.tokens[i] for s in sequences for i, f in enumerate(s.forced_mask) if f]
      assert forced_tokens and set(forced_tokens) == {eot}
      np.testing.assert_allclose(full["old_logp_bt"][trained], full["sampler_logp_bt"][trained], atol=2e-4)
      assert stats["sampler_logp_gap_max"] < 2e-4
      if iteration == 0:  # fresh LoRA (B = 0): the policy is its reference, token for token
        assert stats["kl"] == 0.0
        perturbed = dataclasses.replace(shared, reference=_perturbed_lora(policy, 0.3, seed=3))
        assert ppo.targets_batch(perturbed, state, batch, kl_coef=0.05)[1]["kl"] > 0.5
      else:  # a policy away from the reference: its own samples show it
        assert stats["kl"] > 0.5
  assert bool(traced) == (decode_attention == "ragged")


@pytest.mark.slow
def test_updates_on_one_batch_raise_the_log_probs_of_advantaged_tokens(tmp_path_factory, tmp_path):
  """The update's direction: a few PPO steps on one fixed batch (the workspace's expert and damaged
  exploration trajectories, grounding_only rewards, so advantages of both signs) raise the
  advantage-weighted log-probs of the trained tokens (a sign or token-alignment error lowers them);
  the critic steps with its own learning rate (Adam moves a parameter by about the LR per step)."""
  ws = Workspace(workspace_copy(tmp_path_factory, tmp_path))
  cfg = make_config(ws.root, {"ppo.rollouts_per_iteration": 12, "ppo.mini_batch_size": 12,
                              "ppo.reward_modes": "grounding_only", "ppo.learning_rate": 1e-2,
                              "ppo.critic_learning_rate": 1e-6, "eval.policies": "sft,ppo_*"})
  shared = ppo.Shared(cfg=cfg, ws=ws, tokenizer=common.load_tokenizer(cfg, ws), mesh=common.make_mesh(cfg))
  _, state = ppo.initial_state(cfg, ws, shared.mesh, ppo.optimizers(cfg))
  sequences, _ = prm.load_sequences(read_trajectories(ws, prm.EXPLORE), shared.tokenizer, cfg.ppo.max_len)
  batch = ppo.reward_batch(cfg, "grounding_only", sequences, ppo.progress_of(shared, "grounding_only", sequences),
                           shared.tokenizer.pad_id)
  full, _ = ppo.targets_batch(shared, state, batch, kl_coef=0.0)
  step_fn = ppo.ppo_step_fn(shared, state)
  params = lambda s: [np.asarray(x) for x in jax.tree.leaves((s.policy.params, s.critic.params))]
  before, policy_leaves = params(state), len(jax.tree.leaves(state.policy.params))
  for _ in range(3):
    state, _ = ppo.update(shared, step_fn, state, full, iteration=0)
  moved = [float(np.max(np.abs(a - b))) for a, b in zip(before, params(state), strict=True)]
  assert max(moved[:policy_leaves]) > 1e-3
  assert 0 < max(moved[policy_leaves:]) <= 3 * 1.1e-6
  with jax.set_mesh(shared.mesh):
    new_logp_bt = np.asarray(ppo.forward_logprobs(state.policy, {k: full[k] for k in ("tokens_bt", "positions_bt")}))
  trained = full["loss_mask_bt"] > 0
  change_t, advantage_t = (new_logp_bt - full["old_logp_bt"])[trained], full["advantages_bt"][trained]
  assert (advantage_t > 0.5).any() and (advantage_t < -0.5).any()
  # the surrogate objective sum_t A_t log pi(a_t) rose (to first order, the update's own objective)
  assert np.sum(advantage_t * change_t) > 0


def test_policy_learning_rate_warms_up_over_its_first_updates_and_the_critic_does_not(tmp_path):
  """`ppo.warmup_updates`: Adam moves each weight by about the LR per step whatever the gradient's size
  (for a constant gradient exactly the LR), so the policy's k-th update moves a weight by lr * k / N
  for k < N, then by lr; the critic's optimizer has no warm-up."""
  lr, warmup = 1e-2, 4
  tx = ppo.optimizers(make_config(tmp_path, {"ppo.learning_rate": lr, "ppo.warmup_updates": warmup}))
  grads = {"w": np.full((3, 2), 0.5, np.float32)}

  def moves(optimizer, updates):
    state, out = optimizer.init(grads), []
    for _ in range(updates):
      step, state = optimizer.update(grads, state, grads)
      out.append(float(np.max(np.abs(step["w"]))))
    return np.array(out)

  np.testing.assert_allclose(moves(tx.policy, 6), lr * np.array([0, 1, 2, 3, 4, 4]) / warmup, rtol=1e-4, atol=1e-9)
  np.testing.assert_allclose(moves(tx.critic, 2), [lr, lr], rtol=1e-4)


@pytest.mark.slow
def test_scoring_in_trimmed_length_chunks_equals_scoring_the_padded_batch(tmp_path_factory, tmp_path):
  """`score_rows` (length-sorted chunks, each cut after its own last step) gives the old policy's and the
  reference's log-probs and the critic's values of every step token the padded batch gives in one pass,
  on fewer tokens; the targets built from them are the same."""
  ws = Workspace(workspace_copy(tmp_path_factory, tmp_path))
  cfg = make_config(ws.root, {"ppo.rollouts_per_iteration": 12, "ppo.mini_batch_size": 2, "ppo.grad_accum": 3,
                              "ppo.reward_modes": "grounding_only", "ppo.length_bucket": 16, "eval.policies": "sft,ppo_*"})
  shared = ppo.Shared(cfg=cfg, ws=ws, tokenizer=common.load_tokenizer(cfg, ws), mesh=common.make_mesh(cfg))
  _, state = ppo.initial_state(cfg, ws, shared.mesh, ppo.optimizers(cfg))
  state = state.replace(policy=_perturbed_lora(state.policy, 0.3, seed=2), critic=_perturbed_lora(state.critic, 0.3, seed=4))
  sequences, _ = prm.load_sequences(read_trajectories(ws, prm.EXPLORE), shared.tokenizer, cfg.ppo.max_len)
  batch = ppo.reward_batch(cfg, "grounding_only", sequences[:12], ppo.progress_of(shared, "grounding_only", sequences[:12]),
                           shared.tokenizer.pad_id)
  chunks = ppo.length_chunks(batch, ppo.scoring_chunk_rows(12, cfg.ppo.grad_accum, shared.mesh))
  assert [len(c) for c in chunks] == [4, 4, 4] and sorted(np.concatenate(chunks)) == list(range(12))
  scored, tokens = ppo.score_rows(shared, state, batch)
  assert tokens < batch["tokens_bt"].size  # the short rows' chunks were cut
  with jax.set_mesh(shared.mesh):
    inputs = to_global_batch(prm.process_rows(batch), shared.mesh)
    whole = {"old_logp_bt": ppo.forward_logprobs(state.policy, inputs),
             "ref_logp_bt": ppo.forward_logprobs(ppo.lora_reference(state.policy), inputs),
             "old_values_bs": ppo.forward_step_values(state.critic, inputs, at="start")}
  in_steps = batch["step_id_bt"] >= 0
  for key in ("old_logp_bt", "ref_logp_bt"):
    np.testing.assert_allclose(scored[key][in_steps], np.asarray(whole[key])[in_steps], atol=2e-5)
  assert np.abs(scored["old_logp_bt"] - scored["ref_logp_bt"])[in_steps].max() > 1e-3  # a moved policy
  np.testing.assert_allclose(scored["old_values_bs"], np.asarray(whole["old_values_bs"]), atol=2e-5)
  assert np.abs(scored["old_values_bs"]).max() > 1e-3


def _padded_tokens(ends: np.ndarray, minis: list[np.ndarray], bucket: int) -> int:
  return sum(len(mini) * -(-(int(ends[mini].max()) + 1) // bucket) * bucket for mini in minis)


def test_update_mini_batches_grouped_by_length_cover_every_row_once_with_less_padding():
  rng = np.random.default_rng(7)
  ends = np.where(rng.random(32) < 0.5, rng.integers(300, 1000, 32), rng.integers(1100, 2000, 32))  # 2 lengths
  uniform = ppo.epoch_mini_batches(ends, 8, np.random.default_rng([1, 2, 3]), 1024)
  # off: the same mini-batches as a plain seeded permutation cut in order (runs before the option are unchanged)
  order = np.random.default_rng([1, 2, 3]).permutation(32)
  assert [list(m) for m in uniform] == [list(order[i:i + 8]) for i in range(0, 32, 8)]
  epochs = [ppo.epoch_mini_batches(ends, 8, np.random.default_rng([1, 2, e]), 1024, group_by_length=True)
            for e in range(4)]
  for minis in epochs:
    assert sorted(np.concatenate(minis).tolist()) == list(range(32)) and all(len(m) == 8 for m in minis)
    # at most one mini-batch mixes the two lengths (where the short rows run out)
    assert sum(len({int(e) // 1024 for e in ends[m] + 1}) > 1 for m in minis) <= 1
    assert _padded_tokens(ends, minis, 1024) < _padded_tokens(ends, uniform, 1024)
  # grouping stays random: the epochs pair up different rows
  assert len({frozenset(frozenset(m.tolist()) for m in minis) for minis in epochs}) > 1


def test_the_kl_early_stop_leaves_the_policy_alone_for_the_rest_of_the_iteration(tmp_path):
  """ppo.target_kl: once one mini-batch is beyond 1.5 x target_kl, every later update of the iteration
  (later epochs included) is the critic's alone; unset, the policy trains on every mini-batch."""
  rows, seq_len = 32, 16
  batch = {"tokens_bt": np.ones((rows, seq_len), np.int32), "positions_bt": np.tile(np.arange(seq_len), (rows, 1)),
           "step_end_idx_bs": np.tile([4, 9], (rows, 1)), "step_mask_bs": np.ones((rows, 2), np.float32)}

  def run(target_kl):
    cfg = make_config(tmp_path, {"ppo.rollouts_per_iteration": rows, "ppo.mini_batch_size": 8, "ppo.grad_accum": 1,
                                 "ppo.ppo_epochs": 2, "ppo.length_bucket": 8, "ppo.critic_warmup": 0,
                                 "ppo.target_kl": target_kl})
    shared = types.SimpleNamespace(cfg=cfg, mesh=common.make_mesh(cfg))
    calls = []

    def step_fn(state, micro_batches, train_policy):  # the second update finds the policy beyond the limit
      calls.append(bool(train_policy))
      beyond = len(calls) == 2
      return state, {"beyond_kl": np.float32(beyond), "policy_updated": np.float32(bool(train_policy) and not beyond)}

    _, metrics = ppo.update(shared, step_fn, None, batch, iteration=0)
    return calls, metrics

  calls, metrics = run(0.01)
  assert calls == [True, True] + [False] * 6  # 4 mini-batches x 2 epochs
  assert metrics["policy_updated"] == 1 / 8
  calls, metrics = run(None)
  assert calls == [True] * 8 and metrics["policy_updated"] == 7 / 8


def test_update_micro_batches_hold_rows_on_every_batch_device():
  mesh = types.SimpleNamespace(shape={"data": 2, "fsdp": 2})  # 4 batch devices
  assert ppo.micro_batch_rows(1, 8, mesh) == 4  # one trajectory per micro-batch is raised to one per device
  assert ppo.micro_batch_rows(8, 16, mesh) == 8
  assert ppo.micro_batch_rows(2, 4, types.SimpleNamespace(shape={"data": 1, "fsdp": 1})) == 2
  with pytest.raises(ValueError, match=r"make ppo.grad_accum a multiple of 2"):
    ppo.micro_batch_rows(2, 6, mesh)
