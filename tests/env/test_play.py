"""The interactive player, driven through stdin."""

import subprocess
import sys

import pytest

from webshop.env import WebShopEnv


def play(stdin: str, *args: str) -> str:
    result = subprocess.run([sys.executable, '-W', 'ignore', '-m', 'webshop.play', *args], input=stdin,
                            capture_output=True, text=True, timeout=300, check=True)
    return result.stdout


@pytest.mark.slow
def test_play_runs_an_episode_to_a_purchase(embedded):
    env = WebShopEnv(embedded)
    env.reset(0)
    env.step('search[shoes]')
    asin = env.state.results[0]
    out = play(f'click[search]\nsearch[shoes]\nclick[{asin}]\nclick[buy now]\nsearch[never reached]\n',
               '--goal', '0', '--mode', 'text_rich')
    assert out.startswith(f'goal 0: {embedded.goals[0]["instruction_text"]}\n')
    assert 'WebShop\nInstruction: \n' in out
    assert "action 'click[search]': valid=False reward=0.0" in out
    assert "action 'search[shoes]': valid=True reward=0.0" in out
    assert 'Page 1 (Total results: ' in out and f'[button] {asin} [button_]' in out
    assert '[button] Buy Now [button_]' in out
    assert 'episode over: purchased, reward ' in out and 'reward details: ' in out
    assert 'never reached' not in out


def test_play_stops_at_the_step_limit_and_on_quit():
    out = play('search[shoes]\nnonsense\nsearch[x]\n', '--goal', '1', '--max-steps', '2', '--search-backend', 'bm25')
    assert "action 'search[shoes]': valid=True reward=0.0" in out and 'Page 1 (Total results: ' in out
    assert "action 'nonsense': valid=False reward=0.0" in out
    assert 'episode over: step limit, reward 0.0' in out and 'search[x]' not in out
    out = play('quit\nsearch[shoes]\n', '--goal', '1')
    assert 'WebShop [SEP] Instruction: [SEP] ' in out and 'action' not in out
