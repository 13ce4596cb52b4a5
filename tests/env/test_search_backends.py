"""Search backends: "bm25" (numpy) and "pyserini" (Lucene in Java) give the same env; bad names are refused."""

import pickle
import random
from types import SimpleNamespace

import pytest

from webshop.catalogue import Catalogue
from webshop.english_analyzer import analyze
from webshop.env import WebShopEnv
from webshop.expert import ScriptedExpert, action_of
from webshop.pool import CatalogueSpec
from webshop.search import MAX_QUERY_TERMS, InvalidQuery, SearchEngine

NUM_EXPERT_GOALS = 25
NUM_RANDOM_EPISODES = 30


@pytest.fixture(scope='module')
def catalogues(embedded) -> dict[str, Catalogue]:
    return {'pyserini': embedded, 'bm25': Catalogue.embedded_default('bm25')}


def _lockstep(envs: dict, goal_index: int, choose_action) -> int:
    """Play one episode in every env with the actions `choose_action(obs, info)` picks from the pyserini env's
    view, asserting identical resets and steps; returns the number of steps."""
    first = {name: env.reset(goal_index) for name, env in envs.items()}
    assert first['bm25'] == first['pyserini']
    obs, info = first['pyserini']
    for step in range(1, 100):
        action = choose_action(obs, info)
        results = {name: env.step(action) for name, env in envs.items()}
        assert results['bm25'] == results['pyserini'], (goal_index, action)
        obs, _, terminated, truncated, info = results['pyserini']
        if terminated or truncated:
            return step
    raise AssertionError('an episode did not end within 99 steps')


def _random_action(rng: random.Random, catalogue: Catalogue):
    """Mostly clicks on the page's clickables, and searches for instruction or title words, debug prefixes
    (except the random `<r>`) and nonsense."""
    def choose(obs: str, info: dict) -> str:
        kind = rng.random()
        if kind < 0.3:
            words = (info['goal']['instruction_text'] + ' ' + rng.choice(catalogue.products).title).split()
            return f'search[{" ".join(rng.sample(words, rng.randint(1, min(5, len(words)))))}]'
        if kind < 0.35:
            product = rng.choice(catalogue.products)
            return rng.choice([f'search[<c> {product.category}]', f'search[<q> {product.query}]', 'click[nowhere]'])
        return f'click[{rng.choice(info["available_actions"]["clickables"])}]'
    return choose


def test_embedded_env_is_identical_with_both_backends(catalogues):
    """Expert episodes then random ones, several hundred steps, step by step equal (observations, rewards, info)."""
    envs = {name: WebShopEnv(c, observation_mode='text_rich', max_steps=15) for name, c in catalogues.items()}
    expert = ScriptedExpert(catalogues['pyserini'])
    goals = catalogues['pyserini'].split('test')[:NUM_EXPERT_GOALS]
    expert_steps = sum(_lockstep(envs, g, lambda obs, info: action_of(expert.act(obs, info))) for g in goals)
    rng = random.Random(0)
    choose = _random_action(rng, catalogues['pyserini'])
    random_steps = sum(_lockstep(envs, rng.randrange(len(catalogues['pyserini'].goals)), choose)
                       for _ in range(NUM_RANDOM_EPISODES))
    assert expert_steps >= 100 and random_steps >= 200


def test_bm25_engine_shares_the_debug_prefixes_and_needs_no_index_files(catalogues, tmp_path):
    products = catalogues['pyserini'].products
    pyserini = catalogues['pyserini'].search_engine
    bm25 = SearchEngine(products, tmp_path / 'unused', backend='bm25')
    assert bm25.index_dir is None and not (tmp_path / 'unused').exists()
    for query in ['<c> ' + products[0].category, '<q> ' + products[3].query, 'red cotton shirt', 'the of']:
        assert bm25.search(query) == pyserini.search(query), query
    reseeded = SearchEngine(products, tmp_path, backend='bm25')
    assert reseeded.search('<r>') == SearchEngine(products, tmp_path, backend='bm25').search('<r>')
    assert bm25.search('red cotton shirt') is not bm25.search('red cotton shirt')   # cached, yet a fresh list


def _distinct_words(count: int, catalogue: Catalogue) -> list[str]:
    """`count` words, catalogue title words first (the numpy backend would rank them), each its own analyzed term."""
    candidates = [w for p in catalogue.products for w in p.title.lower().split()] + [f'zq{i}x' for i in range(count)]
    words, terms = [], set()
    for word in candidates:
        analyzed = analyze(word)
        if len(analyzed) == 1 and analyzed[0] not in terms:
            words.append(word)
            terms.add(analyzed[0])
    assert len(words) >= count
    return words[:count]


@pytest.mark.parametrize('backend', ['pyserini', 'bm25'])
def test_queries_no_backend_can_run_are_invalid_no_ops_that_leave_the_episode_intact(catalogues, backend):
    """2,000 distinct terms (Lucene's clause limit is 1,024) or a lone surrogate: info["valid"] is False,
    the page is unchanged, and the episode goes on (the next click works)."""
    catalogue = catalogues[backend]
    env = WebShopEnv(catalogue, max_steps=10)
    env.reset(0)
    results_page, *_ = env.step('search[red shirt]')
    clickable = env.available_actions()['clickables'][-1]
    for query in [' '.join(_distinct_words(2000, catalogue)), 'red shirt \ud800']:
        with pytest.raises(InvalidQuery):
            catalogue.search_engine.search(query)
        obs, reward, terminated, truncated, info = env.step(f'search[{query}]')
        assert (obs, reward, terminated, truncated, info['valid']) == (results_page, 0.0, False, False, False)
    obs, _, _, _, info = env.step(f'click[{clickable}]')
    assert info['valid'] and obs != results_page
    longest = ' '.join(_distinct_words(MAX_QUERY_TERMS, catalogue))   # the limit itself still searches
    assert catalogue.search_engine.search(longest) == catalogues['pyserini'].search_engine.search(longest)


def test_catalogue_records_its_backend_and_pickles_without_its_engine(catalogues):
    bm25 = catalogues['bm25']
    assert bm25.settings()['search_backend'] == 'bm25'
    assert catalogues['pyserini'].settings()['search_backend'] == 'pyserini'
    assert bm25.products is catalogues['pyserini'].products    # built once for both backends
    _ = bm25.search_engine
    loaded = pickle.loads(pickle.dumps(bm25))
    assert 'search_engine' not in vars(loaded) and 'search_engine' in vars(bm25)
    assert loaded.search_backend == 'bm25' and loaded.search_engine.backend == 'bm25'
    assert loaded.goals == bm25.goals and loaded.split('test') == bm25.split('test')


def test_unknown_backend_is_refused_naming_the_choices(tmp_path):
    product = SimpleNamespace(asin='B01', title='Cap', description='', bullet_points=(), options={},
                              category='fashion', query='cap')
    choices = r"unknown search backend 'lucene'; use one of \('pyserini', 'bm25'\)"
    with pytest.raises(ValueError, match=choices):
        SearchEngine([product], tmp_path, backend='lucene')
    with pytest.raises(ValueError, match=choices):
        Catalogue.embedded_default('lucene')
    with pytest.raises(ValueError, match=choices):
        CatalogueSpec('embedded', search_backend='lucene')
    with pytest.raises(ValueError, match=choices):
        Catalogue.embedded_default().with_search_backend('lucene')
    assert not any(tmp_path.iterdir())
