"""The purchase reward, WebShop's ``goal.py::get_reward`` term for term.

    r = r_type * (N_att + N_opt + [price <= price_upper]) / (|attributes| + |goal_options| + 1)

Matching uses ``thefuzz.fuzz.token_set_ratio > 85``. The title term uses the
precomputed noun tokens of both catalogue titles (``Product.title_nouns``).
"""

from thefuzz import fuzz

from webshop.normalize import normalize_color

FUZZY_THRESHOLD = 85


def type_reward(purchased, goal: dict, goal_nouns: frozenset[str], goal_noun_count: int) -> dict:
    """``r_type`` with its parts: query match, category match (>= 2 shared levels) and title score."""
    query_match = purchased.query == goal['query']
    purchased_levels = {level.strip() for level in purchased.product_category.split('›')}
    goal_levels = {level.strip() for level in goal['product_category'].split('›')}
    category_match = len(purchased_levels & goal_levels) >= 2
    if goal_noun_count == 0:
        title_score = 0.2
    else:
        title_score = len(purchased.title_nouns & goal_nouns) / goal_noun_count
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return dict(r_type=r_type, query_match=query_match, category_match=category_match, title_score=title_score)


def _in_product_text(phrase: str, purchased) -> bool:
    return (phrase in purchased.title.lower()
            or phrase in ' '.join(purchased.bullet_points).lower()
            or phrase in purchased.description.lower())


def attribute_matches(purchased, goal_attributes: list[str]) -> int:
    """Goal attributes fuzzily among the product's attributes, or verbatim in its title, bullets or description."""
    matches = 0
    for goal_attribute in goal_attributes:
        if any(fuzz.token_set_ratio(p, goal_attribute) > FUZZY_THRESHOLD for p in purchased.attributes):
            matches += 1
        elif _in_product_text(goal_attribute, purchased):
            matches += 1
    return matches


def option_matches(selected_values: list, goal_options: list) -> int:
    """Goal options fuzzily matched by some selected value, both colour-normalised.

    Goal options are strings (human goals) or ``(name, value)`` tuples (synthetic
    goals pass ``dict.items()``); thefuzz compares a tuple as its ``str()``.
    """
    selected = [normalize_color(v) for v in selected_values]
    wanted = [normalize_color(g) for g in goal_options]
    return sum(any(fuzz.token_set_ratio(s, g) > FUZZY_THRESHOLD for s in selected) for g in wanted)


def purchase_reward(purchased, goal: dict, goal_nouns: frozenset[str], goal_noun_count: int,
                    price: float, selected_options: dict[str, str]) -> tuple[float, dict]:
    """``(reward, info)`` for buying ``purchased`` with ``selected_options`` (name -> value) at ``price``.

    ``goal_nouns`` / ``goal_noun_count`` are the noun tokens of the goal product's title.
    ``info`` is the original's verbose dict (``r_option``/``w_option`` only when the
    goal has options, ``r_price``/``w_price`` when ``price_upper > 0``).
    """
    type_info = type_reward(purchased, goal, goal_nouns, goal_noun_count)
    r_price = (price <= goal['price_upper']) if goal['price_upper'] > 0 else None
    goal_options = goal['goal_options']
    option_list = list(goal_options.items()) if isinstance(goal_options, dict) else list(goal_options)
    num_attributes = attribute_matches(purchased, goal['attributes'])
    num_options = option_matches(list(selected_options.values()), option_list)
    denominator = len(goal['attributes']) + len(goal_options) + 1
    reward = (num_attributes + num_options + (r_price or 0)) / denominator * type_info['r_type']
    info = {
        'r_type': type_info['r_type'],
        'r_att': num_attributes / len(goal['attributes']),
        'w_att': len(goal['attributes']) / denominator,
        'query_match': type_info['query_match'],
        'category_match': type_info['category_match'],
        'title_score': type_info['title_score'],
    }
    if option_list:
        info['r_option'] = num_options / len(option_list)
        info['w_option'] = len(goal_options) / denominator
    if r_price is not None:
        info['r_price'] = r_price
        info['w_price'] = 1 / denominator
    return reward, info
