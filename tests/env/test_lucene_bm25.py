"""Pure-Python Lucene BM25: analyzer, stemmer, norms and ranking, checked against Lucene itself.

The reference is the Lucene/Anserini code in pyserini's jar (the Java objects pyserini's LuceneSearcher
wraps); those tests skip when Java or pyserini is missing. Real-catalogue tests read ../shared/webshop-1k.
"""

import gzip
import json
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest

from webshop import english_analyzer, search
from webshop.expert import instruction_request
from webshop.english_analyzer import analyze, tokenize
from webshop.lucene_bm25 import LuceneBM25Index, byte4_to_int, int_to_byte4, lucene_idf
from webshop.porter_stemmer import porter_stem

# Characters that exercise every word-break class: letters, digits, mid-word punctuation, underscore and
# narrow no-break space, combining and format marks, joiners, emoji (with selectors, skin tones, flags,
# keycaps), CJK, Katakana (full and half width), Hiragana, Thai, Hebrew with quotes, odd case mappings.
TRICKY_ALPHABET = (list("abcXYZ019 .,:;'_-/’‘·＇：，．\"#\n\t") +
                   list('\u00ad\u0301\ufe0f\u200d❤🌸👍🏻©®™米カｱﾟひกéßİΣ\u202f½²🇺🇸⃣ـא'))


def _product(asin, title, description='', bullets=('',), options=None):
    return SimpleNamespace(asin=asin, title=title, description=description, bullet_points=bullets,
                           options=options or {}, category='fashion', query='q')


class LuceneReference:
    """Lucene's analyzer and searchers from pyserini's Anserini jar."""

    def __init__(self):
        java = search._java_class
        self._java = java
        self._utils = java('io.anserini.analysis.AnalyzerUtils')
        self._analyzer = java('io.anserini.analysis.DefaultEnglishAnalyzer').newDefaultInstance()
        no_stop_words = java('org.apache.lucene.analysis.CharArraySet').EMPTY_SET
        self._tokenizer = java('org.apache.lucene.analysis.standard.StandardAnalyzer')(no_stop_words)
        self._query_generator = java('io.anserini.search.query.BagOfWordsQueryGenerator')()

    def terms(self, text: str) -> list[str]:
        return list(self._utils.analyze(self._analyzer, text))

    def lowercased_tokens(self, text: str) -> list[str]:
        """StandardTokenizer + LowerCaseFilter only."""
        return list(self._utils.analyze(self._tokenizer, text))

    def index_searcher(self, index_dir):
        """A plain Lucene IndexSearcher with Anserini's BM25(0.9, 0.4): raw float scores."""
        from jnius import cast
        java = self._java
        directory = java('org.apache.lucene.store.FSDirectory').open(java('java.io.File')(str(index_dir)).toPath())
        reader = java('org.apache.lucene.index.DirectoryReader').open(directory)
        searcher = java('org.apache.lucene.search.IndexSearcher')(cast('org.apache.lucene.index.IndexReader', reader))
        searcher.setSimilarity(java('org.apache.lucene.search.similarities.BM25Similarity')(0.9, 0.4))
        return searcher

    def raw_scores(self, searcher, query: str) -> dict[int, float]:
        """Lucene doc number -> score of every matching document."""
        lucene_query = self._query_generator.buildQuery('contents', self._analyzer, query)
        return {hit.doc: hit.score for hit in searcher.search(lucene_query, 100_000).scoreDocs}

    def pyserini_searcher(self, index_dir):
        """Anserini's SimpleSearcher, the object pyserini's LuceneSearcher delegates `search(q, k)` to."""
        return self._java('io.anserini.search.SimpleSearcher')(str(index_dir))


@pytest.fixture(scope='module')
def lucene() -> LuceneReference:
    try:
        return LuceneReference()
    except RuntimeError as error:
        pytest.skip(f'the Lucene reference needs pyserini and Java 21: {error}')


# ---------------------------------------------------------------- no Java needed


def test_norm_bytes_are_lucenes_lossy_lengths():
    lengths = range(100_000)
    encoded = [int_to_byte4(n) for n in lengths]
    decoded = [byte4_to_int(b) for b in encoded]
    assert all(0 <= b <= 255 for b in encoded)
    assert decoded[:40] == list(range(40))                         # exact below 40
    assert all(d <= n and n - d <= n / 8 for n, d in zip(lengths, decoded))   # 4 significant bits above
    assert all(a <= b for a, b in zip(encoded, encoded[1:]))       # order-preserving
    assert [int_to_byte4(byte4_to_int(b)) for b in range(256)] == list(range(256))
    with pytest.raises(ValueError, match='non-negative'):
        int_to_byte4(-1)


def test_porter_stemmer_is_the_reference_c_version_lucene_uses():
    # the classic rules of Porter's paper
    for word, stem in [('caresses', 'caress'), ('ponies', 'poni'), ('cats', 'cat'), ('feed', 'feed'),
                       ('agreed', 'agre'), ('plastered', 'plaster'), ('motoring', 'motor'), ('sing', 'sing'),
                       ('conflated', 'conflat'), ('troubled', 'troubl'), ('sized', 'size'), ('hopping', 'hop'),
                       ('falling', 'fall'), ('filing', 'file'), ('happy', 'happi'), ('relational', 'relat'),
                       ('generalization', 'gener'), ('hopefulness', 'hope'), ('electriciti', 'electr'),
                       ('adjustment', 'adjust'), ('adoption', 'adopt'), ('controlling', 'control'),
                       ('rolls', 'roll'), ('skies', 'ski'), ('dying', 'dy')]:
        assert porter_stem(word) == stem, word
    # where the C version (and Lucene) departs from the paper and from Snowball's "porter"
    assert porter_stem('assembly') == 'assembl'       # -bli -> -ble (paper: -abli -> -able)
    assert porter_stem('technology') == 'technolog'   # -logi -> -log added
    assert porter_stem('us') == 'us'                  # words of 1-2 letters are never stemmed
    assert porter_stem('3.5s') == '3.5' and porter_stem('naïve') == 'naïv'


def test_tokenizer_follows_lucenes_word_break_rules():
    assert tokenize("It's a 3.5mm jack, 1,000 pcs (e.g. wi-fi) x_y 5x7 a.1 don't") == [
        "It's", 'a', '3.5mm', 'jack', '1,000', 'pcs', 'e.g', 'wi', 'fi', 'x_y', '5x7', 'a', '1', "don't"]
    assert tokenize('a:b 12：30 ½ 2² ___ _a_') == ['a:b', '12', '30', '2', '_a_']   # fullwidth colon joins letters only
    assert tokenize('brand® x™ ©2020 ❤️ ❤❤ 👍🏻 ok') == ['brand', '®', 'x', '™', '©', '2020', '❤️', '❤', '❤', '👍🏻', 'ok']
    assert tokenize('米锅巴 カタカナ ひら wi\u00adfi') == ['米', '锅', '巴', 'カタカナ', 'ひ', 'ら', 'wi\u00adfi']
    assert [len(t) for t in tokenize('a' * 600)] == [255, 255, 90]
    assert [len(t) for t in tokenize('a' * 254 + '.b' + 'c' * 10)] == [254, 11]   # the window ends before '.'


def test_analyzer_strips_possessives_lowercases_drops_stop_words_and_stems():
    assert analyze("The Runner's SHOES are in John’s bag, and it's NOT waterproof") == [
        'runner', 'shoe', 'john', 'bag', 'waterproof']
    assert analyze('the of and to') == [] and analyze('') == []
    assert analyze('İSTANBUL ΣΟΦΙΑ') == ['istanbul', 'σοφια']   # Java's per-character lowercasing


def test_fast_token_patterns_agree_with_the_general_grammar():
    rng = random.Random(0)
    plain_alphabet = [c for c in TRICKY_ALPHABET
                      if english_analyzer.word_break_class(c) not in 'XZVFQH']
    for _ in range(2000):
        text = ''.join(rng.choice(plain_alphabet) for _ in range(rng.randint(1, 30)))
        classes = text.translate(english_analyzer._CLASS_TABLE)
        expected = english_analyzer._scan(english_analyzer._GENERAL_TOKEN, classes, text)
        assert english_analyzer._scan(english_analyzer._PLAIN_TOKEN, classes, text) == expected, repr(text)
        ascii_text = ''.join(c for c in text if c.isascii())
        ascii_classes = ascii_text.translate(english_analyzer._CLASS_TABLE)
        assert (english_analyzer._ASCII_TOKEN.findall(ascii_text) ==
                english_analyzer._scan(english_analyzer._GENERAL_TOKEN, ascii_classes, ascii_text)), repr(ascii_text)


def test_scores_follow_the_bm25_formula_with_lucenes_idf():
    contents = ['red shoes', 'red red red shoes for running', 'blue shirt', 'red dress with red belt']
    index = LuceneBM25Index(['D0', 'D1', 'D2', 'D3'], contents)
    lengths = [len(analyze(text)) for text in contents]   # all below 40 tokens: norms are exact
    avgdl = sum(lengths) / len(lengths)
    idf = math.log(1 + (4 - 3 + 0.5) / (3 + 0.5))          # 'red' is in 3 of 4 documents
    for doc, tf in [(0, 1), (1, 3), (3, 2)]:
        expected = idf * tf / (tf + 0.9 * (1 - 0.4 + 0.4 * lengths[doc] / avgdl))
        assert index.scores('red')[doc] == pytest.approx(expected, rel=1e-6)
    assert np.isnan(index.scores('red')[2])
    assert index.top_k('red', 10) == ['D1', 'D3', 'D0']
    assert index.search('red red') == index.search('red')   # a repeated term doubles every score
    np.testing.assert_array_equal(index.scores('red red'), 2 * index.scores('red'))
    assert index.search('the with for') == [] and index.search('unknownword') == []
    assert lucene_idf(3, 4) == np.float32(idf)


def test_ties_are_broken_by_ascending_document_id():
    index = LuceneBM25Index(['B9', 'B2', 'B5', 'A7'], ['green tea', 'green tea', 'black tea', 'green tea'])
    assert index.top_k('green', 10) == ['A7', 'B2', 'B9']
    assert index.top_k('green', 2) == ['A7', 'B2'] and index.top_k('green', 0) == []


def test_from_products_indexes_webshop_documents():
    products = [_product('B01', 'Running Shoes for Men', 'lightweight foxes'),
                _product('B02', 'Green Tea Bags', 'calming herbal tea', options={'flavor': ['mint', 'lemon']})]
    index = LuceneBM25Index.from_products(products)
    assert index.search('fox') == ['B01'] and index.search('lemon flavor') == ['B02']
    assert index.num_terms == len(set(analyze(search.document_contents(products[0]))) |
                                  set(analyze(search.document_contents(products[1]))))


def test_bad_input_is_refused_with_a_clear_message():
    with pytest.raises(ValueError, match='2 document ids but 1 contents'):
        LuceneBM25Index(['a', 'b'], ['text'])
    with pytest.raises(ValueError, match=r"unique \(repeated: \['a'\]\)"):
        LuceneBM25Index(['a', 'a'], ['x', 'y'])
    with pytest.raises(ValueError, match='empty document list'):
        LuceneBM25Index([], [])
    with pytest.raises(ValueError, match='k must be >= 0'):
        LuceneBM25Index(['a'], ['x']).top_k('x', -1)


# ---------------------------------------------------------------- against Lucene


def test_tokens_match_lucene_on_fuzzed_text(lucene):
    rng = random.Random(1)
    for _ in range(1500):
        text = ''.join(rng.choice(TRICKY_ALPHABET) for _ in range(rng.randint(1, 30)))
        assert [english_analyzer._java_lower(t) for t in tokenize(text)] == lucene.lowercased_tokens(text), repr(text)
        assert analyze(text) == lucene.terms(text), repr(text)


def test_stop_words_are_lucenes_english_set(lucene):
    java_set = search._java_class('org.apache.lucene.analysis.en.EnglishAnalyzer').ENGLISH_STOP_WORDS_SET
    assert {''.join(chars) for chars in java_set.toArray()} == english_analyzer.ENGLISH_STOP_WORDS


def test_stems_match_lucene_on_english_words(lucene):
    lookups = pytest.importorskip('spacy_lookups_data')
    from importlib.resources import files
    with gzip.open(files(lookups) / 'data' / 'en_lemma_lookup.json.gz') as f:
        lemmas = json.load(f)
    vocabulary = sorted({w.lower() for pair in lemmas.items() for w in pair if w.isascii() and w.isalpha()}
                        - english_analyzer.ENGLISH_STOP_WORDS)
    words = random.Random(2).sample(vocabulary, 20_000)
    assert [porter_stem(w) for w in words] == lucene.terms(' '.join(words))


def test_scores_and_ranking_equal_lucenes_on_a_hand_made_corpus(lucene, tmp_path):
    long_text = ' '.join(f'filler{i} shoes' for i in range(60))   # 120 tokens: a lossy norm
    products = [
        _product('B05', 'Red Running Shoes', "men's lightweight foxes", ('Rubber sole',), {'size': ['8', '9.5']}),
        _product('B01', 'Red Running Shoes', "men's lightweight foxes", ('Rubber sole',), {'size': ['8', '9.5']}),
        _product('B03', 'Green Tea Bags', 'calming herbal tea, 3.5oz ❤️ caf\u00e9', ('Organic',)),
        _product('B04', 'Trail Sneakers', long_text, ('Shoes for running on trails',)),
        _product('B02', 'The Cap', 'a cap', ()),
        _product('B06', 'Wireless Headphones 3.5mm', "It's John’s pick: noise-cancelling, 20h battery"),
        _product('A01', 'Running shoes shoes shoes', 'shoes ' * 30),
    ]
    index_dir = search.ensure_index(products, tmp_path)
    searcher = lucene.index_searcher(index_dir)
    pyserini = lucene.pyserini_searcher(index_dir)
    ours = LuceneBM25Index.from_products(products)
    for query in ['shoes', 'red running shoes', 'shoes shoes shoes', 'fox', "men's", 'tea tea', 'café ❤',
                  '3.5mm headphones', 'john noise cancelling', 'the of and', 'nothingmatches', 'RUNNING Trail',
                  'filler7 filler7 shoes', 'cap']:
        expected = lucene.raw_scores(searcher, query)
        scores = ours.scores(query)
        matched = np.flatnonzero(~np.isnan(scores))
        assert sorted(expected) == matched.tolist(), query        # Lucene doc numbers = insertion order
        assert [float(scores[d]) for d in sorted(expected)] == [expected[d] for d in sorted(expected)], query
        assert ours.top_k(query, 50) == [hit.docid for hit in pyserini.search(query, 50)], query


@pytest.mark.slow
def test_embedded_catalogue_top50_identical_to_pyserini(lucene, embedded):
    pyserini = lucene.pyserini_searcher(embedded.search_engine.index_dir)
    index = LuceneBM25Index.from_products(embedded.products)
    queries = [goal['instruction_text'] for goal in embedded.goals[:200]]
    queries += [instruction_request(goal['instruction_text']) for goal in embedded.goals[200:400]]
    differing = [q for q in queries if index.search(q) != [hit.docid for hit in pyserini.search(q, 50)]]
    assert differing == [], f'{len(differing)} of {len(queries)} top-50 lists differ, e.g. {differing[:3]}'


@pytest.mark.slow
@pytest.mark.real_data
def test_real_catalogue_terms_and_statistics_match_the_reference_index(lucene, real_catalogue, real_dir):
    contents = [search.document_contents(p) for p in real_catalogue.products]
    assert [analyze(text) for text in contents] == [lucene.terms(text) for text in contents]
    reader = lucene.index_searcher(real_dir / 'reference_index_lucene95').getIndexReader()
    index = LuceneBM25Index.from_products(real_catalogue.products)
    assert index.doc_count == reader.getDocCount('contents') == 1000
    assert index.avgdl == np.float32(reader.getSumTotalTermFreq('contents') / 1000)


@pytest.mark.slow
@pytest.mark.real_data
def test_real_catalogue_top50_identical_to_pyserini(lucene, real_catalogue, real_dir):
    pyserini = lucene.pyserini_searcher(real_dir / 'reference_index_lucene95')
    index = LuceneBM25Index.from_products(real_catalogue.products)
    instructions = json.loads((real_dir / 'items_ins_v2_1000.json').read_text())
    human = json.loads((real_dir / 'human_instructions_full_catalogue.json').read_text())
    rng = random.Random(3)
    queries = [v['instruction'] for v in instructions.values() if 'instruction' in v][::2]
    queries += rng.sample(human, 60)
    vocabulary = sorted({word for query in queries for word in query.lower().split()})
    queries += [' '.join(rng.sample(vocabulary, rng.randint(1, 3))) for _ in range(40)]
    queries += [p.title for p in real_catalogue.products[::40]]
    assert len(queries) >= 300
    differing = [q for q in queries if index.search(q) != [hit.docid for hit in pyserini.search(q, 50)]]
    assert differing == [], f'{len(differing)} of {len(queries)} top-50 lists differ, e.g. {differing[:3]}'
