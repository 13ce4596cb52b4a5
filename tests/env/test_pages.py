"""Observation strings and clickables of every page type, pinned to the original's output."""

import dataclasses
from types import SimpleNamespace

from webshop.pages import EpisodeState, Page, clickables, options_json, render

INS = 'find me canvas running shoes'
RESULTS = [f'B0TEST{i:04d}' for i in range(25)]
ITEM_TEXT = ('Instruction: [SEP] find me canvas running shoes [SEP] Back to Search [SEP] < Prev [SEP] color [SEP] '
             'black | white [SEP] navy blue [SEP] size [SEP] 8 [SEP] 9.5 wide [SEP] Canvas Running Shoes [SEP] '
             'Price: $19.99 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now')
DONE_TEXT = ('Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in your MTurk interface.) '
             '[SEP] Purchased [SEP] asin [SEP] B0TEST0000 [SEP] options [SEP] {"color": "black | white", "size": "8"} '
             '[SEP] attrs [SEP] None [SEP] category [SEP] None [SEP] query [SEP] None [SEP] product category [SEP] '
             'None [SEP] Target [SEP] asin [SEP] options [SEP] attrs [SEP] price upper [SEP] instuction text [SEP] '
             'category [SEP] product category [SEP] query [SEP] Goal [SEP] None [SEP] Reward [SEP] '
             'Your score (min 0.0, max 1.0) [SEP] 0.75 [SEP] Reward Details [SEP] None')


def state(page=Page.SEARCH, page_number=1, asin=None, options=None, visited=(), reward=None, instruction=INS):
    return EpisodeState(instruction, page, ['canvas', 'shoes'], page_number, list(RESULTS), asin,
                        dict(options or {}), set(visited), reward)


def test_search_page(tiny_catalogue):
    s = state()
    assert render(s, tiny_catalogue, 'text') == 'WebShop [SEP] Instruction: [SEP] find me canvas running shoes [SEP] Search'
    assert render(s, tiny_catalogue, 'text_rich') == (
        'WebShop\nInstruction: \nfind me canvas running shoes\n[button] Search [button_]\n')
    assert clickables(s, tiny_catalogue) == ['search']


def test_results_page_one_has_next_but_no_prev(tiny_catalogue):
    s = state(Page.RESULTS)
    text = render(s, tiny_catalogue, 'text')
    assert text.startswith('Instruction: [SEP] find me canvas running shoes [SEP] Back to Search [SEP] '
                           'Page 1 (Total results: 25) [SEP] Next > [SEP] B0TEST0000 [SEP] Canvas Running Shoes '
                           '[SEP] $19.99 [SEP] B0TEST0001 [SEP] Leather Walking Shoes [SEP] $25.99 to $39.99 [SEP] '
                           'B0TEST0002 [SEP] Test Product 2 Shoes [SEP] $19.99 [SEP] ')
    assert text.endswith('[SEP] B0TEST0009 [SEP] Test Product 9 Shoes [SEP] $19.99')
    assert text.count(' [SEP] ') == 5 + 3 * 10 - 1
    assert render(s, tiny_catalogue, 'text_rich').startswith(
        'Instruction:\nfind me canvas running shoes\n[button] Back to Search [button_]\nPage 1 (Total results: 25)\n'
        '[button] Next > [button_]\n\n[button] B0TEST0000 [button_]\nCanvas Running Shoes\n$19.99\n\n'
        '[button] B0TEST0001 [button_]\nLeather Walking Shoes\n$25.99 to $39.99\n\n[button] B0TEST0002 [button_]\n')
    assert clickables(s, tiny_catalogue) == ['back to search', 'next >'] + [f'b0test{i:04d}' for i in range(10)]


def test_results_page_two_has_prev_and_marks_visited(tiny_catalogue):
    s = state(Page.RESULTS, page_number=2, visited={'B0TEST0010'})
    assert render(s, tiny_catalogue, 'text').startswith(
        'Instruction: [SEP] find me canvas running shoes [SEP] Back to Search [SEP] Page 2 (Total results: 25) '
        '[SEP] < Prev [SEP] Next > [SEP] B0TEST0010 [SEP] Test Product 10 Shoes [SEP] $19.99 [SEP] B0TEST0011')
    assert render(s, tiny_catalogue, 'text_rich').startswith(
        'Instruction:\nfind me canvas running shoes\n[button] Back to Search [button_]\nPage 2 (Total results: 25)\n'
        '[button] < Prev [button_]\n[button] Next > [button_]\n\n[clicked button] B0TEST0010 [clicked button_]\n'
        'Test Product 10 Shoes\n$19.99\n\n[button] B0TEST0011 [button_]\n')
    assert clickables(s, tiny_catalogue)[:3] == ['back to search', '< prev', 'next >']


def test_results_page_past_the_end_still_offers_next(tiny_catalogue):
    s = state(Page.RESULTS, page_number=4)
    assert render(s, tiny_catalogue, 'text') == (
        'Instruction: [SEP] find me canvas running shoes [SEP] Back to Search [SEP] Page 4 (Total results: 25) '
        '[SEP] < Prev [SEP] Next >')
    assert clickables(s, tiny_catalogue) == ['back to search', '< prev', 'next >']


def test_item_page_text_never_shows_selected_options(tiny_catalogue):
    for options in ({}, {'color': 'black | white', 'size': '8'}):
        assert render(state(Page.ITEM, asin='B0TEST0000', options=options), tiny_catalogue, 'text') == ITEM_TEXT
    assert clickables(state(Page.ITEM, asin='B0TEST0000'), tiny_catalogue) == [
        'back to search', '< prev', 'description', 'features', 'reviews', 'buy now',
        'black | white', 'navy blue', '8', '9.5 wide']


def test_item_page_rich_marks_selected_options_most_recent_first(tiny_catalogue):
    s = state(Page.ITEM, asin='B0TEST0000', options={'color': 'black | white', 'size': '8'})
    assert render(s, tiny_catalogue, 'text_rich') == (
        'You have clicked 8.\nYou have clicked black | white.\nInstruction:\nfind me canvas running shoes\n'
        '[button] Back to Search [button_]\n[button] < Prev [button_]\ncolor\n'
        '  [clicked button] black | white [clicked button_]\n  [button] navy blue [button_]\nsize\n'
        '  [clicked button] 8 [clicked button_]\n  [button] 9.5 wide [button_]\nCanvas Running Shoes\n'
        'Price: $19.99\nRating: N.A.\n[button] Description [button_]\n[button] Features [button_]\n'
        '[button] Reviews [button_]\n[button] Buy Now [button_]\n')


def test_sub_pages(tiny_catalogue):
    header = 'Instruction: [SEP] find me canvas running shoes [SEP] Back to Search [SEP] < Prev'
    pages = {
        Page.DESCRIPTION: header + ' [SEP] Comfortable canvas shoes.',
        Page.FEATURES: header + ' [SEP] Rubber sole [SEP] Lace up [SEP] Machine wash',
        Page.REVIEWS: header,
    }
    for page, expected in pages.items():
        s = state(page, asin='B0TEST0000', options={'size': '8'})
        assert render(s, tiny_catalogue, 'text') == expected
        assert clickables(s, tiny_catalogue) == ['back to search', '< prev']
    rich = render(state(Page.FEATURES, asin='B0TEST0000', options={'size': '8'}), tiny_catalogue, 'text_rich')
    assert rich == ('Instruction:\nfind me canvas running shoes\n[button] Back to Search [button_]\n'
                    '[button] < Prev [button_]\n Rubber sole\n Lace up\n Machine wash\n')


def test_done_page(tiny_catalogue):
    s = state(Page.DONE, asin='B0TEST0000', options={'size': '8', 'color': 'black | white'}, reward=0.75)
    assert render(s, tiny_catalogue, 'text') == DONE_TEXT
    assert render(s, tiny_catalogue, 'text_rich').startswith(
        'Thank you for shopping with us!\nYour code: \nNone\n (Paste it in your MTurk interface.)\nPurchased\n')
    assert clickables(s, tiny_catalogue) == []
    no_options = render(state(Page.DONE, asin='B0TEST0001', reward=0.0), tiny_catalogue, 'text')
    assert '[SEP] B0TEST0001 [SEP] options [SEP] {} [SEP]' in no_options
    assert '[SEP] 0.0 [SEP] Reward Details' in no_options


def test_options_json_is_flask_tojson():
    assert options_json({'size': '8', 'color': 'black'}) == '{"color": "black", "size": "8"}'
    assert options_json({'color': "it's <b> & café"}) == '{"color": "it\\u0027s \\u003cb\\u003e \\u0026 caf\\u00e9"}'


def test_whitespace_only_texts_behave_like_beautifulsoup(tiny_catalogue):
    """Empty texts vanish, whitespace without a newline leaves an empty segment, with a newline nothing."""
    product = tiny_catalogue.by_asin['B0TEST0000']
    odd = dataclasses.replace(product, asin='B0ODD00001', description='', bullet_points=('', 'a', ' \n '))
    catalogue = SimpleNamespace(by_asin={odd.asin: odd})
    header = 'Instruction: [SEP] find me canvas running shoes [SEP] Back to Search [SEP] < Prev'
    assert render(state(Page.DESCRIPTION, asin=odd.asin), catalogue, 'text') == header
    assert render(state(Page.FEATURES, asin=odd.asin), catalogue, 'text') == header + ' [SEP]  [SEP] a'


def test_equal_values_in_two_groups_are_both_marked_clicked(tiny_catalogue):
    product = tiny_catalogue.by_asin['B0TEST0000']
    twin = dataclasses.replace(product, asin='B0TWIN0001', options={'color': ['black', 'red'], 'trim': ['black', 'blue']})
    catalogue = SimpleNamespace(by_asin={twin.asin: twin})
    rich = render(state(Page.ITEM, asin=twin.asin, options={'trim': 'black'}), catalogue, 'text_rich')
    assert rich.startswith('You have clicked black.\nYou have clicked black.\n')
    assert rich.count('[clicked button] black [clicked button_]') == 2


def test_embedded_item_page_layout(embedded):
    product = next(p for p in embedded.products if p.options)
    s = EpisodeState('find x', Page.ITEM, ['x'], 1, [product.asin], product.asin)
    option_part = ' [SEP] '.join(f'{name} [SEP] ' + ' [SEP] '.join(values) for name, values in product.options.items())
    assert render(s, embedded, 'text') == (
        f'Instruction: [SEP] find x [SEP] Back to Search [SEP] < Prev [SEP] {option_part} [SEP] {product.title} '
        f'[SEP] Price: {product.price_display} [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews '
        '[SEP] Buy Now')


REAL_ASIN = 'B08KYBVQ46'
REAL_INS = ('Find me double sided, machine washable decorative pillows with printing technology with size: '
            '28" x 28", and price lower than 50.00 dollars')


def test_real_catalogue_pages(real_catalogue):
    assert real_catalogue.goals[0]['instruction_text'] == REAL_INS
    s = EpisodeState(REAL_INS, Page.ITEM, ['tights'], 1, [REAL_ASIN], REAL_ASIN)
    assert render(s, real_catalogue, 'text') == (
        f'Instruction: [SEP] {REAL_INS} [SEP] Back to Search [SEP] < Prev [SEP] size [SEP] xx-small [SEP] x-small '
        '[SEP] small [SEP] medium [SEP] large [SEP] x-large [SEP] color [SEP] orbit green [SEP] victory crimson '
        "[SEP] adidas Originals Women's Adicolor Essentials Tights [SEP] Price: $16.82 to $35.0 [SEP] Rating: N.A. "
        '[SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now')
    s.page = Page.FEATURES
    assert render(s, real_catalogue, 'text') == (
        f"Instruction: [SEP] {REAL_INS} [SEP] Back to Search [SEP] < Prev [SEP] Women's tights for casual wear "
        '[SEP] TIGHT FIT: Wears close but is not restrictive, and hugs the legs almost like a second skin [SEP] '
        'ELASTIC WAIST: High-rise elastic waist for extra coverage [SEP] BETTER COTTON INITIATIVE: By buying cotton '
        "products from us, you're supporting more sustainable cotton farming")
    s.page = Page.RESULTS
    assert render(s, real_catalogue, 'text') == (
        f'Instruction: [SEP] {REAL_INS} [SEP] Back to Search [SEP] Page 1 (Total results: 1) [SEP] Next > [SEP] '
        f"{REAL_ASIN} [SEP] adidas Originals Women's Adicolor Essentials Tights [SEP] $16.82 to $35.0")
    features_rich = render(EpisodeState(REAL_INS, Page.FEATURES, ['x'], 1, [], REAL_ASIN), real_catalogue, 'text_rich')
    assert "\n Women's tights for casual wear \n" in features_rich   # raw node text: leading and trailing space kept
