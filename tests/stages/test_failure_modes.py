"""bench/failure_modes.py: the failure-mode flags of recorded episodes and their pooling over runs."""

import json
import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))
import failure_modes  # noqa: E402


def _episode(actions: list[tuple[str, bool]], success: bool, purchased: bool = True) -> dict:
  return {"success": success, "purchased": purchased, "final_reward": float(success),
          "instruction": "i want storage baskets, and price lower than 50.00 dollars", "steps": [{"parsed_action": action, "valid": valid} for action, valid in actions]}


SEARCH = ("search[storage baskets]", True)
BOUGHT_WITHOUT = _episode([SEARCH, ("click[B0262LPGH8]", True), ("click[natural]", False), ("click[Buy Now]", True)], False)
BACK_THEN_OK = _episode([SEARCH, ("click[B0262LPGH8]", True), ("click[< Prev]", True), ("click[B07AU9CBG2]", True),
                         ("click[natural]", True), ("click[Buy Now]", True)], True)
WRONG_VALID_OPTION = _episode([SEARCH, ("click[B0262LPGH8]", True), ("click[large]", True), ("click[Buy Now]", True)], False)
INVALID_BEFORE_OPENING = _episode([SEARCH, ("click[natural]", False), ("click[B0262LPGH8]", True),
                                   ("click[Buy Now]", True)], False)


def test_an_invalid_value_click_after_opening_a_product_then_buying_is_the_option_failure():
  assert failure_modes.episode_features(BOUGHT_WITHOUT) == {
      "success": False, "bought_without_option": True, "went_back": False, "opened_two": False,
      "no_purchase": False, "repeated_action": False}
  assert failure_modes.episode_features(BACK_THEN_OK) == {
      "success": True, "bought_without_option": False, "went_back": True, "opened_two": True,
      "no_purchase": False, "repeated_action": False}
  # a valid (wrong) option and an invalid click before any product page are other failures
  assert not failure_modes.episode_features(WRONG_VALID_OPTION)["bought_without_option"]
  assert not failure_modes.episode_features(INVALID_BEFORE_OPENING)["bought_without_option"]


def test_a_stall_repeats_a_valid_action_and_never_buys():
  stalled = _episode([SEARCH, ("click[B0262LPGH8]", True), ("click[small]", True), ("click[small]", True),
                      ("click[small]", True)], False, purchased=False)
  flags = failure_modes.episode_features(stalled)
  assert flags["no_purchase"] and flags["repeated_action"]
  # an invalid click repeated is not the stall (it earns no grounding bonus); distinct valid clicks are not either
  retried = _episode([SEARCH, ("click[B0262LPGH8]", True), ("click[natural]", False), ("click[natural]", False),
                      ("click[Buy Now]", True)], False)
  assert not failure_modes.episode_features(retried)["repeated_action"]
  assert not failure_modes.episode_features(BACK_THEN_OK)["repeated_action"]
  summary = failure_modes.group_summary([stalled, BACK_THEN_OK])
  assert summary["no_purchase"] == 50.0 and summary["repeated_action"] == 50.0


def test_runs_pool_by_arm_first_and_last_iterations_apart(tmp_path):
  def write(workspace: str, name: str, episodes: list[dict]):
    path = tmp_path / workspace / "trajectories" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in episodes))
  for seed in (0, 1):
    write(f"seed{seed}_sparse", "ppo_sparse_it0000.p0.jsonl", [BOUGHT_WITHOUT, BOUGHT_WITHOUT])
    write(f"seed{seed}_sparse", "ppo_sparse_it0001.p0.jsonl", [BOUGHT_WITHOUT, WRONG_VALID_OPTION])
    write(f"seed{seed}_sparse", "ppo_sparse_it0002.p0.jsonl", [BACK_THEN_OK, WRONG_VALID_OPTION])
  write("seed0_spa_penalty", "ppo_spa_it0000.p0.jsonl", [BACK_THEN_OK])
  report = failure_modes.collect(tmp_path, iterations=1)
  assert set(report) == {"sparse", "spa_penalty"} and report["sparse"]["runs"] == 2
  first, last = report["sparse"]["train rollouts, first 1 iterations"], report["sparse"]["train rollouts, last 1 iterations"]
  assert first == {"episodes": 4, "success": 0.0, "bought_without_option": 100.0, "other_failures": 0.0,
                   "went_back": 0.0, "success_after_back": None, "opened_two": 0.0, "no_purchase": 0.0,
                   "repeated_action": 0.0}
  assert last == {"episodes": 4, "success": 50.0, "bought_without_option": 0.0, "other_failures": 50.0,
                  "went_back": 50.0, "success_after_back": 100.0, "opened_two": 50.0, "no_purchase": 0.0,
                  "repeated_action": 0.0}
  assert "| spa_penalty (1): train rollouts, first 1 iterations | 1 | 100.0 |" in failure_modes.table(report)


def _searched(query: str, success: bool, reward: float, instruction: str) -> dict:
  return {**_episode([(f"search[{query}]", True), ("click[B0262LPGH8]", True), ("click[Buy Now]", True)], success),
          "instruction": instruction, "final_reward": reward}


WITH_VALUES = "i want storage baskets with color: natural, and size: large, and price lower than 50.00 dollars"


def test_the_first_search_names_the_requested_values_only_when_it_names_all_of_them():
  assert failure_modes.query_names_values(_searched("storage baskets natural large", True, 1.0, WITH_VALUES))
  assert failure_modes.query_names_values(_searched("storage baskets natural", False, 0.5, WITH_VALUES)) is False
  assert failure_modes.query_names_values(_searched("storage baskets", False, 0.5,
                                                    "i want storage baskets, and price lower than 50.00 dollars")) is None
  clicked_first = {**_episode([("click[B0262LPGH8]", False), SEARCH], False), "instruction": WITH_VALUES}
  assert failure_modes.query_names_values(clicked_first) is None


def test_query_summary_splits_success_and_score_by_whether_the_query_names_the_values():
  records = [_searched("storage baskets natural large", True, 1.0, WITH_VALUES),
             _searched("storage baskets natural large", False, 0.8, WITH_VALUES),
             _searched("storage baskets", False, 0.5, WITH_VALUES),
             _searched("storage baskets", False, 0.5, "i want storage baskets, and price lower than 50.00 dollars")]
  assert failure_modes.query_summary(records) == {
      "episodes": 3, "names_values": 66.7, "success_named": 50.0, "success_plain": 0.0,
      "score_named": 90.0, "score_plain": 50.0}


def test_the_kl_regularised_share_tilts_the_reference_by_the_exponentiated_gain():
  assert failure_modes.regularised_share(0.43, 0.0, 0.3) == pytest.approx(0.43)      # no gain: the reference
  assert failure_modes.regularised_share(0.5, 0.3 * math.log(3), 0.3) == pytest.approx(0.75)  # odds x3
  shares = [failure_modes.regularised_share(0.43, 0.087, b) for b in (1.0, 0.3, 0.03)]
  assert shares == sorted(shares) and 0.43 < shares[0] and shares[-1] > 0.9         # a smaller beta pulls further
  report = {"sparse": {"runs": 1, "first search": {"g": {"episodes": 10, "names_values": 50.0, "success_named": 80.0,
                                                        "success_plain": 40.0, "score_named": 100.0, "score_plain": 70.0}}}}
  assert "| sparse (1): g | 10 | 50.0 | 80.0 / 40.0 | 100.0 / 70.0 | 73.1 |" in failure_modes.table(report, (0.3,))
