"""WebShop pages rendered straight from the episode state, as the original's text observations.

The original renders Jinja templates to HTML and flattens them with
BeautifulSoup. Here every page is a list of text nodes (what BeautifulSoup
would find, in document order), each tagged with its role, and the two
observation modes format that list:

* ``text``: node texts stripped, joined with ``' [SEP] '``;
* ``text_rich``: one node per line, buttons as ``[button] X [button_]``, option
  values indented and marked when selected (with ``You have clicked X.`` lines
  in front), result ASINs marked when already visited.

Quirks kept on purpose: ``Next >`` on every results page; the done page's hidden
debug block (misspelled ``instuction``); the selected options never shown in
``text`` mode; an option counts as selected in ``text_rich`` when its quoted
value occurs in the item page's URL (keywords + options JSON), so equal values
in two option groups are both marked.
"""

import enum
import json
from dataclasses import dataclass, field

PRODUCT_WINDOW = 10
SEP = ' [SEP] '
ASCII_SPACES = '\x20\x0a\x09\x0c\x0d'


class Page(enum.Enum):
    SEARCH = 'search'
    RESULTS = 'results'
    ITEM = 'item'
    DESCRIPTION = 'description'
    FEATURES = 'features'
    REVIEWS = 'reviews'
    DONE = 'done'


SUB_PAGES = {'description': Page.DESCRIPTION, 'features': Page.FEATURES, 'reviews': Page.REVIEWS}


@dataclass
class EpisodeState:
    """Everything a page shows, besides the catalogue."""

    instruction: str
    page: Page = Page.SEARCH
    keywords: list[str] | None = None       # the last search, split on single spaces
    page_number: int | None = None
    results: list[str] = field(default_factory=list)   # ranked ASINs of the last search
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)   # option name -> selected value
    visited: set[str] = field(default_factory=set)          # ASINs opened since the last Back to Search
    reward: float | None = None

    def results_on_page(self) -> list[str]:
        start = (self.page_number - 1) * PRODUCT_WINDOW
        return self.results[start:start + PRODUCT_WINDOW]


class Role(enum.Enum):
    TEXT = 'text'
    BUTTON = 'button'
    OPTION = 'option'
    PRODUCT = 'product'


def _node(text: str, role: Role = Role.TEXT) -> list[tuple[str, Role]]:
    """The node BeautifulSoup makes of ``text``: none if empty; whitespace-only collapses to '\\n' or ' '."""
    if not text:
        return []
    if not text.strip(ASCII_SPACES):
        text = '\n' if '\n' in text else ' '
    return [(text, role)]


def _header(state: EpisodeState, back_buttons: tuple[str, ...]) -> list[tuple[str, Role]]:
    nodes = _node('Instruction:') + _node(state.instruction)
    for label in back_buttons:
        nodes += _node(label, Role.BUTTON)
    return nodes


def _search_nodes(state: EpisodeState) -> list[tuple[str, Role]]:
    return _node('WebShop') + _node('Instruction: ') + _node(state.instruction) + _node('Search', Role.BUTTON)


def _results_nodes(state: EpisodeState, catalogue) -> list[tuple[str, Role]]:
    nodes = _header(state, ('Back to Search',))
    nodes += _node(f'Page {state.page_number} (Total results: {len(state.results)})')
    if state.page_number > 1:
        nodes += _node('< Prev', Role.BUTTON)
    nodes += _node('Next >', Role.BUTTON)
    for asin in state.results_on_page():
        product = catalogue.by_asin[asin]
        nodes += _node(asin, Role.PRODUCT) + _node(product.title) + _node(product.price_display)
    return nodes


def _item_nodes(state: EpisodeState, catalogue) -> list[tuple[str, Role]]:
    product = catalogue.by_asin[state.asin]
    nodes = _header(state, ('Back to Search', '< Prev'))
    for name, values in product.options.items():
        nodes += _node(name)
        for value in values:
            nodes += _node(value, Role.OPTION)
    nodes += _node(product.title) + _node(f'Price: {product.price_display}') + _node('Rating: N.A.')
    for label in ('Description', 'Features', 'Reviews', 'Buy Now'):
        nodes += _node(label, Role.BUTTON)
    return nodes


def _sub_page_nodes(state: EpisodeState, catalogue) -> list[tuple[str, Role]]:
    product = catalogue.by_asin[state.asin]
    nodes = _header(state, ('Back to Search', '< Prev'))
    if state.page == Page.DESCRIPTION:
        nodes += _node(product.description)
    elif state.page == Page.FEATURES:
        for bullet in product.bullet_points:
            nodes += _node(f' {bullet}')
    return nodes


def options_json(options: dict[str, str]) -> str:
    """Jinja's ``tojson`` as Flask configures it: sorted keys, ASCII, HTML-unsafe characters escaped."""
    text = json.dumps(options, sort_keys=True)
    return text.replace('<', '\\u003c').replace('>', '\\u003e').replace('&', '\\u0026').replace("'", '\\u0027')


def _done_nodes(state: EpisodeState) -> list[tuple[str, Role]]:
    texts = [
        'Thank you for shopping with us!', 'Your code: ', 'None', ' (Paste it in your MTurk interface.)',
        'Purchased', 'asin', state.asin, 'options', options_json(state.options),
        'attrs', 'None', 'category', 'None', 'query', 'None', 'product category', 'None',
        'Target', 'asin', 'options', 'attrs', 'price upper', 'instuction text', 'category',
        'product category', 'query', 'Goal ', 'None', 'Reward', 'Your score (min 0.0, max 1.0)',
        str(state.reward), 'Reward Details ', 'None',
    ]
    return [node for text in texts for node in _node(text)]


def page_nodes(state: EpisodeState, catalogue) -> list[tuple[str, Role]]:
    """The visible text nodes of the current page, in document order, with their roles."""
    if state.page == Page.SEARCH:
        return _search_nodes(state)
    if state.page == Page.RESULTS:
        return _results_nodes(state, catalogue)
    if state.page == Page.ITEM:
        return _item_nodes(state, catalogue)
    if state.page == Page.DONE:
        return _done_nodes(state)
    return _sub_page_nodes(state, catalogue)


def text_observation(nodes: list[tuple[str, Role]]) -> str:
    """``text`` mode: stripped node texts joined by ``' [SEP] '``."""
    return SEP.join(text.strip() for text, _ in nodes if text != '\n')


def item_url_tail(state: EpisodeState) -> str:
    """The part of the original item-page URL that can contain a quote: keywords and the options JSON."""
    return '+'.join(state.keywords or ()) + '/' + json.dumps(state.options)


def rich_observation(nodes: list[tuple[str, Role]], state: EpisodeState) -> str:
    """``text_rich`` mode: one node per line with button / clicked-button markers."""
    url_tail = item_url_tail(state) if state.page == Page.ITEM else ''
    clicked_lines, lines = [], []
    for text, role in nodes:
        if text == '\n':
            continue
        if role == Role.BUTTON:
            lines.append(f'[button] {text} [button_]')
        elif role == Role.OPTION and f'"{text}"' in url_tail:
            lines.append(f'  [clicked button] {text} [clicked button_]')
            clicked_lines.insert(0, f'You have clicked {text}.')
        elif role == Role.OPTION:
            lines.append(f'  [button] {text} [button_]')
        elif role == Role.PRODUCT and text in state.visited:
            lines.append(f'\n[clicked button] {text} [clicked button_]')
        elif role == Role.PRODUCT:
            lines.append(f'\n[button] {text} [button_]')
        else:
            lines.append(text)
    return ''.join(line + '\n' for line in clicked_lines + lines)


def render(state: EpisodeState, catalogue, mode: str) -> str:
    """The observation string of the current page in ``mode`` (``"text"`` or ``"text_rich"``)."""
    nodes = page_nodes(state, catalogue)
    return text_observation(nodes) if mode == 'text' else rich_observation(nodes, state)


def clickables(state: EpisodeState, catalogue) -> list[str]:
    """The lowercased clickable names of the current page, in the original's order (buttons, links, option values)."""
    if state.page == Page.SEARCH:
        return ['search']
    if state.page == Page.DONE:
        return []
    names = ['back to search']
    if state.page == Page.RESULTS:
        if state.page_number > 1:
            names.append('< prev')
        names.append('next >')
        names += [asin.lower() for asin in state.results_on_page()]
    else:
        names.append('< prev')
    if state.page == Page.ITEM:
        names += ['description', 'features', 'reviews', 'buy now']
        names += [value for values in catalogue.by_asin[state.asin].options.values() for value in values]
    return list(dict.fromkeys(names))


def option_group_of(value: str, product) -> str | None:
    """The option name a clicked value sets: the last group listing it (later radios win, as in the original)."""
    group = None
    for name, values in product.options.items():
        if value in values:
            group = name
    return group
