"""The interactive player, driven through stdin."""

import subprocess
import sys

import pytest


def play(stdin: str, *args: str) -> str:
    result = subprocess.run([sys.executable, '-W', 'ignore', '-m', 'webshop.play', *args], input=stdin,
                            capture_output=True, text=True, timeout=300, check=True)
    return result.stdout


@pytest.mark.slow
def test_play_runs_an_episode_to_a_purchase():
    out = play('click[search]\nsearch[shoes]\n', '--goal', '0', '--max-steps', '3')
    assert out.startswith('goal 0: ')
    assert 'WebShop [SEP] Instruction: [SEP] ' in out
    assert "action 'click[search]': valid=False reward=0.0" in out
    assert "action 'search[shoes]': valid=True reward=0.0" in out
    assert 'Page 1 (Total results: ' in out

    first_page = out.split('clickables: ')[-1]
    asin = first_page.split("'")[5]                       # ['back to search', 'next >', '<asin>', ...]
    out = play(f'search[shoes]\nclick[{asin}]\nclick[buy now]\nsearch[never reached]\n', '--goal', '0',
               '--mode', 'text_rich')
    assert '[button] Buy Now [button_]' in out
    assert 'episode over: purchased, reward ' in out and 'reward details: ' in out
    assert 'never reached' not in out


def test_play_quits_on_quit():
    out = play('quit\nsearch[shoes]\n', '--goal', '1')
    assert 'Search' in out and 'action' not in out
