"""`ScriptedExpert`: a goal-aware WebShop policy that writes ReAct turns, for SFT demonstrations.

The expert knows the goal (privileged) but acts, where it can, in ways a model could learn from the
visible text: it searches with words from the instruction, opens the first listed product that would
earn as much as the target, selects the option values the instruction names, and buys. Its thoughts
are short, and it writes every clickable exactly as the page shows it (`click[B0N34TJUTR]`,
`click[Buy Now]`; the env lowercases arguments), so that a small model learns to copy from the page
rather than to re-case what it reads. Privilege is used to score the listed products (the env's
purchase reward with the goal's options), to pick WHICH instruction-derived query lists a product
as good as the target first (falling back to the target's title when none lists one on the first
page), and to tell apart near misses whose titles look alike. Near-duplicate listings are common, so
"open the first good result" (88% of the train demonstrations open the top result) is a rule a small
model can learn where "open the one hidden target" (54%) is not.

With `recovery_rate` > 0, that share of the episodes (drawn per goal) also shows a way out of the
mistake the "open the first result" rule leads to: where the plain instruction query lists first a
product that does not offer a value the instruction asks for, and a product as good as the target on
the same page, the expert searches with that query, opens the first result, says which value the page
does not offer, goes back (`click[< Prev]`) and opens the good one. Without such demonstrations a policy
cloned from the expert never goes back (bench/RESULTS.md, failure_modes, 2026-12-07), so RL cannot
reinforce going back either.

Each turn is two lines, `Thought: ...` and `Action: ...`. `run_expert_episode` plays one goal and
returns its steps.
"""

import random
import re
from typing import NamedTuple

from webshop.pages import PRODUCT_WINDOW
from webshop.reward import purchase_reward

_OPENERS = re.compile(r"^(i am looking for|i'm looking for|im looking for|i am searching for|i would like|i need|"
                      r"i want|find me|get me|can you find me|show me|looking for)\s+(an?\s+|some\s+)?")
_OPTIONS_TEXT = re.compile(r" with [a-z ]+: .*?(?=, and price lower than|$)")
_PRICE_TEXT = re.compile(r",? and price lower than ([\d.]+) dollars")
_NAVIGATION = {"back to search", "next >", "< prev", "description", "features", "reviews", "buy now", "attributes"}
_WORD = re.compile(r"[a-z0-9]+")
_BRACKETS = re.compile(r"[\[\]]")  # would break the action's name[arg] syntax


class ExpertStep(NamedTuple):
    """One turn of an expert episode: what the agent saw, what it said, and what the env returned."""
    observation: str
    response: str        # "Thought: ...\nAction: ..."
    reward: float
    done: bool
    info: dict


class ScriptedExpert:
    """`act(obs, info) -> "Thought: ...\\nAction: ..."` for the goal in `info["goal"]`.

    One instance per concurrent episode: it remembers the options it already selected (text pages do not
    show them) and forgets at every reset (`info["step_count"] == 0`). `recovery_rate`: the share of
    episodes that demonstrate going back from a product without a requested value (module docstring),
    drawn from (`seed`, the instruction), so a goal's demonstration does not depend on the order of play.
    """

    def __init__(self, catalogue, recovery_rate: float = 0.0, seed: int = 0):
        if not 0.0 <= recovery_rate <= 1.0:
            raise ValueError(f"recovery_rate={recovery_rate}: must be in [0, 1] (the share of episodes that go back)")
        self.catalogue = catalogue
        self.recovery_rate, self.seed = recovery_rate, seed
        self._asin_by_lower = {asin.lower(): asin for asin in catalogue.by_asin}
        self._selected: set[str] = set()
        self._searches = 0
        self._detour: str | None = None  # this episode's query that lists a product without a value first

    def act(self, obs: str, info: dict) -> str:
        goal = info["goal"]
        if info.get("step_count", 0) == 0:
            self._selected, self._searches = set(), 0
            drawn = random.Random(f"{self.seed}:{goal['instruction_text']}").random() < self.recovery_rate
            self._detour = self._detour_query(goal) if drawn else None
        available = info["available_actions"]
        clickables = available["clickables"]
        if available["has_search_bar"]:
            return self._search(goal)
        if "buy now" in clickables:
            return self._on_item(goal, obs, clickables)
        if "next >" in clickables:
            return self._on_results(goal, obs, clickables)
        if "< prev" in clickables:
            return _turn("This page has no options or buy button; I'll go back.", _click(obs, "< prev"))
        raise ValueError("the episode is over (no clickables); reset the env before asking the expert to act")

    def _search(self, goal: dict) -> str:
        """The n-th search of the episode uses the n-th query of `_ranked_queries` (a detour episode's
        first search: its detour query)."""
        self._searches += 1
        if self._detour is not None and self._searches == 1:
            return _turn(f"I need {self._detour}; I'll search for it.", f"search[{self._detour}]")
        queries = self._ranked_queries(goal)
        query, reason = queries[min(self._searches, len(queries)) - 1]
        return _turn(f"I {reason}; I'll search for it.", f"search[{_BRACKETS.sub(' ', query).strip()}]")

    def _ranked_queries(self, goal: dict) -> list[tuple[str, str]]:
        """Instruction-derived queries, then the target's title. In front: the first
        instruction-derived query whose top result is as good as the target (a demonstration that
        clicks the top result is the easiest to learn), else the first query that lists one on the
        first page."""
        request = instruction_request(goal["instruction_text"])
        option_words = " ".join(option_values(goal))
        title = self.catalogue.by_asin[goal["asin"]].title
        queries = [
            (request, f"need {request}"),
            (f"{request} {option_words}".strip(), f"need {request}, {option_words}".rstrip(", ")),
            (f"{goal['query']} {' '.join(goal['attributes'])}", f"need {goal['query']} that is {', '.join(goal['attributes'])}"),
            (title.lower(), f"am looking for a product like \"{title}\""),
        ]
        search = self.catalogue.search_engine.search

        def rank(query: tuple[str, str]) -> int:
            page = search(query[0])[:PRODUCT_WINDOW]
            good = self._first_as_good_as_target(goal, page)
            return PRODUCT_WINDOW if good is None else page.index(good)

        ranks = [rank(q) for q in queries]
        top = next((i for i in range(len(queries) - 1) if ranks[i] == 0), None)
        best = top if top is not None else next((i for i, r in enumerate(ranks) if r < PRODUCT_WINDOW), None)
        if best is None:
            return queries
        return [queries[best]] + [q for i, q in enumerate(queries) if i != best]

    def _detour_query(self, goal: dict) -> str | None:
        """The plain instruction query, when its first result lacks a value the instruction asks for
        and a product as good as the target is listed on the same page (else None: no detour)."""
        query = _BRACKETS.sub(" ", instruction_request(goal["instruction_text"])).strip()
        page = self.catalogue.search_engine.search(query)[:PRODUCT_WINDOW]
        if not page or self._missing_value(goal, page[0]) is None:
            return None
        good = self._first_as_good_as_target(goal, page)
        return query if good is not None and good != page[0] else None

    def _missing_value(self, goal: dict, asin: str) -> str | None:
        """The first value the instruction asks for that product `asin` does not offer (None: it offers all)."""
        offered = {value for values in self.catalogue.by_asin[asin].options.values() for value in values}
        return next((value for value in option_values(goal) if value not in offered), None)

    def _on_results(self, goal: dict, obs: str, clickables: list[str]) -> str:
        listed = [self._asin_by_lower[c] for c in clickables if c not in _NAVIGATION and c in self._asin_by_lower]
        if self._detour is not None and listed:  # opens the first result, as a policy would
            return self._click_product(goal, listed[0], "matches")
        good = self._first_as_good_as_target(goal, listed)
        if good is not None:
            return self._click_product(goal, good, "matches")
        if self._searches < 2:
            return _turn("None of these results fits; I'll search with other words.", _click(obs, "back to search"))
        if not listed:
            return _turn("There are no results here; I'll search again.", _click(obs, "back to search"))
        best = max(listed, key=lambda asin: _overlap(goal["instruction_text"], self.catalogue.by_asin[asin].title))
        return self._click_product(goal, best, "is the closest match to")

    def _first_as_good_as_target(self, goal: dict, asins: list[str]) -> str | None:
        """The first of `asins` whose purchase earns at least the target's reward (None: none does)."""
        target_value = self._purchase_value(goal, goal["asin"])
        return next((asin for asin in asins
                     if asin == goal["asin"] or self._purchase_value(goal, asin) >= target_value), None)

    def _purchase_value(self, goal: dict, asin: str) -> float:
        """The reward of buying `asin` with the goal's option values it offers (as `_on_item` selects them)."""
        product, target = self.catalogue.by_asin[asin], self.catalogue.by_asin[goal["asin"]]
        wanted = set(option_values(goal))
        selected = {name: value for name, values in product.options.items()
                    for value in values if value.lower() in wanted}
        reward, _ = purchase_reward(product, goal, target.title_nouns, target.title_noun_count,
                                    product.hidden_price, selected)
        return reward

    def _click_product(self, goal: dict, asin: str, relation: str) -> str:
        return _turn(f"{asin} {relation} the {goal['query']} I need; I'll open it.", f"click[{asin}]")

    def _on_item(self, goal: dict, obs: str, clickables: list[str]) -> str:
        if self._detour is not None:
            self._detour = None  # back on the results page, the expert chooses as it always does
            missing = next((value for value in option_values(goal) if value not in clickables), None)
            if missing is not None:
                return _turn(f"This product does not offer {missing}, which the instruction asks for; I'll go back.",
                             _click(obs, "< prev"))
        for value in option_values(goal):
            if value in clickables and value not in self._selected:
                self._selected.add(value)
                shown = _shown(obs, value)
                return _turn(f"The instruction asks for {shown}; I'll select it.", f"click[{shown}]")
        price = _PRICE_TEXT.search(goal["instruction_text"])
        price_note = f" and costs less than {price.group(1)} dollars" if price else ""
        return _turn(f"This product fits the instruction{price_note}; I'll buy it.", _click(obs, "buy now"))


def instruction_request(instruction_text: str) -> str:
    """What the instruction asks for, without the opener, the option list and the price clause."""
    text = _PRICE_TEXT.sub("", instruction_text.lower().strip())
    text = _OPTIONS_TEXT.sub("", text)
    return _OPENERS.sub("", text).strip(" ,.")


def requested_values(instruction_text: str) -> list[str]:
    """The option values an instruction asks for, lower-cased ("... with color: white, and size: 9, and
    price ..." -> ["white", "9"]; [] when it names none)."""
    match = _OPTIONS_TEXT.search(instruction_text.lower().strip())
    if not match:
        return []
    pairs = match[0].removeprefix(" with ").split(", and ")
    return [pair.split(": ", 1)[1].strip() for pair in pairs if ": " in pair]


def requested_price_limit(instruction_text: str) -> float | None:
    """The price an instruction asks to stay under ("..., and price lower than 50.00 dollars" -> 50.0;
    None when it names none)."""
    match = _PRICE_TEXT.search(instruction_text.lower())
    return float(match[1]) if match else None


def action_of(response: str) -> str:
    """The action line of a `Thought: ...\\nAction: ...` turn."""
    return response.rsplit("Action: ", 1)[-1].strip()


def run_expert_episode(env, goal_index: int, expert: ScriptedExpert | None = None) -> list[ExpertStep]:
    """Play goal `goal_index` with the expert until the episode ends; one `ExpertStep` per turn."""
    expert = expert or ScriptedExpert(env.catalogue)
    obs, info = env.reset(goal_index)
    steps = []
    while True:
        response = expert.act(obs, info)
        next_obs, reward, terminated, truncated, next_info = env.step(action_of(response))
        steps.append(ExpertStep(obs, response, reward, terminated or truncated, next_info))
        if terminated or truncated:
            return steps
        obs, info = next_obs, next_info


def option_values(goal: dict) -> list[str]:
    """The goal's option values (its `goal_options`), lower-cased: what a purchase must select."""
    options = goal.get("goal_options") or {}
    values = options.values() if isinstance(options, dict) else options
    return [v.lower() for v in values]


def _overlap(instruction: str, title: str) -> int:
    return len(set(_WORD.findall(instruction.lower())) & set(_WORD.findall(title.lower())))


def _shown(obs: str, clickable: str) -> str:
    """`clickable` (lowercased, as in `available_actions`) as the page `obs` writes it."""
    return next((part for part in obs.split(" [SEP] ") if part.strip().lower() == clickable), clickable).strip()


def _click(obs: str, clickable: str) -> str:
    return f"click[{_shown(obs, clickable)}]"


def _turn(thought: str, action: str) -> str:
    return f"Thought: {thought}\nAction: {action}"
