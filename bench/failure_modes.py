"""How episodes fail, from recorded trajectories: what PPO has left to fix and whether it can.

    .venv/bin/python bench/failure_modes.py --root /tmp/spa            # spa_bench's seed<k>_<arm> workspaces
    .venv/bin/python bench/failure_modes.py --root runs/default --iterations 5 --no-results

For every PPO run under --root (each workspace's trajectories/ppo_<mode>_it*.jsonl: train rollouts at
the sampling temperature; ppo_<mode>_eval*.jsonl: greedy held-out episodes), pooled over the
workspaces of the same arm: the first and the last --iterations iterations' rollouts, the first
held-out evaluation (the SFT policy) and each run's last one. Per group:
  success %                       final reward 1.0
  bought without the option %     an episode that opened a product, clicked a value the product page
                                  does not offer (an invalid click, e.g. click[natural] on a page
                                  listing only sizes) and bought it anyway: its r_option is 0
  other failures %                every other episode below reward 1.0 (wrong attributes, price, no purchase)
  went back %                     episodes with a "< Prev" or "Back to Search" click
  success after going back %      of those, the share that succeeded
  opened 2+ products %            episodes that opened more than one product page
  no purchase %                   episodes that ended without buying (the step cap or the context limit)
  repeated an action %            episodes that took the same valid action twice in a row (e.g. click[small]
                                  on a page where small is already selected): the stall that a reward
                                  paying per valid step (SPA's grounding bonus) makes profitable
  picked the top result %         of the episodes that opened a product from a results page, the share whose
                                  first pick was the page's first listing
  over budget past one under it % of those, the share whose first pick's listed price was at or above the
                                  instruction's limit while the same page listed a product under it
A failure mode that no rollout escapes (the policy never goes back) is one on-policy PPO cannot
reinforce, with any reward. A second table, over the episodes whose goal names option values ("with
color: white, and size: 9") and whose first action is a search: the share whose query names every
one of those values, and success and score (reward x 100) with and without them. The scripted expert
adds the values only where its privileged look at the results says the plain request's top result
lacks them, so a cloned policy half-learns that choice; PPO has a lever there exactly when the gap
between the two is large. How far PPO with a KL penalty can pull that share: treating the choice as
one decision with the score gap g between its two outcomes (reward units) and the sampling share p0
as the reference policy's, the optimum of E[R] - beta * KL(pi || ref) is the share
p0 * exp(g / beta) / (p0 * exp(g / beta) + 1 - p0), given per row for each --kl-coefs beta (an
approximation: goals differ in p0 and g, and later steps are held fixed).

A third table, over the episodes whose first pick came from a results page whose top listing is over
the instruction's budget while another listing is under it (the trap a policy that always opens the
top result falls into): how many, the share that picked another listing, and success when they picked
the top one and when another. A fourth, from the final greedy evaluations on the test goals
(trajectories/eval_*.jsonl: the upstream workspace's SFT policy, each seed<k>_<arm> workspace's PPO
policy): of the goals the SFT policy failed, how many every run, some runs or no run of an arm fixed,
and why the episodes on the goals no run fixed fell short (the WebShop reward terms below 1: type,
att(ributes), option, price; or no purchase; and how many of the price shortfalls picked an over-budget
top listing past one under budget); of the goals SFT solved, how many at least one run and every run
lost. Appends a section to bench/RESULTS.md (unless --no-results) and ends with ONE JSON line on stdout.
"""

import argparse
import collections
import json
import math
import pathlib
import re

import results_log
from webshop.expert import requested_price_limit, requested_values

_ASIN_TEXT = r"b0[0-9a-z]{8}"
_PRODUCT_CLICK = re.compile(rf"^click\[{_ASIN_TEXT}\]$", re.IGNORECASE)
_CLICK = re.compile(r"^click\[(.*)\]$", re.IGNORECASE)
_BACK = ("< prev", "back to search")
_SEARCH = re.compile(r"^search\[(.*)\]$", re.IGNORECASE)
_RUN_FILE = re.compile(r"^ppo_(?P<mode>.+)_(?P<kind>it|eval)(?P<index>\d+)\.p\d+\.jsonl$")
_ASIN = re.compile(rf"^{_ASIN_TEXT}$", re.IGNORECASE)
_PRICE = re.compile(r"^\$([0-9.,]+)")
_SHORTFALLS = ("r_type", "r_att", "r_option", "r_price")


def _clicked(action: str) -> str:
  """What a click action names, lower-cased ("" for other actions)."""
  match = _CLICK.match(action.strip())
  return match[1].strip().lower() if match else ""


def listed_products(observation: str) -> list[tuple[str, float | None]]:
  """(asin, lowest listed price) of each product a results page lists, in order ([] for other pages)."""
  segments = [segment.strip() for segment in observation.split("[SEP]")]
  listed = []
  for i, segment in enumerate(segments):
    if _ASIN.match(segment):
      price = _PRICE.match(segments[i + 2]) if i + 2 < len(segments) else None
      listed.append((segment.lower(), float(price[1].replace(",", "")) if price else None))
  return listed


def first_pick(record: dict) -> dict[str, bool] | None:
  """Of the episode's first product opened from a results page: was it the top listing; was it over the
  instruction's budget while the page listed one under it; was the top listing so (the trap)? None: no
  such pick."""
  limit = requested_price_limit(record["instruction"])
  for step in record["steps"]:
    action = (step.get("parsed_action") or "").strip()
    listed = listed_products(step.get("observation") or "")
    if step.get("valid") and _PRODUCT_CLICK.match(action) and listed:
      over = lambda price: limit is not None and price is not None and price >= limit
      one_under = limit is not None and any(price is not None and price < limit for _, price in listed)
      asin = _clicked(action)
      return {"top": asin == listed[0][0], "over_budget": over(dict(listed).get(asin)) and one_under,
              "trap": over(listed[0][1]) and one_under}
  return None


def episode_features(record: dict) -> dict[str, bool]:
  """The failure-mode flags of one trajectory record (spa_jax.rollout's JSONL)."""
  actions = [(step.get("parsed_action") or "", bool(step.get("valid"))) for step in record["steps"]]
  opened = [i for i, (action, valid) in enumerate(actions) if valid and _PRODUCT_CLICK.match(action)]
  invalid_value_click = any(
      not valid and action.lower().startswith("click[") and "buy now" not in action.lower()
      for action, valid in actions[opened[0] + 1:]) if opened else False
  return {"success": bool(record["success"]),
          "bought_without_option": invalid_value_click and bool(record["purchased"]) and not record["success"],
          "went_back": any(_clicked(action) in _BACK for action, _ in actions),
          "opened_two": len(opened) >= 2,
          "no_purchase": not record["purchased"],
          "repeated_action": any(valid and action == previous for (previous, _), (action, valid) in zip(actions, actions[1:]))}


def group_summary(records: list[dict]) -> dict[str, float]:
  flags = [episode_features(r) for r in records]
  n = len(flags)
  back = [f for f in flags if f["went_back"]]
  share = lambda count, total: round(100.0 * count / total, 1) if total else None  # None: no such episode
  bought = sum(f["bought_without_option"] for f in flags)
  return {"episodes": n, "success": share(sum(f["success"] for f in flags), n),
          "bought_without_option": share(bought, n),
          "other_failures": share(n - sum(f["success"] for f in flags) - bought, n),
          "went_back": share(len(back), n), "success_after_back": share(sum(f["success"] for f in back), len(back)),
          "opened_two": share(sum(f["opened_two"] for f in flags), n),
          "no_purchase": share(sum(f["no_purchase"] for f in flags), n),
          "repeated_action": share(sum(f["repeated_action"] for f in flags), n),
          **pick_summary(records)}


def pick_summary(records: list[dict]) -> dict[str, float | None]:
  picked = [(pick, record) for record in records if (pick := first_pick(record)) is not None]
  percent = lambda part, whole: round(100.0 * len(part) / len(whole), 1) if whole else None
  trapped = [(pick, record) for pick, record in picked if pick["trap"]]
  top = [record for pick, record in trapped if pick["top"]]
  other = [record for pick, record in trapped if not pick["top"]]
  return {"picked_top": percent([p for p, _ in picked if p["top"]], picked),
          "over_budget": percent([p for p, _ in picked if p["over_budget"]], picked),
          "trap_episodes": len(trapped), "trap_picked_other": percent(other, trapped),
          "trap_success_top": percent([r for r in top if r["success"]], top),
          "trap_success_other": percent([r for r in other if r["success"]], other)}


def query_names_values(record: dict) -> bool | None:
  """Whether the episode's first search names every option value its instruction asks for (None: the
  instruction names none, or the first action is not a search)."""
  values = requested_values(record["instruction"])
  match = _SEARCH.match((record["steps"][0].get("parsed_action") or "").strip()) if record["steps"] else None
  if not values or not match:
    return None
  query = match[1].lower()
  return all(value in query for value in values)


def query_summary(records: list[dict]) -> dict[str, float]:
  by_choice = {True: [], False: []}
  for record in records:
    named = query_names_values(record)
    if named is not None:
      by_choice[named].append(record)
  n = len(by_choice[True]) + len(by_choice[False])
  mean = lambda values: round(sum(values) / len(values), 1) if values else None
  summary = {"episodes": n, "names_values": round(100.0 * len(by_choice[True]) / n, 1) if n else None}
  for named, key in ((True, "named"), (False, "plain")):
    group = by_choice[named]
    summary[f"success_{key}"] = mean([100.0 * bool(r["success"]) for r in group])
    summary[f"score_{key}"] = mean([100.0 * r["final_reward"] for r in group])
  return summary


def shortfall(record: dict) -> str:
  """Why an episode fell short of reward 1.0: "no purchase", or the WebShop reward terms below 1."""
  info = record.get("reward_info")
  if not record["purchased"] or not info:
    return "no purchase"
  return "+".join(key[2:] for key in _SHORTFALLS if key in info and float(info[key]) < 1) or "other"


def final_evaluations(workspace: pathlib.Path) -> dict[int, dict]:
  """{task_id: record} of a workspace's final greedy evaluation (trajectories/eval_*.jsonl), {} if none."""
  return {record["task_id"]: record for record in read_records(sorted((workspace / "trajectories").glob("eval_*.jsonl")))}


def goal_outcomes(reference: dict[int, dict], runs: list[dict[int, dict]]) -> dict:
  """Per-goal fate of the reference (SFT) policy's failures and successes under `runs` (PPO policies)."""
  for run in runs:
    if set(run) != set(reference):
      raise SystemExit(f"a final evaluation covers {len(run)} goals, the SFT policy's {len(reference)}: "
                       "compare evaluations of the same test goals (eval.max_tasks)")
  fixes = {task: sum(bool(run[task]["success"]) for run in runs) for task, r in reference.items() if not r["success"]}
  never = [task for task, count in fixes.items() if count == 0]
  losses = [sum(not run[task]["success"] for run in runs) for task, r in reference.items() if r["success"]]
  counts = lambda records: dict(collections.Counter(map(shortfall, records)).most_common())
  priced = [run[task] for task in never for run in runs if "price" in shortfall(run[task])]
  trapped = lambda record: (pick := first_pick(record)) is not None and pick["trap"] and pick["top"]
  return {"runs": len(runs), "sft_failed": len(fixes), "fixed_by_every_run": sum(c == len(runs) for c in fixes.values()),
          "fixed_by_some_runs": sum(0 < c < len(runs) for c in fixes.values()), "fixed_by_no_run": len(never),
          "never_fixed_sft_shortfall": counts(reference[task] for task in never),
          "never_fixed_runs_shortfall": counts(run[task] for task in never for run in runs),
          "never_fixed_price_shortfalls": len(priced), "of_them_top_pick_over_budget": sum(map(trapped, priced)),
          "sft_solved": len(losses), "lost_by_some_run": sum(c > 0 for c in losses),
          "lost_by_every_run": sum(c == len(runs) for c in losses)}


def collect_goals(root: pathlib.Path) -> dict[str, dict]:
  """{arm: goal_outcomes} of the seed<k>_<arm> workspaces' final evaluations against upstream's ({} if the
  upstream workspace has none)."""
  reference = final_evaluations(root / "upstream")
  arms = collections.defaultdict(list)
  for workspace in sorted(root.glob("seed*_*")):
    evaluation = final_evaluations(workspace) if workspace.is_dir() else {}
    if evaluation:
      arms[arm_of(workspace, "")].append(evaluation)
  return {arm: goal_outcomes(reference, runs) for arm, runs in arms.items()} if reference else {}


def regularised_share(p0: float, gap: float, kl_coef: float) -> float:
  """The share of a binary choice at the optimum of E[R] - kl_coef * KL(pi || ref), where the reference
  takes it with probability p0 and taking it gains `gap` reward: ref tilted by exp(R / kl_coef)."""
  tilt = math.exp(gap / kl_coef)
  return p0 * tilt / (p0 * tilt + 1.0 - p0)


def run_files(workspace: pathlib.Path) -> dict[str, dict[str, list[tuple[int, pathlib.Path]]]]:
  """{mode: {"it": [(index, file)...], "eval": [...]}} of one workspace's PPO trajectory files, sorted."""
  runs = collections.defaultdict(lambda: {"it": [], "eval": []})
  for path in (workspace / "trajectories").glob("ppo_*.jsonl"):
    match = _RUN_FILE.match(path.name)
    if match:
      runs[match["mode"]][match["kind"]].append((int(match["index"]), path))
  return {mode: {kind: sorted(files) for kind, files in kinds.items()} for mode, kinds in runs.items()}


def read_records(paths: list[pathlib.Path]) -> list[dict]:
  return [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]


def arm_of(workspace: pathlib.Path, mode: str) -> str:
  """spa_bench's workspaces are seed<k>_<arm>; any other workspace is reported by its reward mode."""
  match = re.match(r"^seed\d+_(.+)$", workspace.name)
  return match[1] if match else mode


def collect(root: pathlib.Path, iterations: int) -> dict[str, dict[str, dict]]:
  """{arm: {group: summary}} pooled over every workspace under `root` (itself included)."""
  groups = collections.defaultdict(lambda: collections.defaultdict(list))
  runs = collections.Counter()
  for workspace in sorted({p.parent.parent for p in root.glob("**/trajectories/ppo_*.jsonl")}):
    for mode, files in run_files(workspace).items():
      arm = arm_of(workspace, mode)
      runs[arm] += 1
      rollouts = [path for _, path in files["it"]]
      groups[arm][f"train rollouts, first {iterations} iterations"] += rollouts[:iterations]
      groups[arm][f"train rollouts, last {iterations} iterations"] += rollouts[-iterations:]
      if files["eval"]:
        groups[arm]["greedy held-out, before PPO"] += [files["eval"][0][1]]
        groups[arm]["greedy held-out, the run's last evaluation"] += [files["eval"][-1][1]]
  if not runs:
    raise SystemExit(f"no trajectories/ppo_*.jsonl under {root}: point --root at a workspace or spa_bench's root")
  report = {}
  for arm, by_group in groups.items():
    records = {group: read_records(paths) for group, paths in by_group.items()}
    report[arm] = {"runs": runs[arm], **{group: group_summary(rs) for group, rs in records.items()},
                   "first search": {group: query_summary(rs) for group, rs in records.items()}}
  return report


def table(report: dict[str, dict], kl_coefs: tuple[float, ...] = ()) -> str:
  lines = ["| arm (runs) | episodes | success % | bought without the option % | other failures % | went back % "
           "| success after going back % | opened 2+ products % | no purchase % | repeated an action % "
           "| picked the top result % | over budget past one under it % |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for arm, groups in report.items():
    for group, s in groups.items():
      if group in ("runs", "first search"):
        continue
      cells = [s[key] for key in ("episodes", "success", "bought_without_option", "other_failures", "went_back",
                                  "success_after_back", "opened_two", "no_purchase", "repeated_action",
                                  "picked_top", "over_budget")]
      lines.append(f"| {arm} ({groups['runs']}): {group} | " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
  lines += ["", "Over-budget top listing: first picks from a page whose top listing is at or over the budget while "
            "another is under it", "", "| arm (runs) | such episodes | picked another listing % | success % when "
            "they picked the top one / another |", "|---|---|---|---|"]
  for arm, groups in report.items():
    for group, s in groups.items():
      if group not in ("runs", "first search"):
        cell = lambda key: "-" if s[key] is None else str(s[key])
        lines.append(f"| {arm} ({groups['runs']}): {group} | {s['trap_episodes']} | {cell('trap_picked_other')} | "
                     f"{cell('trap_success_top')} / {cell('trap_success_other')} |")
  lines += ["", "First search, on the goals that name option values: does the query name them all?", "",
            "| arm (runs) | episodes | query names the values % | success % with / without them "
            "| score with / without them |" + "".join(f" KL-optimum share, beta {b} % |" for b in kl_coefs),
            "|---|---|---|---|---|" + "---|" * len(kl_coefs)]
  for arm, groups in report.items():
    for group, q in groups["first search"].items():
      cell = lambda key: "-" if q[key] is None else str(q[key])
      known = None not in (q["names_values"], q["score_named"], q["score_plain"])
      optimum = [str(round(100 * regularised_share(q["names_values"] / 100, (q["score_named"] - q["score_plain"]) / 100, b), 1))
                 if known else "-" for b in kl_coefs]
      lines.append(f"| {arm} ({groups['runs']}): {group} | {q['episodes']} | {cell('names_values')} "
                   f"| {cell('success_named')} / {cell('success_plain')} | {cell('score_named')} / {cell('score_plain')} |"
                   + "".join(f" {o} |" for o in optimum))
  return "\n".join(lines)


def goals_table(goals: dict[str, dict]) -> str:
  if not goals:
    return ""
  shortfalls = lambda counts: ", ".join(f"{reason} {count}" for reason, count in counts.items()) or "-"
  lines = ["", "", "Final greedy evaluations, goal by goal, against the SFT policy's (upstream):", "",
           "| arm (runs) | goals SFT failed | fixed by every run / some / none | SFT's shortfall on the never-fixed "
           "| the runs' shortfalls there | of their price shortfalls: the top listing picked over budget "
           "| goals SFT solved | lost by some run / every run |",
           "|---|---|---|---|---|---|---|---|"]
  lines += [f"| {arm} ({g['runs']}) | {g['sft_failed']} | {g['fixed_by_every_run']} / {g['fixed_by_some_runs']} / "
            f"{g['fixed_by_no_run']} | {shortfalls(g['never_fixed_sft_shortfall'])} | "
            f"{shortfalls(g['never_fixed_runs_shortfall'])} | {g['of_them_top_pick_over_budget']} of "
            f"{g['never_fixed_price_shortfalls']} | {g['sft_solved']} | {g['lost_by_some_run']} / "
            f"{g['lost_by_every_run']} |" for arm, g in goals.items()]
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--root", required=True, type=pathlib.Path)
  parser.add_argument("--iterations", type=int, default=3, help="the first and last N iterations' rollouts")
  parser.add_argument("--title", default="", help="what the runs under --root are (for the RESULTS heading)")
  parser.add_argument("--kl-coefs", default="0.3,0.1,0.03",
                      help="comma-separated KL coefficients for the first-search table's regularised optimum")
  parser.add_argument("--no-results", action="store_true")
  args = parser.parse_args()
  report = collect(args.root, args.iterations)
  goals = collect_goals(args.root)
  kl_coefs = tuple(float(b) for b in args.kl_coefs.split(",") if b.strip())
  results_log.publish(f"failure_modes{': ' + args.title if args.title else ''}",
                      table(report, kl_coefs) + goals_table(goals), {**report, "goals": goals},
                      results=not args.no_results)


if __name__ == "__main__":
  main()
