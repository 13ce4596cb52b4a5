"""Play one WebShop episode by typing actions: ``python -m webshop.play [--data DIR] [--goal N] [--mode text|text_rich] [--search-backend pyserini|bm25]``.

Shows the observation, the available actions, whether each action was valid and
the reward. ``search[...]`` / ``click[...]`` act; ``quit`` (or end of input) exits.
"""

import argparse
import sys

from webshop.catalogue import Catalogue
from webshop.env import OBSERVATION_MODES, WebShopEnv
from webshop.search import SEARCH_BACKENDS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog='python -m webshop.play', description=__doc__.splitlines()[0])
    parser.add_argument('--data', help='directory of real WebShop files (default: the embedded synthetic catalogue)')
    parser.add_argument('--goals', choices=('synthetic', 'human'), default='synthetic', help='goal kind for --data')
    parser.add_argument('--goal', type=int, help='goal index (default: drawn by weight)')
    parser.add_argument('--mode', choices=OBSERVATION_MODES, default='text')
    parser.add_argument('--max-steps', type=int, default=None, help='step limit (default: none)')
    parser.add_argument('--search-backend', choices=SEARCH_BACKENDS, default='pyserini',
                        help='search engine: Lucene through pyserini (Java) or the identical numpy BM25')
    return parser.parse_args(argv)


def show_page(obs: str, info: dict) -> None:
    actions = info['available_actions']
    print(f'\n--- observation (step {info["step_count"]}) ---\n{obs}')
    print(f'search bar: {"yes" if actions["has_search_bar"] else "no"}; clickables: {actions["clickables"]}')


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    catalogue = (Catalogue.from_dir(args.data, args.goals, search_backend=args.search_backend) if args.data
                 else Catalogue.embedded_default(args.search_backend))
    env = WebShopEnv(catalogue, observation_mode=args.mode, max_steps=args.max_steps)
    obs, info = env.reset(args.goal)
    print(f'goal {env.goal_index}: {env.goal["instruction_text"]}')
    show_page(obs, info)
    for line in sys.stdin:
        action = line.rstrip('\n')
        if action.strip() == 'quit':
            break
        obs, reward, terminated, truncated, info = env.step(action)
        print(f'action {action!r}: valid={info["valid"]} reward={reward}')
        show_page(obs, info)
        if terminated or truncated:
            print(f'episode over: {"purchased" if terminated else "step limit"}, reward {reward}')
            if 'reward_info' in info:
                print(f'reward details: {info["reward_info"]}')
            break
    return 0


if __name__ == '__main__':
    sys.exit(main())
