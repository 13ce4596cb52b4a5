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
                   "repeated_action": 0.0, "picked_top": None, "over_budget": None,
                   "trap_episodes": 0, "trap_picked_other": None, "trap_success_top": None, "trap_success_other": None}
  assert last == {"episodes": 4, "success": 50.0, "bought_without_option": 0.0, "other_failures": 50.0,
                  "went_back": 50.0, "success_after_back": 100.0, "opened_two": 50.0, "no_purchase": 0.0,
                  "repeated_action": 0.0, "picked_top": None, "over_budget": None,
                  "trap_episodes": 0, "trap_picked_other": None, "trap_success_top": None, "trap_success_other": None}
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


RESULTS_PAGE = ("Observation:\nInstruction: [SEP] i want storage baskets, and price lower than 50.00 dollars [SEP] "
                "Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] B0262LPGH8 [SEP] Wicker Basket "
                "[SEP] $67.47 [SEP] B07AU9CBG2 [SEP] Rope Basket [SEP] $24.99 to $43.99 [SEP] B0HAEFFM7S [SEP] Tote [SEP] $1,020.00")


def _picked(asin: str, success: bool = False) -> dict:
  episode = _episode([SEARCH, (f"click[{asin}]", True), ("click[Buy Now]", True)], success)
  episode["steps"][1]["observation"] = RESULTS_PAGE
  return episode


def test_the_first_pick_from_a_results_page_is_checked_against_the_listing_and_the_budget():
  assert failure_modes.listed_products(RESULTS_PAGE) == [("b0262lpgh8", 67.47), ("b07au9cbg2", 24.99), ("b0haeffm7s", 1020.0)]
  assert failure_modes.listed_products("Observation:\nInstruction: [SEP] x [SEP] Buy Now") == []
  # the top listing at $67.47 while $24.99 was listed: over the $50 budget past one under it
  assert failure_modes.first_pick(_picked("B0262LPGH8")) == {"top": True, "over_budget": True, "trap": True}
  assert failure_modes.first_pick(_picked("B07AU9CBG2")) == {"top": False, "over_budget": False, "trap": True}
  assert failure_modes.first_pick(_picked("B0HAEFFM7S")) == {"top": False, "over_budget": True, "trap": True}
  assert failure_modes.first_pick(_episode([SEARCH], False, purchased=False)) is None
  # a budget above every listing: no trap, nothing over it
  roomy = _picked("B0262LPGH8")
  roomy["instruction"] = roomy["instruction"].replace("50.00", "2000.00")
  assert failure_modes.first_pick(roomy) == {"top": True, "over_budget": False, "trap": False}
  summary = failure_modes.group_summary([_picked("B0262LPGH8"), _picked("B07AU9CBG2", True), _picked("B07AU9CBG2"),
                                         _episode([SEARCH], False, False), roomy])
  assert summary["picked_top"] == 50.0 and summary["over_budget"] == 25.0
  assert (summary["trap_episodes"], summary["trap_picked_other"]) == (3, 66.7)
  assert (summary["trap_success_top"], summary["trap_success_other"]) == (0.0, 50.0)


def _evaluated(task: int, success: bool, **terms) -> dict:
  info = {"r_type": 1.0, "r_att": 1.0, "r_option": 1.0, "r_price": True, **terms}
  return {"task_id": task, "success": success, "purchased": bool(terms) or success, "reward_info": info if (terms or success) else None}


def test_goal_outcomes_follow_each_sft_failure_and_success_through_the_runs(tmp_path):
  sft = {0: _evaluated(0, False, r_price=False), 1: _evaluated(1, False, r_option=0.0), 2: _evaluated(2, False),
         3: _evaluated(3, True), 4: _evaluated(4, True)}
  runs = [{0: {**_picked("B0262LPGH8"), **_evaluated(0, False, r_price=False)}, 1: _evaluated(1, True), 2: _evaluated(2, True),
           3: _evaluated(3, True), 4: _evaluated(4, False, r_att=0.5, r_option=0.0)},
          {0: _evaluated(0, False, r_att=0.5), 1: _evaluated(1, True), 2: _evaluated(2, False),
           3: _evaluated(3, True), 4: _evaluated(4, False)}]
  outcome = failure_modes.goal_outcomes(sft, runs)
  assert outcome == {"runs": 2, "sft_failed": 3, "fixed_by_every_run": 1, "fixed_by_some_runs": 1, "fixed_by_no_run": 1,
                     "never_fixed_sft_shortfall": {"price": 1}, "never_fixed_runs_shortfall": {"price": 1, "att": 1},
                     "never_fixed_price_shortfalls": 1, "of_them_top_pick_over_budget": 1,
                     "sft_solved": 2, "lost_by_some_run": 1, "lost_by_every_run": 1}
  assert failure_modes.shortfall(runs[0][4]) == "att+option" and failure_modes.shortfall(runs[1][4]) == "no purchase"
  with pytest.raises(SystemExit, match="same test goals"):
    failure_modes.goal_outcomes(sft, [{0: sft[0]}])
  # from workspaces: upstream's evaluation is the reference, seed<k>_<arm>'s are the runs
  for workspace, records in (("upstream", sft), ("seed0_sparse", runs[0]), ("seed1_sparse", runs[1])):
    path = tmp_path / workspace / "trajectories" / "eval_policy.p0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records.values()))
  assert failure_modes.collect_goals(tmp_path) == {"sparse": outcome}
  assert "| sparse (2) | 3 | 1 / 1 / 1 | price 1 | price 1, att 1 | 1 of 1 | 2 | 1 / 1 |" in failure_modes.goals_table({"sparse": outcome})
