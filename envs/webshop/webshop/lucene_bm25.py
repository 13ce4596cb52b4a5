"""Lucene's BM25 ranking in numpy: pyserini's `LuceneSearcher.search(query, k)` without Java.

Reproduces, for an index built the way WebShop builds it (one `contents` field per document,
Anserini's default English analyzer) and searched with pyserini's defaults:

* terms: `webshop.english_analyzer.analyze`, identical token streams to Lucene's;
* query: Anserini's `BagOfWordsQueryGenerator` (one SHOULD clause per analyzed query token), which
  Lucene's `BooleanQuery.rewrite` merges into one clause per distinct term boosted by its count;
* similarity: Lucene 9 `BM25Similarity(k1=0.9, b=0.4)` (Anserini's defaults) in float32 exactly as
  Lucene computes it: `idf = (float) ln(1 + (N - n + 0.5) / (n + 0.5))`, document lengths stored as
  one-byte norms (`SmallFloat.intToByte4`, lossy above 40 tokens), `avgdl = sumTotalTermFreq / N`
  (N = documents with at least one term),
  per-term score `w - w / (1 + tf * normInverse)` with `w = boost * idf`; a document's clause scores
  are summed in double and cast to float;
* ranking: `SimpleSearcher` sorts by score, then by document id string (`BREAK_SCORE_TIES_BY_DOCID`),
  and keeps the first k; its final 4-decimal rounding of scores does not reorder hits.

Checked against Lucene 9.9.1 (pyserini 1.6.0's Anserini 1.7.1) on the real 1k catalogue: every document's
term stream equals the reference index's, all 129,675 (query, document) scores of 303 human instructions
are bit-identical to `IndexSearcher`'s, and the top-50 lists of 3,615 queries (all 415 synthetic
instructions, 2,000 human instructions, 1,000 random keyword queries, 200 titles) are identical to
`LuceneSearcher.search(q, k=50)`'s. Speed on the shared 2-core CPU machine (1,000 products): build
0.3-0.5 s (0.4-0.6 s in a fresh process, which also fills the stemmer and token caches), query median
0.08-0.1 ms, p90 0.15-0.2 ms (`bench/lucene_bm25_bench.py`; ranges over runs at different machine load).
"""

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from webshop.english_analyzer import analyze
from webshop.search import SEARCH_RETURN_N, document_contents

ANSERINI_K1 = 0.9
ANSERINI_B = 0.4


def int_to_byte4(value: int) -> int:
    """Lucene `SmallFloat.intToByte4` as an unsigned byte: exact below 40, 4 significant bits above."""
    if value < 0:
        raise ValueError(f'lengths are non-negative, got {value}')
    num_free_values = 24   # 255 - longToInt4(Integer.MAX_VALUE)
    if value < num_free_values:
        return value
    rest = value - num_free_values
    num_bits = rest.bit_length()
    if num_bits < 4:
        return num_free_values + rest
    shift = num_bits - 4
    return num_free_values + (((rest >> shift) & 0x07) | ((shift + 1) << 3))


def byte4_to_int(encoded: int) -> int:
    """Lucene `SmallFloat.byte4ToInt`: the length a norm byte stands for."""
    num_free_values = 24
    if encoded < num_free_values:
        return encoded
    int4 = encoded - num_free_values
    shift = (int4 >> 3) - 1
    bits = int4 & 0x07
    return num_free_values + (bits if shift == -1 else (bits | 0x08) << shift)


LENGTH_TABLE = np.array([byte4_to_int(i) for i in range(256)], dtype=np.float32)


def lucene_idf(doc_freq: int, doc_count: int) -> np.float32:
    """`(float) Math.log(1 + (docCount - docFreq + 0.5) / (docFreq + 0.5))`."""
    return np.float32(math.log(1 + (doc_count - doc_freq + 0.5) / (doc_freq + 0.5)))


def norm_inverse_table(k1: float, b: float, avgdl: np.float32) -> np.ndarray:
    """`cache[i] = 1f / (k1 * ((1 - b) + b * LENGTH_TABLE[i] / avgdl))` in float32, Lucene's order of operations."""
    k1_f, b_f, one = np.float32(k1), np.float32(b), np.float32(1)
    return one / (k1_f * ((one - b_f) + b_f * LENGTH_TABLE / avgdl))


class LuceneBM25Index:
    """An in-memory inverted index over `(doc_id, contents)` pairs, searched like pyserini's LuceneSearcher.

    `search(query) -> [doc_id, ...]` (the best 50) is the interface of `webshop.search.SearchEngine`
    without its debug prefixes; `top_k(query, k)` matches `webshop.search.LuceneBM25.top_k`.
    """

    def __init__(self, doc_ids: Sequence[str], contents: Sequence[str], k1: float = ANSERINI_K1,
                 b: float = ANSERINI_B):
        if len(doc_ids) != len(contents):
            raise ValueError(f'got {len(doc_ids)} document ids but {len(contents)} contents; pass one id per document')
        if len(set(doc_ids)) != len(doc_ids):
            repeated = [doc_id for doc_id, count in Counter(doc_ids).items() if count > 1][:5]
            raise ValueError(f'document ids must be unique (repeated: {repeated}); drop or rename the duplicates')
        if not doc_ids:
            raise ValueError('cannot index an empty document list; pass at least one document')
        self.doc_ids = list(doc_ids)
        self.k1, self.b = k1, b
        terms_per_doc = [analyze(text) for text in contents]
        lengths = np.array([len(terms) for terms in terms_per_doc], dtype=np.int64)
        self.doc_count = max(int(np.count_nonzero(lengths)), 1)   # Lucene counts documents with >= 1 term
        self.avgdl = np.float32(lengths.sum() / self.doc_count)
        norm_bytes = np.array([int_to_byte4(int(n)) for n in lengths], dtype=np.uint8)
        self._build_postings(terms_per_doc, norm_inverse_table(k1, b, self.avgdl)[norm_bytes])
        id_order = sorted(range(len(doc_ids)), key=lambda i: doc_ids[i].encode('utf-8'))
        self._id_rank = np.empty(len(doc_ids), dtype=np.int64)
        self._id_rank[id_order] = np.arange(len(doc_ids))

    @classmethod
    def from_products(cls, products, **bm25_params) -> 'LuceneBM25Index':
        """Index catalogue products with WebShop's document text (`webshop.search.document_contents`)."""
        products = list(products)
        return cls([p.asin for p in products], [document_contents(p) for p in products], **bm25_params)

    def _build_postings(self, terms_per_doc: list[list[str]], norm_inverse_d: np.ndarray) -> None:
        """CSR postings: term t owns entries `_start[t]:_start[t + 1]`, documents ascending, with
        `_tf_norm = tf * normInverse(doc)` and `_unit_scores`, the float32 score of a clause of boost 1."""
        num_docs = len(terms_per_doc)
        all_terms = [term for terms in terms_per_doc for term in terms]
        self._term_id = {term: i for i, term in enumerate(dict.fromkeys(all_terms))}
        term_of_token = np.fromiter(map(self._term_id.__getitem__, all_terms), dtype=np.int64, count=len(all_terms))
        doc_of_token = np.repeat(np.arange(num_docs), [len(terms) for terms in terms_per_doc])
        pairs, tf = np.unique(term_of_token * num_docs + doc_of_token, return_counts=True)  # term-major, docs ascending
        term_of_posting, self._doc = np.divmod(pairs, num_docs)
        doc_freq = np.bincount(term_of_posting, minlength=len(self._term_id))
        self._start = [0, *np.cumsum(doc_freq).tolist()]
        distinct_doc_freqs, of_term = np.unique(doc_freq, return_inverse=True)
        self._idf = np.array([lucene_idf(n, self.doc_count) for n in distinct_doc_freqs.tolist()],
                             dtype=np.float32)[of_term]
        self._tf_norm = tf.astype(np.float32) * norm_inverse_d[self._doc]
        idf_per_posting = self._idf[term_of_posting]
        self._unit_scores = idf_per_posting - idf_per_posting / (np.float32(1) + self._tf_norm)

    @property
    def num_terms(self) -> int:
        return len(self._term_id)

    def _clause(self, term_id: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(documents, float32 scores) of one term's clause, boosted by `count` (its repeats in the query)."""
        postings = slice(self._start[term_id], self._start[term_id + 1])
        if count == 1:
            return self._doc[postings], self._unit_scores[postings]
        weight = np.float32(count) * self._idf[term_id]
        return self._doc[postings], weight - weight / (np.float32(1) + self._tf_norm[postings])

    def _matched_scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """(numbers of the documents holding any query term, ascending; their float32 scores)."""
        clauses = [self._clause(self._term_id[term], count) for term, count in Counter(analyze(query)).items()
                   if term in self._term_id]
        if not clauses:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        docs = np.concatenate([docs for docs, _ in clauses])
        scores = np.concatenate([scores for _, scores in clauses])
        total = np.bincount(docs, weights=scores, minlength=len(self.doc_ids))   # summed in double, as Lucene
        matched = np.flatnonzero(np.bincount(docs, minlength=len(self.doc_ids)))
        return matched, total[matched].astype(np.float32)

    def scores(self, query: str) -> np.ndarray:
        """Lucene's float32 BM25 score of every document for `query`, NaN where no query term occurs.

        (pyserini's `hit.score` is this value rounded to 4 decimals.)
        """
        matched, matched_scores = self._matched_scores(query)
        scores = np.full(len(self.doc_ids), np.nan, dtype=np.float32)
        scores[matched] = matched_scores
        return scores

    def top_k(self, query: str, k: int) -> list[str]:
        """Ids of the k best documents, best first: score descending, then id ascending."""
        if k < 0:
            raise ValueError(f'k must be >= 0, got {k}')
        candidates, scores = self._matched_scores(query)
        if len(candidates) > k > 0:   # keep every document tied with the k-th best score
            keep = scores >= -np.partition(-scores, k - 1)[k - 1]
            candidates, scores = candidates[keep], scores[keep]
        ranked = candidates[np.lexsort((self._id_rank[candidates], -scores))][:k]
        return [self.doc_ids[i] for i in ranked.tolist()]

    def search(self, query: str) -> list[str]:
        """The best `SEARCH_RETURN_N` (50) document ids for `query`, as WebShop's search returns them."""
        return self.top_k(query, SEARCH_RETURN_N)
