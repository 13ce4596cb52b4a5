"""WebShopEnv transitions, validity (grounding), termination and truncation, with the real search engine."""

import pytest

from webshop.env import WebShopEnv


def goal_index_of(catalogue, asin, options):
    return next(i for i, g in enumerate(catalogue.goals) if g['asin'] == asin and g['goal_options'] == options)


@pytest.fixture
def env(tiny_catalogue):
    env = WebShopEnv(tiny_catalogue, observation_mode='text_rich', max_steps=None)
    env.reset(goal_index_of(tiny_catalogue, 'B0TEST0000', {'color': 'navy blue', 'size': '8'}))
    return env


def step_ok(env, action):
    obs, reward, terminated, truncated, info = env.step(action)
    assert info['valid'], action
    return obs, reward, terminated, truncated, info


def test_reset_shows_the_search_page(tiny_catalogue):
    env = WebShopEnv(tiny_catalogue)
    obs, info = env.reset(0)
    assert obs == f'WebShop [SEP] Instruction: [SEP] {tiny_catalogue.goals[0]["instruction_text"]} [SEP] Search'
    assert info['available_actions'] == {'has_search_bar': True, 'clickables': ['search']}
    assert info['valid'] and info['step_count'] == 0 and info['goal'] is tiny_catalogue.goals[0] is env.goal


def test_search_click_options_subpages_and_purchase(env, tiny_catalogue):
    obs, reward, terminated, truncated, info = step_ok(env, 'search[canvas running shoes]')
    assert obs.startswith('Instruction:\n') and 'Page 1 (Total results: ' in obs
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert 'b0test0000' in info['available_actions']['clickables']
    assert info['available_actions']['has_search_bar'] is False

    obs, *_ = step_ok(env, 'click[B0TEST0000]')            # the argument is lowercased
    assert 'Canvas Running Shoes\nPrice: $19.99' in obs
    obs, *_ = step_ok(env, 'click[navy blue]')
    obs, *_ = step_ok(env, 'click[8]')
    assert obs.startswith('You have clicked 8.\nYou have clicked navy blue.\n')
    obs, *_ = step_ok(env, 'click[features]')
    assert obs.endswith(' Rubber sole\n Lace up\n Machine wash\n')
    obs, *_ = step_ok(env, 'click[< prev]')                 # back to the item page, options kept
    assert obs.startswith('You have clicked 8.\nYou have clicked navy blue.\n')

    obs, reward, terminated, truncated, info = step_ok(env, 'click[buy now]')
    assert terminated and not truncated and reward == 1.0
    assert info['reward_info']['r_option'] == 1.0 and info['reward_info']['r_type'] == 1.0
    assert '[SEP]' not in obs and 'navy blue' in obs and info['available_actions']['clickables'] == []
    with pytest.raises(RuntimeError, match='reset'):
        env.step('search[again]')


def test_wrong_options_lower_the_reward(env):
    step_ok(env, 'search[canvas running shoes]')
    step_ok(env, 'click[b0test0000]')
    step_ok(env, 'click[black | white]')
    step_ok(env, 'click[8]')
    _, reward, terminated, _, info = step_ok(env, 'click[buy now]')
    assert terminated and info['reward_info']['r_option'] == 0.5 and reward == pytest.approx(0.75)


def test_item_prev_returns_to_results_and_clears_options(env):
    step_ok(env, 'search[shoes]')
    first = env.state.results[0]
    step_ok(env, f'click[{first.lower()}]')
    if env.catalogue.by_asin[first].options:
        step_ok(env, f'click[{next(iter(env.catalogue.by_asin[first].options.values()))[0]}]')
    obs, *_ = step_ok(env, 'click[< prev]')
    assert env.state.options == {} and env.state.asin is None
    assert f'\n[clicked button] {first} [clicked button_]\n' in obs       # visited ASIN marked


def test_paging_and_back_to_search(env):
    step_ok(env, 'search[shoes]')
    total = len(env.state.results)
    obs, *_ = step_ok(env, 'click[next >]')
    assert f'Page 2 (Total results: {total})' in obs and '[button] < Prev [button_]' in obs
    obs, *_ = step_ok(env, 'click[< prev]')
    assert 'Page 1' in obs and '< Prev' not in obs
    step_ok(env, f'click[{env.state.results[0].lower()}]')
    obs, _, _, _, info = step_ok(env, 'click[back to search]')
    assert obs.startswith('WebShop\nInstruction: \n') and env.state.visited == set()
    assert info['available_actions']['has_search_bar'] is True


@pytest.mark.parametrize('action', ['click[search]', 'Click[search]', ' search[shoes]', 'search shoes', 'search[]',
                                    'click[buy now]', 'jump[x]', ''])
def test_invalid_actions_are_no_ops(env, action):
    before = env.observation()
    obs, reward, terminated, truncated, info = env.step(action)
    assert (obs, reward, terminated, truncated, info['valid']) == (before, 0.0, False, False, False)
    assert info['step_count'] == 1


def test_search_from_a_page_without_search_bar_runs_but_is_not_valid(tiny_catalogue, env):
    step_ok(env, 'search[shoes]')
    obs, _, _, _, info = env.step('search[leather walking]')
    assert not info['valid'] and env.state.keywords == ['leather', 'walking'] and 'Page 1' in obs

    strict = WebShopEnv(tiny_catalogue, search_from_any_page=False)
    strict.reset(0)
    strict.step('search[shoes]')
    before = strict.observation()
    obs, _, _, _, info = strict.step('search[leather walking]')
    assert not info['valid'] and obs == before


def test_step_limit_truncates_without_reward_unless_purchase(tiny_catalogue):
    env = WebShopEnv(tiny_catalogue, max_steps=3)
    env.reset(0)
    results = [env.step('nonsense') for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True] and all(r[1] == 0.0 for r in results)
    with pytest.raises(RuntimeError):
        env.step('search[shoes]')
    env.reset(0)
    env.step('search[canvas running shoes]')
    env.step('click[b0test0000]')
    _, reward, terminated, truncated, _ = env.step('click[buy now]')
    assert terminated and not truncated and reward > 0


def test_reset_draws_goals_reproducibly_by_seed(embedded):
    env = WebShopEnv(embedded)
    draws = [env.reset(seed=s)[1]['goal_index'] for s in (1, 2, 1)]
    assert draws[0] == draws[2]
    assert len({env.reset()[1]['goal_index'] for _ in range(20)}) > 1


def test_constructor_and_reset_reject_bad_arguments(tiny_catalogue):
    with pytest.raises(ValueError, match='observation_mode'):
        WebShopEnv(tiny_catalogue, observation_mode='html')
    with pytest.raises(ValueError, match='max_steps'):
        WebShopEnv(tiny_catalogue, max_steps=0)
    with pytest.raises(IndexError, match='outside'):
        WebShopEnv(tiny_catalogue).reset(len(tiny_catalogue.goals))


def test_embedded_episode_reaches_a_purchase(embedded):
    env = WebShopEnv(embedded)
    goal_index = embedded.split('test')[0]
    obs, info = env.reset(goal_index)
    product = embedded.by_asin[env.goal['asin']]
    obs, *_ = step_ok(env, f'search[{product.title}]')
    assert product.asin.lower() in env.available_actions()['clickables']
    step_ok(env, f'click[{product.asin}]')
    for value in env.goal['goal_options'].values():
        step_ok(env, f'click[{value}]')
    _, reward, terminated, _, info = step_ok(env, 'click[buy now]')
    assert terminated and info['reward_info']['r_att'] == 1.0 and info['reward_info']['r_option'] == 1.0
    assert reward == pytest.approx(1.0)
