"""The purchase reward, branch by branch, on hand-built products and goals."""

import dataclasses

import pytest
from thefuzz import fuzz

from webshop.catalogue import Product
from webshop.normalize import normalize_color
from webshop.reward import attribute_matches, option_matches, purchase_reward, type_reward

BASE = Product(
    asin='B000000001', title='Canvas Running Shoes', description='Comfortable shoes with memory foam.',
    bullet_points=('Rubber sole', 'Machine wash'), price_display='$19.99', price_range=(19.99,),
    hidden_price=19.99, options={'color': ['black', 'navy blue'], 'size': ['8', '8.5']},
    attributes=('lace up', 'tea tree'), category='fashion', query='running shoes',
    product_category='Clothing › Men › Shoes', main_image='', title_nouns=frozenset({'canvas', 'shoes'}),
    title_noun_count=2,
)


def product(**changes) -> Product:
    return dataclasses.replace(BASE, **changes)


def goal(**changes) -> dict:
    base = {'asin': 'B000000001', 'query': 'running shoes', 'product_category': 'Clothing › Men › Shoes',
            'attributes': ['lace up'], 'goal_options': {'color': 'black', 'size': '8'}, 'price_upper': 30.0}
    return base | changes


def test_type_reward_all_matching_is_one():
    info = type_reward(BASE, goal(), frozenset({'canvas', 'shoes'}), 2)
    assert info == {'r_type': 1.0, 'query_match': True, 'category_match': True, 'title_score': 1.0}


def test_category_match_needs_two_shared_levels_in_any_order():
    def matched(category):
        return type_reward(product(product_category=category), goal(), BASE.title_nouns, 2)['category_match']
    assert matched('Shoes › Clothing › Other')
    assert matched('Clothing › Clothing › Shoes')
    assert not matched('Clothing › Clothing › Hats')
    assert not matched('X › Y › Z')


def test_type_reward_is_half_without_query_category_or_title_match():
    unrelated = product(query='hats', product_category='X › Y › Z', title_nouns=frozenset({'shoes', 'x', 'y'}))
    info = type_reward(unrelated, goal(), frozenset({'shoes', 'a', 'b', 'c', 'd'}), 5)
    assert info['title_score'] == pytest.approx(0.2)
    assert info['r_type'] == 0.5


def test_title_score_above_point_two_alone_gives_one():
    unrelated = product(query='hats', product_category='X › Y › Z')
    info = type_reward(unrelated, goal(), frozenset({'shoes', 'boots'}), 2)
    assert info['title_score'] == 0.5 and info['r_type'] == 1.0


def test_low_title_score_gives_point_one_even_with_query_match():
    nouns = frozenset({'shoes'} | {f'w{i}' for i in range(10)})
    info = type_reward(BASE, goal(), nouns, 11)
    assert info['title_score'] == pytest.approx(1 / 11)
    assert info['r_type'] == 0.1


def test_no_shared_noun_gives_zero_even_with_query_match():
    info = type_reward(BASE, goal(), frozenset({'hat'}), 1)
    assert info['title_score'] == 0.0 and info['r_type'] == 0.0


def test_goal_title_without_nouns_scores_point_two():
    info = type_reward(BASE, goal(), frozenset(), 0)
    assert info['title_score'] == 0.2 and info['r_type'] == 1.0


def test_title_score_divides_by_noun_count_with_repeats():
    info = type_reward(BASE, goal(), frozenset({'shoes', 'pack'}), 4)   # e.g. "Shoes Pack Shoes Pack"
    assert info['title_score'] == 0.25


def test_attribute_fuzzy_match_and_text_fallbacks():
    assert fuzz.token_set_ratio('tea tree', 'tea tree oil') == 100
    assert attribute_matches(BASE, ['tea tree oil']) == 1               # subset token sets score 100
    assert attribute_matches(BASE, ['running']) == 1                    # substring of the title
    assert attribute_matches(BASE, ['rubber sole']) == 1                # substring of the bullets
    assert attribute_matches(BASE, ['memory foam']) == 1                # substring of the description
    assert attribute_matches(BASE, ['gluten free', 'waterproof']) == 0
    assert attribute_matches(product(title='RUNNING'), ['running']) == 1   # title lowercased, goal not


def test_thefuzz_scores_behind_the_option_quirk():
    assert fuzz.token_set_ratio('8', ('size', '8')) == 100
    assert fuzz.token_set_ratio('8', ('size', '8.5')) == 100
    assert fuzz.token_set_ratio('8.5', ('size', '8')) == 50
    assert fuzz.token_set_ratio('large', ('size', 'x-large')) == 100
    assert fuzz.token_set_ratio('x-large', ('size', 'large')) == 83
    assert fuzz.token_set_ratio(normalize_color('light blue'), normalize_color(('color', 'navy blue'))) == 100


def test_normalize_color_on_strings_and_tuples():
    assert normalize_color('light blue') == 'blue'        # first COLOR_SET entry contained
    assert normalize_color('xl') == 'xl'
    assert normalize_color(('color', 'navy')) == 'navy'   # tuple: exact element only
    assert normalize_color(('color', 'navy blue')) == ('color', 'navy blue')


def test_option_matches_for_synthetic_tuples_and_human_strings():
    assert option_matches(['8'], [('size', '8.5')]) == 1            # lenient: subset token set
    assert option_matches(['8.5'], [('size', '8')]) == 0
    assert option_matches(['x-large'], [('size', 'large')]) == 0
    assert option_matches(['light blue'], [('color', 'navy blue')]) == 1
    assert option_matches(['grey', 'xl'], ['grey', 'XL', 'pack of 12']) == 2
    assert option_matches(['powder snow'], ['cool powder snow']) == 1
    assert option_matches([], ['grey']) == 0


def test_reference_example_gives_three_quarters():
    reward, info = purchase_reward(BASE, goal(), BASE.title_nouns, 2, price=19.99,
                                   selected_options={'color': 'black', 'size': '9'})
    assert reward == 0.75
    assert info == {'r_type': 1.0, 'r_att': 1.0, 'w_att': 0.25, 'query_match': True, 'category_match': True,
                    'title_score': 1.0, 'r_option': 0.5, 'w_option': 0.5, 'r_price': True, 'w_price': 0.25}


def test_price_above_cap_and_type_scale():
    reward, info = purchase_reward(BASE, goal(price_upper=10.0), BASE.title_nouns, 2, price=19.99,
                                   selected_options={'color': 'black', 'size': '8'})
    assert info['r_price'] is False and reward == 0.75
    half_type = product(query='hats', product_category='X › Y › Z', title_nouns=frozenset({'canvas'}))
    reward, info = purchase_reward(half_type, goal(), frozenset({'canvas', 'a', 'b', 'c', 'd'}), 5, price=1.0,
                                   selected_options={'color': 'black', 'size': '8'})
    assert info['r_type'] == 0.5 and reward == 0.5


def test_goal_without_options_has_no_option_terms():
    reward, info = purchase_reward(BASE, goal(goal_options=[]), BASE.title_nouns, 2, price=5.0, selected_options={})
    assert reward == 1.0
    assert 'r_option' not in info and 'w_option' not in info and info['w_att'] == 0.5
