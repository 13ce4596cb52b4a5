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
approximation: goals differ in p0 and g, and later steps are held fixed). Appends a section to bench/RESULTS.md (unless --no-results) and ends with
ONE JSON line on stdout.
"""

import argparse
import collections
import json
import math
import pathlib
import re

import results_log
from webshop.expert import requested_values

_PRODUCT_CLICK = re.compile(r"^click\[b0[0-9a-z]{8}\]$", re.IGNORECASE)
_CLICK = re.compile(r"^click\[(.*)\]$", re.IGNORECASE)
_BACK = ("< prev", "back to search")
_SEARCH = re.compile(r"^search\[(.*)\]$", re.IGNORECASE)
_RUN_FILE = re.compile(r"^ppo_(?P<mode>.+)_(?P<kind>it|eval)(?P<index>\d+)\.p\d+\.jsonl$")


def _clicked(action: str) -> str:
  """What a click action names, lower-cased ("" for other actions)."""
  match = _CLICK.match(action.strip())
  return match[1].strip().lower() if match else ""


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
          "repeated_action": share(sum(f["repeated_action"] for f in flags), n)}


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
           "| success after going back % | opened 2+ products % | no purchase % | repeated an action % |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for arm, groups in report.items():
    for group, s in groups.items():
      if group in ("runs", "first search"):
        continue
      cells = [s[key] for key in ("episodes", "success", "bought_without_option", "other_failures", "went_back",
                                  "success_after_back", "opened_two", "no_purchase", "repeated_action")]
      lines.append(f"| {arm} ({groups['runs']}): {group} | " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
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
  kl_coefs = tuple(float(b) for b in args.kl_coefs.split(",") if b.strip())
  results_log.publish(f"failure_modes{': ' + args.title if args.title else ''}", table(report, kl_coefs), report,
                      results=not args.no_results)


if __name__ == "__main__":
  main()
