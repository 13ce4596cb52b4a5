"""Reference rows for the learning tables: the scripted expert and a first-result policy on the eval goals.

The first-result policy searches with the instruction's request (`webshop.expert.instruction_request`),
opens the first listed product and buys it: what an agent that can only search and copy the top
result earns, the floor a trained policy should clear on score. The expert (privileged, goal-aware)
is the ceiling. Both run on the CPU with the same env settings as the pipeline's evaluation.
"""

import numpy as np
from webshop import ScriptedExpert, WebShopEnv
from webshop.expert import instruction_request, run_expert_episode

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


def reference_rows(catalogue, goal_indices, **env_kwargs) -> dict[str, dict[str, float]]:
  """{"expert": {...}, "first_result": {...}} with score (mean reward x 100) and success rate (% r == 1)."""
  env = WebShopEnv(catalogue, **env_kwargs)
  expert = ScriptedExpert(catalogue)
  rewards = {"expert": [run_expert_episode(env, g, expert)[-1].reward for g in goal_indices],
             "first_result": [first_result_episode(env, g) for g in goal_indices]}
  return {name: {"score": 100.0 * float(np.mean(r)), "success_rate": 100.0 * float(np.mean(np.array(r) >= 1.0))}
          for name, r in rewards.items()}
