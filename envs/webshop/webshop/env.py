"""``WebShopEnv``: the WebShop text environment with a gymnasium-style API.

Transitions follow the original ``WebAgentTextEnv`` / ``SimServer``: ``search[q]``
from any page (see ``search_from_any_page``), ``click[x]`` for x among the
current page's clickables (never ``search``), anything else a no-op with reward
0. Buy Now ends the episode with the purchase reward. Unlike the original, the
env counts steps and truncates at ``max_steps`` (the SPA-RL/ETO wrapper's rule:
reward 0 unless that step was a purchase). Stepping an ended episode raises
``RuntimeError`` (the original would still run a search from the done page).

``info`` of every step and reset:

* ``available_actions``: ``{"has_search_bar": bool, "clickables": [...]}`` of the new page;
* ``valid``: the grounding signal of the action just taken. True iff the action
  parses as ``name[arg]`` and is either ``search[...]`` on a page WITH a search
  bar whose query the search engine accepts (``webshop.search.check_query``), or
  ``click[x]`` with x in the clickables of the page it was taken on and
  x != ``search``. A search from a page without a search bar is executed when
  ``search_from_any_page`` (the original's behaviour) but is never valid. A
  query the engine refuses (``InvalidQuery``) changes nothing but the step count;
* ``step_count``, ``goal`` (the goal dict), and ``reward_info`` (the reward's
  verbose dict) on the purchase step.
"""

import random

from webshop import pages
from webshop.actions import parse_action
from webshop.pages import EpisodeState, Page
from webshop.reward import purchase_reward
from webshop.search import InvalidQuery

OBSERVATION_MODES = ('text', 'text_rich')


class WebShopEnv:
    """One WebShop episode at a time over a shared ``Catalogue``."""

    def __init__(self, catalogue, observation_mode: str = 'text', max_steps: int | None = 10,
                 search_from_any_page: bool = True):
        if observation_mode not in OBSERVATION_MODES:
            raise ValueError(f'observation_mode must be one of {OBSERVATION_MODES}, got {observation_mode!r}')
        if max_steps is not None and max_steps < 1:
            raise ValueError(f'max_steps must be >= 1 or None (no limit), got {max_steps}')
        self.catalogue = catalogue
        self.observation_mode = observation_mode
        self.max_steps = max_steps
        self.search_from_any_page = search_from_any_page
        self._rng = random.Random()
        self.goal_index: int | None = None
        self.goal: dict | None = None
        self.state: EpisodeState | None = None
        self.step_count = 0
        self.done = False

    def reset(self, goal_index: int | None = None, seed: int | None = None) -> tuple[str, dict]:
        """Start an episode on ``goals[goal_index]``, or on a goal drawn by weight (reproducible with ``seed``)."""
        if seed is not None:
            self._rng.seed(seed)
        goals = self.catalogue.goals
        if goal_index is None:
            goal_index = self._rng.choices(range(len(goals)), weights=[g['weight'] for g in goals])[0]
        if not 0 <= goal_index < len(goals):
            raise IndexError(f'goal_index {goal_index} is outside [0, {len(goals)}) for this catalogue')
        self.goal_index, self.goal = goal_index, goals[goal_index]
        self.state = EpisodeState(instruction=self.goal['instruction_text'])
        self.step_count, self.done = 0, False
        return self.observation(), self._info(valid=True)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Apply one action string; returns ``(obs, reward, terminated, truncated, info)``."""
        if self.state is None or self.done:
            raise RuntimeError('the episode has ended (or never started): call reset() first')
        self.step_count += 1
        valid, reward_info = self._apply(action)
        terminated = self.state.page == Page.DONE
        truncated = not terminated and self.max_steps is not None and self.step_count >= self.max_steps
        self.done = terminated or truncated
        reward = float(self.state.reward) if terminated else 0.0
        info = self._info(valid=valid)
        if reward_info is not None:
            info['reward_info'] = reward_info
        return self.observation(), reward, terminated, truncated, info

    def observation(self) -> str:
        return pages.render(self.state, self.catalogue, self.observation_mode)

    def available_actions(self) -> dict:
        return {'has_search_bar': self.state.page == Page.SEARCH,
                'clickables': pages.clickables(self.state, self.catalogue)}

    def _info(self, valid: bool) -> dict:
        return {'available_actions': self.available_actions(), 'valid': valid,
                'step_count': self.step_count, 'goal': self.goal, 'goal_index': self.goal_index}

    def _apply(self, action: str) -> tuple[bool, dict | None]:
        """Run the action on the state; ``(valid, reward_info or None)``."""
        name, arg = parse_action(action)
        if arg is None:
            return False, None
        if name == 'search':
            has_search_bar = self.state.page == Page.SEARCH
            searched = (has_search_bar or self.search_from_any_page) and self._search(arg.split(' '))
            return has_search_bar and searched, None
        if name == 'click' and arg != 'search' and arg in pages.clickables(self.state, self.catalogue):
            return True, self._click(arg)
        return False, None

    def _search(self, keywords: list[str], page_number: int = 1) -> bool:
        """Show the results page of a search; False (state unchanged) when the engine refuses the query."""
        try:
            results = self.catalogue.search_engine.search(' '.join(keywords))
        except InvalidQuery:
            return False
        state = self.state
        state.page, state.keywords, state.page_number = Page.RESULTS, keywords, page_number
        state.results = results
        state.asin, state.options = None, {}
        return True

    def _click(self, name: str) -> dict | None:
        """A click on a clickable of the current page, dispatched in the original's order."""
        state = self.state
        if name == 'buy now':
            return self._buy()
        if name == 'back to search':
            self.state = EpisodeState(instruction=state.instruction)
        elif name == 'next >' and state.page == Page.RESULTS:
            self._search(state.keywords, state.page_number + 1)
        elif name == '< prev' and state.page == Page.RESULTS:
            self._search(state.keywords, state.page_number - 1)
        elif name == '< prev' and state.page in pages.SUB_PAGES.values():
            state.page = Page.ITEM
        elif name == '< prev' and state.page == Page.ITEM:
            self._search(state.keywords, state.page_number)
        elif name in pages.SUB_PAGES:
            state.page = pages.SUB_PAGES[name]
        elif state.page == Page.RESULTS:
            state.asin = self._asin_of_link(name)
            state.visited.add(state.asin)
            state.page = Page.ITEM
        else:
            product = self.catalogue.by_asin[state.asin]
            state.options[pages.option_group_of(name, product)] = name
            state.page = Page.ITEM
        return None

    def _asin_of_link(self, lowered: str) -> str:
        return next(asin for asin in self.state.results_on_page() if asin.lower() == lowered)

    def _buy(self) -> dict:
        state = self.state
        purchased = self.catalogue.by_asin[state.asin]
        target = self.catalogue.by_asin[self.goal['asin']]
        reward, info = purchase_reward(purchased, self.goal, target.title_nouns, target.title_noun_count,
                                       purchased.hidden_price, state.options)
        state.page, state.reward = Page.DONE, reward
        return info
