"""Reference rows for the learning tables: the scripted expert and two visible-information policies on the eval goals.

The first-result policy searches with the instruction's request (`webshop.expert.instruction_request`),
opens the first listed product and buys it: what an agent that can only search and copy the top
result earns, the floor a trained policy should clear on score. The goes-back policy searches the
same way, opens the listed products in order and goes back from each that does not offer every value
the instruction asks for (as far as the step limit lets it still select and buy), selects the values
and buys: what reading the pages and going back earns without the expert's privilege. The expert
(privileged, goal-aware) is the ceiling. All run on the CPU with the same env settings as the
pipeline's evaluation. `python bench/reference_policies.py` appends the rows for the embedded test
goals to bench/RESULTS.md.
"""

import argparse

import numpy as np
from webshop import Catalogue, ScriptedExpert, WebShopEnv
from webshop.expert import instruction_request, option_values, run_expert_episode

import results_log

NAVIGATION = {"back to search", "next >", "< prev"}


def first_result_episode(env: WebShopEnv, goal_index: int) -> float:
  """search[request] -> click[first listed product] -> click[buy now]; the final reward (0 if no purchase)."""
  _, info = env.reset(goal_index)
  _, reward, done, truncated, info = env.step(f"search[{instruction_request(info['goal']['instruction_text'])}]")
  products = [c for c in info["available_actions"]["clickables"] if c not in NAVIGATION]
  if done or truncated or not products:
    return float(reward)
  _, reward, done, truncated, info = env.step(f"click[{products[0]}]")
  if done or truncated:
    return float(reward)
  _, reward, done, _, _ = env.step("click[buy now]")
  return float(reward) if done else 0.0


def goes_back_episode(env: WebShopEnv, goal_index: int) -> float:
  """search[request], open the listed products in order, going back from each that lacks a value the
  instruction asks for while the step limit leaves room to open another, select and buy; the final
  reward (0 if no purchase)."""
  _, info = env.reset(goal_index)
  wanted = option_values(info["goal"])
  _, reward, done, truncated, info = env.step(f"search[{instruction_request(info['goal']['instruction_text'])}]")
  products = [c for c in info["available_actions"]["clickables"] if c not in NAVIGATION]
  finish = len(wanted) + 1  # select every value, buy
  for k, product in enumerate(products):
    if done or truncated:
      return float(reward)
    _, reward, done, truncated, info = env.step(f"click[{product}]")
    clickables = info["available_actions"]["clickables"]
    room = env.max_steps is None or env.max_steps - env.step_count >= 2 + finish  # back, open the next, finish
    if done or truncated or all(v in clickables for v in wanted) or k + 1 == len(products) or not room:
      break
    _, reward, done, truncated, info = env.step("click[< prev]")
  for value in wanted:
    if done or truncated:
      return float(reward)
    if value in info["available_actions"]["clickables"]:
      _, reward, done, truncated, info = env.step(f"click[{value}]")
  if done or truncated:
    return float(reward)
  _, reward, done, _, _ = env.step("click[buy now]")
  return float(reward) if done else 0.0


def reference_rows(catalogue, goal_indices, **env_kwargs) -> dict[str, dict[str, float]]:
  """{"expert": {...}, "first_result": {...}, "goes_back": {...}} with score (mean reward x 100) and
  success rate (% r == 1)."""
  env = WebShopEnv(catalogue, **env_kwargs)
  expert = ScriptedExpert(catalogue)
  rewards = {"expert": [run_expert_episode(env, g, expert)[-1].reward for g in goal_indices],
             "first_result": [first_result_episode(env, g) for g in goal_indices],
             "goes_back": [goes_back_episode(env, g) for g in goal_indices]}
  return {name: {"score": 100.0 * float(np.mean(r)), "success_rate": 100.0 * float(np.mean(np.array(r) >= 1.0))}
          for name, r in rewards.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--split", default="test", help="embedded catalogue split (200 test goals)")
  parser.add_argument("--max-steps", type=int, default=10, help="the env's step limit (the pipeline's: 10)")
  parser.add_argument("--no-results", action="store_true")
  args = parser.parse_args()
  catalogue = Catalogue.embedded_default(search_backend="bm25")
  rows = reference_rows(catalogue, catalogue.split(args.split), max_steps=args.max_steps)
  body = "\n".join(["| policy | score | SR % |", "|---|---|---|"] + [
      f"| {name} (scripted) | {row['score']:.1f} | {row['success_rate']:.1f} |" for name, row in rows.items()])
  results_log.publish(f"reference_policies: scripted reference rows on the embedded {args.split} goals, "
                      f"{args.max_steps} steps per episode", body, rows, results=not args.no_results)


if __name__ == "__main__":
  main()
