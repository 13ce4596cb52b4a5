"""Goals (instructions with targets) and goal-index splits, as WebShop's ``engine/goal.py`` builds them.

Goal dicts keep the original keys: ``asin, category, query, name, product_category,
instruction_text, attributes, price_upper, goal_options, weight``. Human goals carry
``goal_options`` as a list of value strings, synthetic goals as a dict name -> value
(the reward treats the two differently, as the original does).

Departure: ``price_upper`` is drawn from a seeded RNG per ASIN (per ASIN and
instruction for human goals) instead of the unseeded global ``random``; see
``catalogue.py``. The goal ORDER is the original's: ``random.seed(233);
random.shuffle(goals)``, so goal index i names the same instruction as in the
original when the product files are the same.
"""

import itertools
import json
import random
from collections import Counter
from pathlib import Path

PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))
NO_PRICE_LIMIT = 1000000
GOAL_SHUFFLE_SEED = 233
EMBEDDED_TEST_GOALS = 200
EMBEDDED_GOALS_PER_TEST_PRODUCT = 2


def price_upper_and_text(price: float, rng: random.Random) -> tuple[float, str]:
    """The goal's price cap and its instruction suffix: two of the next four multiples of 10 above ``price``, the larger."""
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return NO_PRICE_LIMIT, ''
    _, upper = sorted(rng.sample(candidates, 2))
    return upper, f', and price lower than {upper:.2f} dollars'


def _price_rng(price_seed: int, asin: str, entry: int | None = None) -> random.Random:
    key = f'{price_seed}:{asin}:price_upper' if entry is None else f'{price_seed}:{asin}:price_upper:{entry}'
    return random.Random(key)


def _base_goal(product) -> dict:
    return {
        'asin': product.asin,
        'category': product.category,
        'query': product.query,
        'name': product.title,
        'product_category': product.product_category,
    }


def human_goals(products, human_instructions: dict, price_seed: int) -> list[dict]:
    """One goal per human instruction with non-empty ``instruction_attributes`` (file order, then list order)."""
    goals = []
    for product in products:
        for entry_index, entry in enumerate(human_instructions.get(product.asin, ())):
            attributes = entry['instruction_attributes']
            if not attributes:
                continue
            upper, price_text = price_upper_and_text(product.hidden_price, _price_rng(price_seed, product.asin, entry_index))
            goals.append(_base_goal(product) | {
                'instruction_text': entry['instruction'].strip('.') + price_text,
                'attributes': list(attributes),
                'price_upper': upper,
                'goal_options': list(entry['instruction_options']),
                'weight': 1,
            })
    return goals


def synthetic_goals(products, instructions: dict, price_seed: int) -> list[dict]:
    """One goal per combination of option values (names sorted) of every product with an ins_v2 instruction.

    Weight = mean over the goal's attributes of 1 / (number of goals listing that attribute).
    """
    goals = []
    for product in products:
        entry = instructions.get(product.asin) or {}
        instruction = entry.get('instruction')
        if instruction is None:
            continue
        attributes = entry.get('instruction_attributes') or []
        if not attributes:
            raise ValueError(f'product {product.asin} has an instruction but no instruction_attributes in the '
                             'items_ins_v2 file; every instructed product needs at least one')
        upper, price_text = price_upper_and_text(product.hidden_price, _price_rng(price_seed, product.asin))
        names = sorted(product.options)
        for values in itertools.product(*(product.options[name] for name in names)):
            goal_options = dict(zip(names, values))
            option_text = ', and '.join(f'{k}: {v}' for k, v in goal_options.items())
            option_text = f' with {option_text}' if option_text else ''
            goals.append(_base_goal(product) | {
                'instruction_text': f'{instruction}{option_text}{price_text}',
                'attributes': list(attributes),
                'price_upper': upper,
                'goal_options': goal_options,
            })
    counts = Counter(att for goal in goals for att in goal['attributes'])
    for goal in goals:
        goal['weight'] = sum(1.0 / counts[att] for att in goal['attributes']) / len(goal['attributes'])
    return goals


def shuffle_goals(goals: list[dict]) -> list[dict]:
    """The original's order: the same permutation as ``random.seed(233); random.shuffle(goals)``."""
    shuffled = list(goals)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(shuffled)
    return shuffled


def paper_split(name: str, num_goals: int) -> list[int]:
    """The WebShop paper's i.i.d. split by goal index (``baseline_models/env.py``), clipped to ``num_goals``."""
    bounds = {'paper_test': (0, 500), 'paper_dev': (500, 1500), 'paper_train': (1500, num_goals)}
    start, stop = bounds[name]
    return list(range(min(start, num_goals), min(stop, num_goals)))


def embedded_split(name: str, goals: list[dict]) -> list[int]:
    """Product-disjoint train/test for the embedded catalogue.

    Test products are drawn by ``random.Random(0)`` from the sorted goal ASINs (not
    in goal order, which favours products with many option combinations); each
    gives its first two goals (in goal order) until 200 test goals are taken.
    Train is every goal of every other product.
    """
    goals_of: dict[str, list[int]] = {}
    for index, goal in enumerate(goals):
        goals_of.setdefault(goal['asin'], []).append(index)
    test, test_asins = [], set()
    for asin in random.Random(0).sample(sorted(goals_of), len(goals_of)):
        if len(test) >= EMBEDDED_TEST_GOALS:
            break
        test_asins.add(asin)
        test.extend(goals_of[asin][:min(EMBEDDED_GOALS_PER_TEST_PRODUCT, EMBEDDED_TEST_GOALS - len(test))])
    if name == 'test':
        return sorted(test)
    return [i for i, goal in enumerate(goals) if goal['asin'] not in test_asins]


def file_split(path: str, num_goals: int) -> list[int]:
    """Goal indices from a JSON list file (e.g. ETO/SPA-RL's ``test_indices.json``, which we do not ship)."""
    try:
        indices = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f'split file {path} does not exist; pass split="file:/path/to/indices.json" '
                                'with a JSON list of goal indices') from None
    if not isinstance(indices, list) or not all(isinstance(i, int) for i in indices):
        raise ValueError(f'split file {path} must hold a JSON list of integer goal indices')
    bad = [i for i in indices if not 0 <= i < num_goals]
    if bad:
        raise ValueError(f'split file {path} names goal indices outside [0, {num_goals}): {bad[:5]}; '
                         'was it made for another catalogue or goal kind (human vs synthetic)?')
    return indices
