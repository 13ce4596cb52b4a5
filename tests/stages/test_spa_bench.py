"""bench/spa_bench.py's aggregation: per-policy mean, std and Student-t interval over seeds, and the
paired per-seed difference of each dense reward mode against sparse, with its median and sign count
(figures of one real run: four SPA seeds above sparse and one collapsed)."""

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
