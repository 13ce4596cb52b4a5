"""bench/reference_policies.py's scripted rows: the goes-back policy reads the item page and goes back."""

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))
import reference_policies  # noqa: E402
from webshop import Catalogue, WebShopEnv  # noqa: E402


class RecordingEnv(WebShopEnv):
  """The env, keeping every action it was sent."""

  def reset(self, *args, **kwargs):
    self.actions = []
    return super().reset(*args, **kwargs)

  def step(self, action):
    self.actions.append(action)
    return super().step(action)


@pytest.fixture(scope="module")
def test_goals():
  catalogue = Catalogue.embedded_default(search_backend="bm25")
  return catalogue, catalogue.split("test")[:60]


def test_goes_back_from_products_without_a_requested_value_within_the_step_limit(test_goals):
  catalogue, goals = test_goals
  env = RecordingEnv(catalogue, max_steps=10)
  went_back, rewards = 0, []
  for goal in goals:
    rewards.append(reference_policies.goes_back_episode(env, goal))
    assert len(env.actions) <= 10 and env.actions[-1] == "click[buy now]"  # it always buys, in time
    backs = [i for i, a in enumerate(env.actions) if a == "click[< prev]"]
    went_back += bool(backs)
    for i in backs:  # only from a product page, and the next action opens another product
      assert env.actions[i - 1].startswith("click[b0") and env.actions[i + 1].startswith("click[b0")
      assert env.actions[i + 1] != env.actions[i - 1]
  assert went_back >= 5
  first = [reference_policies.first_result_episode(env, g) for g in goals]
  assert np.mean(np.array(rewards) >= 1.0) > np.mean(np.array(first) >= 1.0) + 0.2  # reading the page pays


def test_a_longer_step_limit_lets_it_try_more_products(test_goals):
  catalogue, goals = test_goals
  success = {steps: np.mean([reference_policies.goes_back_episode(WebShopEnv(catalogue, max_steps=steps), g) >= 1.0
                             for g in goals]) for steps in (10, 20)}
  assert success[20] > success[10]
