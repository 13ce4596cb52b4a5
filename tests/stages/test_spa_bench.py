"""bench/spa_bench.py's aggregation: per-policy mean, std and Student-t interval over seeds, and the
paired per-seed difference of each dense reward mode against sparse, with its median and sign count
(figures of one real run: four SPA seeds above sparse and one collapsed)."""

import json
import pathlib
import sys

import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))
import spa_bench  # noqa: E402

SPARSE = [74.5, 77.0, 77.0, 76.0, 77.0]
SPA = [80.5, 80.5, 17.5, 81.0, 81.5]


def _seed(seed: int, sparse: float, spa: float) -> dict:
  def policy(success):
    return {"score": success + 20.0, "success_rate": success, "purchase_rate": 100.0, "grounding": 95.0,
            "mean_steps": 4.0}
  return {"seed": seed, "eval_tasks": 200, "policies": {"sft": policy(72.0), "ppo_sparse": policy(sparse),
                                                         "ppo_spa": policy(spa)},
          "sft": {"steps": 126, "seconds": 83.0, "final_loss": 0.005}, "wall_s": 1000.0, "cpu_s": 2000.0}


def test_paired_difference_reports_mean_interval_median_and_sign_count():
  seeds = [_seed(i, a, b) for i, (a, b) in enumerate(zip(SPARSE, SPA))]
  summary = spa_bench.aggregate(seeds)
  diffs = np.array(SPA) - np.array(SPARSE)
  paired = summary["minus_sparse"]["spa"]["success_rate"]
  assert paired["per_seed"] == pytest.approx(diffs.tolist())
  assert paired["mean"] == pytest.approx(-8.1) and paired["median"] == pytest.approx(4.5) and paired["above"] == 4
  expected = stats.t.interval(0.95, diffs.size - 1, loc=diffs.mean(), scale=stats.sem(diffs))
  assert paired["ci95"] == pytest.approx(expected)
  assert summary["policies"]["ppo_sparse"]["success_rate"] == pytest.approx((np.mean(SPARSE), np.std(SPARSE, ddof=1)))
  assert summary["ci95"]["sft"]["success_rate"] == pytest.approx((72.0, 72.0))  # one policy: no spread
  assert "sft" not in summary["minus_sparse"] and "sparse" not in summary["minus_sparse"]
  table = spa_bench.markdown(seeds, summary)
  assert "Paired spa - sparse, success_rate: mean -8.1, 95% CI [-43.8, +27.6]" in table
  assert "median +4.5, above sparse on 4 of 5 seeds" in table

  one = spa_bench.paired_difference(seeds[:1], "ppo_spa", "ppo_sparse")["score"]
  assert all(np.isnan(one["ci95"])) and one["above"] == 1


def test_arms_parse_and_report_their_run_under_their_own_name():
  assert spa_bench.parse_arm("spa_penalty:spa:label.grounding_form=penalty:label.grounding_coef=0.25") == (
      "spa_penalty", "spa", {"label.grounding_form": "penalty", "label.grounding_coef": "0.25"})
  assert spa_bench.parse_arm("spa_lr:spa") == ("spa_lr", "spa", {})
  for bad in ("spa_penalty", "spa:spa", ":spa", "x:spa:grounding"):
    with pytest.raises(SystemExit, match="--arm"):
      spa_bench.parse_arm(bad)
  result = {"seed": 0, "policies": {"sft": {"score": 1.0}, "ppo_spa": {"score": 2.0}},
            "curves": {"ppo_spa": {"step": [1]}}, "eval_curves": {}}
  own = spa_bench.renamed(result, "spa", "spa_penalty")
  assert list(own["policies"]) == ["sft", "ppo_spa_penalty"] and list(own["curves"]) == ["ppo_spa_penalty"]
  assert own["policies"]["ppo_spa_penalty"] == {"score": 2.0} and result["policies"].keys() == {"sft", "ppo_spa"}
  seeds = [_seed(i, a, b) for i, (a, b) in enumerate(zip(SPARSE, SPA))]
  for seed, penalty in zip(seeds, [79.0, 80.0, 78.0, 81.0, 80.0]):
    seed["policies"]["ppo_spa_penalty"] = seed["policies"]["ppo_spa"] | {"success_rate": penalty}
  summary = spa_bench.aggregate(seeds)
  assert set(summary["minus_sparse"]) == {"spa", "spa_penalty"}
  assert summary["minus_sparse"]["spa_penalty"]["success_rate"]["above"] == 5


def test_a_run_that_does_not_finish_leaves_the_others_reported_and_is_named(tmp_path, monkeypatch):
  """One of six PPO runs fails (as seed2_spa_penalty ran out of GPU memory on 2026-12-07): the five
  others are collected, the failed one's policy row covers the seeds that evaluated it, and the same
  root read again with collect_only (workspaces copied back from a GPU machine) gives the same report."""
  success = {"seed0_sparse": 74.0, "seed1_sparse": 76.0, "seed0_spa": 78.0, "seed1_spa": 81.0,
             "seed0_spa_penalty": 80.0}

  def fake_run_pipeline(workdir, overrides, config):
    policy = overrides.get("eval.policies")
    if workdir.name == "seed1_spa_penalty":
      raise RuntimeError(f"{workdir.name} failed (exit 1); see {workdir}.log")
    (workdir / "sft").mkdir(parents=True, exist_ok=True)
    (workdir / "sft" / "DONE.json").write_text(json.dumps({"summary": {"steps": 5, "final_loss": 0.1, "seconds": 1.0}}))
    (workdir / "config.json").write_text(json.dumps({"ppo": {"eval_tasks": 50}}))
    if policy is None:  # the upstream's label run
      return {"wall_s": 1.0, "cpu_s": 1.0}
    rate = 72.0 if policy == "sft" else success[workdir.name]
    row = {"score": rate + 20, "success_rate": rate, "purchase_rate": 100.0, "grounding": 95.0, "mean_steps": 4.0}
    (workdir / "reports").mkdir(exist_ok=True)
    (workdir / "reports" / "eval.json").write_text(json.dumps({"tasks": 200, "policies": {policy: row}}))
    return {"wall_s": 2.0, "cpu_s": 3.0}

  monkeypatch.setattr(spa_bench, "run_pipeline", fake_run_pipeline)
  arms = [spa_bench.parse_arm("spa_penalty:spa:label.grounding_form=penalty")]
  seeds, missing = spa_bench.run_ppo_seeds(tmp_path, 0, [0, 1], {"ppo.reward_modes": "sparse,spa"},
                                           "configs/eval.py", jobs=3, arms=arms)
  assert missing == [f"seed1_spa_penalty (seed1_spa_penalty failed (exit 1); see {tmp_path}/seed1_spa_penalty.log)"]
  assert set(seeds[0]["policies"]) == {"sft", "ppo_sparse", "ppo_spa", "ppo_spa_penalty"}
  assert set(seeds[1]["policies"]) == {"sft", "ppo_sparse", "ppo_spa"}
  summary = spa_bench.aggregate(seeds)
  assert summary["seeds"] == {"sft": 2, "ppo_sparse": 2, "ppo_spa": 2, "ppo_spa_penalty": 1}
  assert summary["policies"]["ppo_spa_penalty"]["success_rate"] == (80.0, 0.0)
  assert summary["minus_sparse"]["spa_penalty"]["success_rate"]["per_seed"] == [6.0]
  assert summary["minus_sparse"]["spa"]["success_rate"]["per_seed"] == [4.0, 5.0]
  assert "| ppo_spa_penalty (1 of 2 seeds) |" in spa_bench.markdown(seeds, summary)

  again, missing_again = spa_bench.run_ppo_seeds(tmp_path, 0, [0, 1], {"ppo.reward_modes": "sparse,spa"},
                                                 "configs/eval.py", jobs=1, arms=arms, collect_only=True)
  assert missing_again == ["seed1_spa_penalty (no eval report of ppo_spa)"]
  assert [s["policies"] for s in again] == [s["policies"] for s in seeds]
  assert all(s["wall_s"] == 0.0 for s in again) and "Time per seed" not in spa_bench.markdown(again, summary)


def test_curve_band_keeps_the_iterations_only_some_seeds_reached():
  seeds = [{"curves": {"ppo_spa": {"step": [1, 2, 3], "success_rate": [60.0, 70.0, 80.0]}}},
           {"curves": {"ppo_spa": {"step": [1, 2], "success_rate": [50.0, 90.0]}}}, {"curves": {}}]
  steps, mean, low, high = spa_bench.curve_band(seeds, "curves", "ppo_spa", "success_rate")
  assert steps.tolist() == [1, 2, 3] and mean.tolist() == [55.0, 80.0, 80.0]
  assert low.tolist() == [50.0, 70.0, 80.0] and high.tolist() == [60.0, 90.0, 80.0]


def _eval_seed(seed: int, sparse: list[float], dense: list[float], steps=(0, 4, 8), tasks: int = 50) -> dict:
  curve = lambda values: {"step": list(steps)[:len(values)], "eval_success_rate": values}
  return {"seed": seed, "held_out_tasks": tasks,
          "eval_curves": {"ppo_sparse": curve(sparse), "ppo_spa_penalty": curve(dense)}}


def test_the_half_the_iterations_criterion_per_seed_and_pooled_over_seeds():
  seeds = [_eval_seed(0, [60.0, 66.0, 80.0], [60.0, 82.0, 84.0]),
           _eval_seed(1, [60.0, 70.0, 76.0], [60.0, 70.0, 90.0]),
           _eval_seed(2, [60.0, 72.0], [60.0, 74.0], steps=(0, 4))]  # its budget ended before iteration 8
  per_seed = spa_bench.iterations_to_reach(seeds, "ppo_spa_penalty")
  assert [(r["target"], r["iteration"], r["fraction"]) for r in per_seed] == [(80.0, 4, 0.5), (76.0, 8, 1.0), (72.0, 4, 1.0)]
  # one seed's 50 goals: +-19.6 points of noise on the difference of two evaluations at 70%
  assert per_seed[0]["noise"] == pytest.approx(100 * 2 * np.sqrt(2 * 0.7 * 0.3 / 50))
  pooled = spa_bench.pooled_iterations_to_reach(seeds, "ppo_spa_penalty")
  # the steps all three reached are 0 and 4: sparse's mean 60 -> 69.3, the dense mean at 4 is 75.3
  assert pooled["steps"] == [0, 4] and pooled["seeds"] == 3
  assert pooled["target"] == pytest.approx(208 / 3) and pooled["iteration"] == 4 and pooled["fraction"] == 1.0
  p = (60 + 208 / 3) / 200
  assert pooled["noise"] == pytest.approx(100 * 2 * np.sqrt(2 * p * (1 - p) / 150))
  assert spa_bench.pooled_iterations_to_reach(seeds, "ppo_spa") is None  # no such policy
  lines = "\n".join(spa_bench.reach_lines({"reaches_sparse_final": {"spa_penalty": {"per_seed": per_seed, "pooled": pooled}}}))
  assert "spa_penalty's held-out success rate reaches sparse's final one" in lines
  assert "Pooled over 3 seeds (mean curves at the evaluations all of them reached, iterations [0, 4])" in lines


def test_power_analysis_of_the_paired_difference_matches_simulation_and_its_own_inverses():
  rng = np.random.default_rng(0)
  sd, n = 4.0, 5
  effect = spa_bench.detectable_difference(sd, n)
  assert spa_bench.paired_t_power(effect, sd, n) == pytest.approx(0.8)
  # the t-test rejects in about 80% of simulated 5-seed experiments at that true difference, 5% at none
  diffs = rng.normal(effect, sd, size=(20_000, n))
  rejected = stats.ttest_1samp(diffs, 0.0, axis=1).pvalue < 0.05
  assert rejected.mean() == pytest.approx(0.8, abs=0.015)
  null = stats.ttest_1samp(rng.normal(0.0, sd, size=(20_000, n)), 0.0, axis=1).pvalue < 0.05
  assert null.mean() == pytest.approx(0.05, abs=0.006)
  assert spa_bench.paired_t_power(0.0, sd, n) == pytest.approx(0.05)
  # more seeds resolve less; the seeds needed for that difference are these 5 (4 fall short)
  assert spa_bench.detectable_difference(sd, 20) < effect / 2
  assert spa_bench.seeds_needed(effect, sd) == n and spa_bench.paired_t_power(effect, sd, n - 1) < 0.8
  assert spa_bench.seeds_needed(2.0, 4.67) > 30  # the paper's +2 at the spread of 2026-12-07's paired success rates
  assert spa_bench.seeds_needed(1e-3, sd) is None and np.isnan(spa_bench.detectable_difference(float("nan"), 1))


def test_the_table_says_what_the_seeds_can_resolve():
  seeds = [_seed(i, a, b) for i, (a, b) in enumerate(zip(SPARSE, SPA))]
  summary = spa_bench.aggregate(seeds)
  paired = summary["minus_sparse"]["spa"]["success_rate"]
  sd = np.std(np.array(SPA) - np.array(SPARSE), ddof=1)
  assert paired["detectable"] == pytest.approx(spa_bench.detectable_difference(sd, 5))
  assert paired["paper_gain"] == 2.5 and paired["seeds_for_paper_gain"] == spa_bench.seeds_needed(2.5, sd)
  assert f"these seeds detect a true difference of {paired['detectable']:.1f} or more" in spa_bench.markdown(seeds, summary)
  assert "detect" not in spa_bench.markdown(seeds[:1], spa_bench.aggregate(seeds[:1]))


def _per_goal(successes) -> dict:
  return {"score": {g: 50.0 + 50.0 * s for g, s in enumerate(successes)},
          "success_rate": {g: 100.0 * s for g, s in enumerate(successes)}}


def test_the_paired_spread_splits_into_the_goals_drawn_and_ppo_seed_to_seed():
  rng = np.random.default_rng(3)
  # every seed: the same two policies' chances per goal, drawn anew (no PPO seed effect), 200 goals
  chance_a, chance_b = rng.uniform(0.5, 1.0, 200), rng.uniform(0.5, 1.0, 200)
  seeds = []
  for seed in range(40):
    a, b = rng.random(200) < chance_a, rng.random(200) < chance_b
    seeds.append({"seed": seed, "eval_tasks": 200, "per_goal": {"ppo_spa": _per_goal(a), "ppo_sparse": _per_goal(b)},
                  "policies": {"ppo_spa": {"score": 0.0, "success_rate": 100.0 * a.mean()},
                               "ppo_sparse": {"score": 0.0, "success_rate": 100.0 * b.mean()}}})
  paired = spa_bench.paired_difference(seeds, "ppo_spa", "ppo_sparse")["success_rate"]
  # the goals drawn explain the spread: one seed's variance of mean per-goal differences, checked by hand
  a, b = (np.array(list(seeds[0]["per_goal"][p]["success_rate"].values())) for p in ("ppo_spa", "ppo_sparse"))
  assert spa_bench.goal_noise(seeds[:1], "ppo_spa", "ppo_sparse", "success_rate") == pytest.approx(
      np.var(a - b, ddof=1) / 200)
  assert paired["goal_sd"] == pytest.approx(np.std(paired["per_seed"], ddof=1), rel=0.2)
  assert paired["seed_sd"] < paired["goal_sd"] / 2
  # a PPO seed effect of sd 10 points adds to it, and the split finds it
  shifts = rng.normal(0.0, 10.0, len(seeds))
  for seed, shift in zip(seeds, shifts):
    seed["policies"]["ppo_spa"]["success_rate"] += shift
  shifted = spa_bench.paired_difference(seeds, "ppo_spa", "ppo_sparse")["success_rate"]
  assert shifted["goal_sd"] == paired["goal_sd"] 
  assert shifted["seed_sd"] == pytest.approx(np.std(shifts, ddof=1), rel=0.15)
  assert "of one evaluation on these goals" in spa_bench.power_note(shifted)
  assert np.isnan(spa_bench.goal_noise([{"policies": {}}], "ppo_spa", "ppo_sparse", "score"))


def test_per_goal_reads_the_final_evaluation_and_collect_keeps_it(tmp_path):
  trajectories = tmp_path / "trajectories"
  trajectories.mkdir()
  records = [{"task_id": t, "rollout": 0, "final_reward": r, "success": r == 1.0} for t, r in ((4, 1.0), (2, 0.5))]
  (trajectories / "eval_ppo_sparse.p0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert spa_bench.per_goal(tmp_path, "ppo_sparse") == {"score": {2: 50.0, 4: 100.0},
                                                        "success_rate": {2: 0.0, 4: 100.0}}
