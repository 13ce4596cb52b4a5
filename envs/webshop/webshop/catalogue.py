"""A WebShop catalogue: products, goals, splits and the (lazy) search engine.

Products are built from WebShop's raw files with the rules of the original
``load_products`` (``web_agent_site/engine/engine.py``): skip ASINs that are
``'nan'``, longer than 10 characters or repeated; ``num_products`` keeps the first
N raw entries; prices parsed from the ``pricing`` string (at most two, shown as
``$lo`` or ``$lo to $hi``, ``$100.0`` when missing); option names lowercased,
values stripped, ``/`` -> `` | ``, lowercased; ``Attributes`` from ins_v2, or
``['DUMMY_ATTR']`` when the ASIN has no entry.

Departures from the original, on purpose:

* **Seeded prices.** The hidden price of a product with a price range is
  ``random.Random(f"{price_seed}:{asin}").uniform(lo, hi)`` and every goal's
  ``price_upper`` comes from a per-ASIN seeded RNG too (``goals.py``). The
  original draws both from the unseeded global ``random``, so they differ
  between processes; ours are identical in every process for a given seed.
* **Title nouns precomputed** once per product (``nouns.py``); the tagger used is
  recorded as ``Catalogue.noun_tagger``. The synthetic catalogue gives its titles'
  nouns (known by construction), so its rewards do not depend on a tagger.
* Pricing strings the original would crash on (a ``$`` with no digits) lose the
  bad pieces; no parsable price counts as missing. Products without images get
  ``main_image = ''``. A product without an ins_v2 entry has no instruction
  (the original raises KeyError there).
"""

import copy
import functools
import importlib.metadata
import json
import os
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from webshop import goals as goals_lib
from webshop.errors import DataFileError
from webshop.nouns import GivenNouns, NounTagger
from webshop.search import check_backend

MISSING_PRICE = 100.0
DUMMY_ATTRIBUTE = 'DUMMY_ATTR'
GOAL_KINDS = ('synthetic', 'human')
EMBEDDED_NUM_PRODUCTS = 1200
EMBEDDED_SEED = 0


@dataclass(frozen=True)
class Product:
    """One product as the environment shows and scores it."""

    asin: str
    title: str
    description: str
    bullet_points: tuple[str, ...]
    price_display: str               # "$19.99" or "$25.99 to $39.99"
    price_range: tuple[float, ...]   # 1 or 2 prices
    hidden_price: float              # the price the reward checks (seeded draw within a range)
    options: dict[str, list[str]]    # option name -> values, in page order
    attributes: tuple[str, ...]
    category: str
    query: str
    product_category: str            # "A › B › C"
    main_image: str
    title_nouns: frozenset[str]      # lowercased NOUN/PROPN tokens of the title
    title_noun_count: int            # number of such tokens with repeats (the reward divides by it)


def parse_pricing(pricing) -> tuple[tuple[float, ...], str]:
    """``(prices, display)`` from a raw ``pricing`` string such as ``"$25.99$39.99"``."""
    prices = []
    for piece in (pricing or '').split('$')[1:]:
        digits = re.sub(r'[^\d.]', '', piece)
        try:
            prices.append(float(Decimal(digits)))
        except ArithmeticError:
            continue
    if not prices:
        return (MISSING_PRICE,), f'${MISSING_PRICE}'
    if len(prices) == 1:
        return (prices[0],), f'${prices[0]}'
    return (prices[0], prices[1]), f'${prices[0]} to ${prices[1]}'


def parse_options(customization_options) -> dict[str, list[str]]:
    """Option name -> normalised values from a raw ``customization_options`` dict (or null / '')."""
    options = {}
    for name, contents in (customization_options or {}).items():
        if contents is None:
            continue
        options[name.lower()] = [c['value'].strip().replace('/', ' | ').lower() for c in contents]
    return options


def hidden_price(price_range: tuple[float, ...], asin: str, price_seed: int) -> float:
    """The single price, or a seeded uniform draw within a two-price range."""
    if len(price_range) == 1:
        return price_range[0]
    return random.Random(f'{price_seed}:{asin}').uniform(*price_range)


def _selected_raw_items(raw_items: list[dict], num_products: int | None) -> list[dict]:
    seen, kept = set(), []
    for item in raw_items if num_products is None else raw_items[:num_products]:
        asin = item['asin']
        if asin == 'nan' or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        kept.append(item)
    return kept


def build_products(raw_items: list[dict], instructions: dict, *, num_products: int | None = None,
                   price_seed: int = 0, tagger: NounTagger | GivenNouns) -> list[Product]:
    """Products from raw items (``items_shuffle`` schema) and the ins_v2 attributes dict."""
    items = _selected_raw_items(raw_items, num_products)
    nouns = tagger.tag([item['name'] for item in items])
    products = []
    for item, title_nouns in zip(items, nouns):
        asin = item['asin']
        price_range, price_display = parse_pricing(item.get('pricing'))
        bullets = item['small_description']
        entry = instructions.get(asin, {})
        products.append(Product(
            asin=asin,
            title=item['name'],
            description=item['full_description'] or '',
            bullet_points=tuple(bullets if isinstance(bullets, list) else [bullets]),
            price_display=price_display,
            price_range=price_range,
            hidden_price=hidden_price(price_range, asin, price_seed),
            options=parse_options(item.get('customization_options')),
            attributes=tuple(entry['attributes']) if 'attributes' in entry else (DUMMY_ATTRIBUTE,),
            category=item['category'],
            query=item['query'].lower().strip(),
            product_category=item['product_category'],
            main_image=(item.get('images') or [''])[0],
            title_nouns=title_nouns.tokens,
            title_noun_count=title_nouns.count,
        ))
    return products


def default_cache_dir() -> Path:
    """``$WEBSHOP_CACHE_DIR``, else ``~/.cache/spa-webshop``."""
    return Path(os.environ.get('WEBSHOP_CACHE_DIR', Path.home() / '.cache' / 'spa-webshop'))


class Catalogue:
    """Products, goals (in the original's shuffled order), named goal-index splits and a lazy search engine.

    ``search_backend`` picks the engine (``webshop.search.SEARCH_BACKENDS``: ``"pyserini"``, Lucene in Java,
    or ``"bm25"``, the same ranking in numpy); pickles leave the engine out (it is rebuilt on first use).
    """

    def __init__(self, products: list[Product], goals: list[dict], *, goal_kind: str, noun_tagger: str,
                 split_scheme: str, price_seed: int, cache_dir: Path | None = None,
                 search_backend: str = 'pyserini'):
        self.products = products
        self.by_asin = {p.asin: p for p in products}
        self.goals = goals
        self.goal_kind = goal_kind
        self.noun_tagger = noun_tagger
        self.split_scheme = split_scheme   # "embedded" (train/test) or "paper" (paper_* splits)
        self.price_seed = price_seed
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.search_backend = check_backend(search_backend)

    def __getstate__(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != 'search_engine'}

    @classmethod
    def from_raw(cls, raw: dict, goals: str = 'synthetic', *, num_products: int | None = None,
                 price_seed: int = 0, split_scheme: str = 'paper', cache_dir: Path | None = None,
                 search_backend: str = 'pyserini') -> 'Catalogue':
        """Build from the raw file contents ``{"items", "attributes", "human"}``.

        With a ``"title_nouns"`` entry (``{title: [nouns]}``, as the synthetic generator gives), titles are
        not tagged; otherwise the best installed tagger tags them (``nouns.py``).
        """
        if goals not in GOAL_KINDS:
            raise ValueError(f'goals must be one of {GOAL_KINDS}, got {goals!r}')
        tagger = GivenNouns(raw['title_nouns']) if 'title_nouns' in raw else NounTagger()
        products = build_products(raw['items'], raw['attributes'], num_products=num_products,
                                  price_seed=price_seed, tagger=tagger)
        if goals == 'human':
            goal_list = goals_lib.human_goals(products, raw['human'], price_seed)
        else:
            goal_list = goals_lib.synthetic_goals(products, raw['attributes'], price_seed)
        return cls(products, goals_lib.shuffle_goals(goal_list), goal_kind=goals, noun_tagger=tagger.name,
                   split_scheme=split_scheme, price_seed=price_seed, cache_dir=cache_dir, search_backend=search_backend)

    @classmethod
    def from_dir(cls, path, goals: str = 'synthetic', *, num_products: int | None = None,
                 price_seed: int = 0, cache_dir: Path | None = None, search_backend: str = 'pyserini') -> 'Catalogue':
        """Build from a directory of real WebShop files.

        Reads ``items_shuffle*.json`` and the ``items_ins_v2*.json`` with the same
        suffix (e.g. ``_1000``), plus ``items_human_ins.json`` for human goals.
        """
        raw = read_raw_dir(Path(path), need_human=goals == 'human')
        return cls.from_raw(raw, goals, num_products=num_products, price_seed=price_seed,
                            split_scheme='paper', cache_dir=cache_dir, search_backend=search_backend)

    @classmethod
    def embedded_default(cls, search_backend: str = 'pyserini') -> 'Catalogue':
        """The deterministic synthetic catalogue (built once per process and backend), synthetic goals, train/test splits."""
        return _embedded_default(check_backend(search_backend))

    def with_search_backend(self, search_backend: str) -> 'Catalogue':
        """A catalogue sharing these products and goals that searches with ``search_backend``."""
        other = copy.copy(self)   # through __getstate__: without this catalogue's search engine
        other.search_backend = check_backend(search_backend)
        return other

    def settings(self) -> dict:
        """What an evaluation record should carry to say which environment produced it."""
        return {
            'goal_kind': self.goal_kind,
            'num_products': len(self.products),
            'num_goals': len(self.goals),
            'split_scheme': self.split_scheme,
            'price_seed': self.price_seed,
            'noun_tagger': self.noun_tagger,
            'search_backend': self.search_backend,
            'thefuzz': importlib.metadata.version('thefuzz'),
        }

    @functools.cached_property
    def search_engine(self):
        from webshop.search import SearchEngine
        return SearchEngine(self.products, self.cache_dir / 'search', backend=self.search_backend)

    def split(self, name: str) -> list[int]:
        """Goal indices of a named split.

        ``"all"``; embedded catalogues: ``"train"`` / ``"test"`` (product-disjoint,
        200 test goals); real catalogues: ``"paper_test"`` (0-499), ``"paper_dev"``
        (500-1499), ``"paper_train"`` (1500-). ``"file:/path.json"``: a JSON list of
        indices, e.g. ETO/SPA-RL's ``test_indices.json`` (not shipped here). Any of them
        followed by a Python slice, ``"train[:1000]"``, ``"train[1000:]"``, ``"train[::2]"``,
        is that part of the split (disjoint parts of one split for different stages).
        """
        base, part = parse_split(name)
        if part is not None:
            return self.split(base)[part]
        if name == 'all':
            return list(range(len(self.goals)))
        if name.startswith('file:'):
            return goals_lib.file_split(name.removeprefix('file:'), len(self.goals))
        names = ('train', 'test') if self.split_scheme == 'embedded' else ('paper_train', 'paper_dev', 'paper_test')
        if name not in names:
            raise ValueError(f'unknown split {name!r} for this {self.split_scheme} catalogue; '
                             f'use one of {names + ("all", "file:/path/to/indices.json")}')
        if self.split_scheme == 'embedded':
            return goals_lib.embedded_split(name, self.goals)
        return goals_lib.paper_split(name, len(self.goals))


_SLICED_SPLIT = re.compile(r'(.+)\[(-?\d*(?::-?\d*){1,2})\]')


def parse_split(name: str) -> tuple[str, slice | None]:
    """A split name and the slice that follows it, if any: ``"train[:1000]"`` -> (``"train"``,
    ``slice(None, 1000)``); ``"train"`` -> (``"train"``, None)."""
    sliced = _SLICED_SPLIT.fullmatch(name)
    if not sliced:
        return name, None
    parts = [int(x) if x else None for x in sliced.group(2).split(':')]
    if parts[2:] == [0]:
        raise ValueError(f'split {name!r}: the part in brackets must be a slice start:stop[:step] '
                         'with a non-zero step, e.g. "train[:1000]" or "train[1::2]"')
    return sliced.group(1), slice(*parts)


@functools.cache
def _embedded_default(search_backend: str) -> Catalogue:
    if search_backend != 'pyserini':   # products and goals are built once, whatever the backends
        return _embedded_default('pyserini').with_search_backend(search_backend)
    from webshop.synthetic import generate_raw
    raw = generate_raw(num_products=EMBEDDED_NUM_PRODUCTS, seed=EMBEDDED_SEED)
    return Catalogue.from_raw(raw, 'synthetic', split_scheme='embedded')


def _find_one(directory: Path, pattern: str, fix: str) -> Path:
    matches = sorted(directory.glob(pattern))
    if not matches:
        raise FileNotFoundError(f'no {pattern} in {directory}: {fix}')
    if len(matches) > 1:
        raise ValueError(f'several {pattern} in {directory} ({", ".join(m.name for m in matches)}); '
                         'keep one catalogue per directory')
    return matches[0]


def raw_data_files(directory: Path, need_human: bool) -> dict[str, Path]:
    """The files of a WebShop data directory a catalogue reads: ``{"items", "attributes"[, "human"]}``."""
    fix = ('download the WebShop data (setup.sh -d small gives items_shuffle_1000.json and '
           'items_ins_v2_1000.json) into this directory')
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f'WebShop data directory {directory} does not exist: {fix}')
    items_path = _find_one(directory, 'items_shuffle*.json', fix)
    suffix = items_path.stem.removeprefix('items_shuffle')
    attributes_path = directory / f'items_ins_v2{suffix}.json'
    if not attributes_path.exists():
        raise FileNotFoundError(f'{attributes_path} is missing (it pairs with {items_path.name}): {fix}')
    files = {'items': items_path, 'attributes': attributes_path}
    if need_human:
        files['human'] = directory / 'items_human_ins.json'
        if not files['human'].exists():
            raise FileNotFoundError(f'{files["human"]} is missing; it is needed for goals="human" '
                                    '(or use goals="synthetic")')
    return files


def _read_json(path: Path, expected_type: type):
    """A data file's JSON value; a truncated or wrong file raises one error naming it and the fix."""
    try:
        value = json.loads(path.read_text())
    except ValueError as error:
        raise DataFileError(f'{path} is not valid JSON ({error}); the file is truncated or damaged: '
                            'download it again') from None
    if not isinstance(value, expected_type):
        raise DataFileError(f'{path} holds a JSON {type(value).__name__}, expected a {expected_type.__name__}: '
                            'is it the right WebShop file?')
    return value


def read_raw_dir(directory: Path, need_human: bool) -> dict:
    """The raw file contents of a WebShop data directory, as ``{"items", "attributes", "human"}``."""
    files = raw_data_files(directory, need_human)
    return {
        'items': _read_json(files['items'], list),
        'attributes': _read_json(files['attributes'], dict),
        'human': _read_json(files['human'], dict) if need_human else {},
    }
