"""Pure-Python Lucene BM25 backend: build time, query latency and (with --compare) top-50 agreement with pyserini.

    .venv/bin/python bench/lucene_bm25_bench.py [--compare]

Uses the real 1k catalogue (../shared/webshop-1k) when present, else the embedded synthetic catalogue.
Goals: build < 1 s for 1-1.2k products, query well under 1 ms. Ends with ONE JSON line on stdout.
"""

import argparse
import json
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

from webshop.catalogue import Catalogue
from webshop.lucene_bm25 import LuceneBM25Index

REAL_DATA = Path(__file__).resolve().parents[1] / '..' / 'shared' / 'webshop-1k'


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_catalogue_and_queries() -> tuple[Catalogue, list[str]]:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        if not REAL_DATA.is_dir():
            catalogue = Catalogue.embedded_default()
            return catalogue, [goal['instruction_text'] for goal in catalogue.goals[:3000]]
        catalogue = Catalogue.from_dir(REAL_DATA)
    instructions = json.loads((REAL_DATA / 'items_ins_v2_1000.json').read_text())
    human = json.loads((REAL_DATA / 'human_instructions_full_catalogue.json').read_text())
    rng = random.Random(0)
    queries = [v['instruction'] for v in instructions.values() if 'instruction' in v] + rng.sample(human, 2000)
    vocabulary = sorted({word for query in queries for word in query.lower().split()})
    queries += [' '.join(rng.sample(vocabulary, rng.randint(1, 4))) for _ in range(1000)]
    return catalogue, queries + [p.title.lower() for p in catalogue.products[:200]]


def pyserini_agreement(catalogue: Catalogue, index: LuceneBM25Index, queries: list[str]) -> dict:
    """Top-50 lists identical to Anserini's SimpleSearcher (pyserini's LuceneSearcher) on the reference index."""
    from webshop import search
    reference = search._java_class('io.anserini.search.SimpleSearcher')(str(REAL_DATA / 'reference_index_lucene95'))
    identical = sum(index.search(q) == [hit.docid for hit in reference.search(q, 50)] for q in queries)
    return {'queries': len(queries), 'identical_top50': identical}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--compare', action='store_true', help='also check top-50 agreement with pyserini')
    args = parser.parse_args()
    catalogue, queries = load_catalogue_and_queries()
    log(f'{len(catalogue.products)} products, {len(queries)} queries')
    builds = []
    for _ in range(3):   # the first build also fills the per-word stem and token caches
        start = time.perf_counter()
        index = LuceneBM25Index.from_products(catalogue.products)
        builds.append(time.perf_counter() - start)
    log(f'build s: first {builds[0]:.3f}, then {min(builds[1:]):.3f} ({index.num_terms} terms)')
    for query in queries:   # warm the analyzer caches, as a running env would be
        index.search(query)
    latencies_ms = []
    for query in queries:
        start = time.perf_counter()
        index.search(query)
        latencies_ms.append(1000 * (time.perf_counter() - start))
    latencies_ms.sort()
    result = {'products': len(catalogue.products), 'terms': index.num_terms,
              'build_first_s': round(builds[0], 3), 'build_warm_s': round(min(builds[1:]), 3),
              'query_ms_median': round(statistics.median(latencies_ms), 3),
              'query_ms_p90': round(latencies_ms[int(0.9 * len(latencies_ms))], 3),
              'query_ms_mean': round(statistics.fmean(latencies_ms), 3)}
    log(f'query ms: median {result["query_ms_median"]}, p90 {result["query_ms_p90"]}')
    if args.compare and REAL_DATA.is_dir():
        result['pyserini'] = pyserini_agreement(catalogue, index, queries)
        log(f'pyserini agreement: {result["pyserini"]}')
    print(json.dumps(result))


if __name__ == '__main__':
    main()
