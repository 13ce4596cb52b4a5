"""WebShop environment benchmark: start-up costs, expert-policy steps/s in one process and in the pool, memory,
and the scripted expert's reward, on the embedded catalogue and (when present) the real 1k catalogue.

    .venv/bin/python bench/env_bench.py [--quick] [--search-backend pyserini|bm25]

Prints progress to stderr, appends a section to bench/RESULTS.md and ends with ONE JSON line on stdout.
Goal: >= 2,000 env steps/s on one core for the expert policy (warm query cache); pool scaling with cores.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from webshop import search
from webshop.catalogue import Catalogue
from webshop.env import WebShopEnv
from webshop.expert import ScriptedExpert, action_of, run_expert_episode
from webshop.pool import CatalogueSpec, EnvPool
from webshop.synthetic import generate_raw

REPO = Path(__file__).resolve().parents[1]
REAL_DATA = REPO / ".." / "shared" / "webshop-1k"
RESULTS = REPO / "bench" / "RESULTS.md"
WARM_REPEATS = 3   # warm-cache throughput is the fastest of this many passes (the machine may be shared)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def rss_mib(pids=None) -> float:
    processes = [psutil.Process(pid) for pid in (pids or [os.getpid()])]
    return round(sum(p.memory_info().rss for p in processes) / 2**20, 1)


def expert_pass(catalogue, goal_indices, repeats: int = 1) -> dict:
    """In-process passes of the expert over the goals (the fastest of `repeats`): steps/s, mean reward, success rate."""
    env, expert = WebShopEnv(catalogue), ScriptedExpert(catalogue)
    episodes, seconds = min((timed(lambda: [run_expert_episode(env, g, expert) for g in goal_indices])
                             for _ in range(repeats)), key=lambda run: run[1])
    steps = sum(len(e) for e in episodes)
    rewards = [e[-1].reward for e in episodes]
    return {"episodes": len(episodes), "steps": steps, "steps_per_s": round(steps / seconds, 1),
            "mean_reward": round(sum(rewards) / len(rewards), 4),
            "success_rate": round(sum(r == 1.0 for r in rewards) / len(rewards), 4)}


def pool_throughput(spec, catalogue, goal_indices, num_envs: int, num_workers: int) -> dict:
    """Expert-driven episodes through an EnvPool (the expert runs in this process): start-up and steps/s."""
    pool, start_s = timed(lambda: EnvPool(spec, num_envs=num_envs, num_workers=num_workers))
    with pool:
        cold_steps, cold_s = timed(lambda: _pool_pass(pool, catalogue, goal_indices, num_envs))
        warm_steps, warm_s = min((timed(lambda: _pool_pass(pool, catalogue, goal_indices, num_envs))
                                  for _ in range(WARM_REPEATS)), key=lambda run: run[1])
        memory = rss_mib(pool.worker_pids)
    return {"workers": num_workers, "envs": num_envs, "start_s": round(start_s, 2), "steps": warm_steps,
            "steps_per_s_cold_cache": round(cold_steps / cold_s, 1), "steps_per_s": round(warm_steps / warm_s, 1),
            "worker_rss_mib": memory}


def _pool_pass(pool, catalogue, goal_indices, num_envs: int) -> int:
    """Play the goals in batches of `num_envs` (goal k always in the same env slot); returns the step count."""
    steps = 0
    for first in range(0, len(goal_indices) - num_envs + 1, num_envs):
        observations, infos = pool.reset(goal_indices[first:first + num_envs])
        experts = [ScriptedExpert(catalogue) for _ in range(num_envs)]
        live = [True] * num_envs
        while any(live):
            actions = [action_of(x.act(o, i)) if alive else None
                       for x, o, i, alive in zip(experts, observations, infos, live)]
            for k, result in enumerate(pool.step(actions)):
                if result is not None:
                    observations[k], _, terminated, truncated, infos[k] = result
                    live[k] = not (terminated or truncated)
                    steps += 1
    return steps


def startup_costs(catalogue) -> dict:
    """pyserini: JVM start (0 when already running), index build (cold, into a fresh directory) and open (warm);
    bm25: the in-memory index build."""
    if catalogue.search_backend == "bm25":
        _, build_s = timed(lambda: search.SearchEngine(catalogue.products, None, backend="bm25"))
        return {"index_build_in_memory_s": round(build_s, 2)}
    _, jvm_s = timed(lambda: search._java_class("io.anserini.search.SimpleSearcher"))
    with tempfile.TemporaryDirectory() as cache:
        _, cold_s = timed(lambda: search.SearchEngine(catalogue.products, Path(cache)))
        _, warm_s = timed(lambda: search.SearchEngine(catalogue.products, Path(cache)))
    return {"jvm_start_s": round(jvm_s, 2), "index_build_cold_s": round(cold_s, 2), "index_open_warm_s": round(warm_s, 2)}


def bench_catalogue(name: str, build, spec, goal_split: str, quick: bool) -> dict:
    log(f"[{name}] building the catalogue")
    catalogue, build_s = timed(build)
    result = {"catalogue_build_s": round(build_s, 2), "products": len(catalogue.products), "goals": len(catalogue.goals)}
    result.update(startup_costs(catalogue))
    goals = catalogue.split(goal_split)
    goals = goals[:: max(1, len(goals) // (100 if quick else 500))]
    log(f"[{name}] expert over {len(goals)} goals, cold then warm query cache")
    result["expert_cold_cache"] = expert_pass(catalogue, goals)
    result["expert_warm_cache"] = expert_pass(catalogue, goals, repeats=WARM_REPEATS)
    result["rss_mib"] = rss_mib()
    if spec is not None:
        pool_goals = goals if quick else goals * 3
        for workers in (1, 2):
            log(f"[{name}] pool with {workers} worker(s)")
            result[f"pool_{workers}w"] = pool_throughput(spec, catalogue, pool_goals, 16, workers)
    return result


def append_results(report: dict, command: str) -> None:
    if not RESULTS.exists():
        RESULTS.write_text("# Benchmark results\n\nAppend-only: one section per run (date, machine, command, results).\n")
    rows = []
    for name, r in report["catalogues"].items():
        for label, key in (("expert, 1 process, cold query cache", "expert_cold_cache"),
                           ("expert, 1 process, warm query cache", "expert_warm_cache"),
                           ("expert, pool 1 worker (16 envs), warm worker caches", "pool_1w"),
                           ("expert, pool 2 workers (16 envs), warm worker caches", "pool_2w")):
            if key in r:
                rows.append(f"| {name} | {label} | {r[key]['steps_per_s']} |")
        rows.append(f"| {name} | expert mean reward / success rate | {r['expert_warm_cache']['mean_reward']} / "
                    f"{r['expert_warm_cache']['success_rate']} |")
        if "jvm_start_s" in r:
            rows.append(f"| {name} | catalogue build / JVM start / index cold / index warm (s) | {r['catalogue_build_s']} / "
                        f"{r['jvm_start_s']} / {r['index_build_cold_s']} / {r['index_open_warm_s']} |")
        else:
            rows.append(f"| {name} | catalogue build / in-memory BM25 index build (s) | {r['catalogue_build_s']} / "
                        f"{r['index_build_in_memory_s']} |")
        pools = [r[k] for k in ("pool_1w", "pool_2w") if k in r]
        rows.append(f"| {name} | RSS main process (MiB); pool start-up (s) | {r['rss_mib']}; "
                    f"{' / '.join(str(p['start_s']) for p in pools) or '-'} |")
    section = [f"\n## env_bench ({report['date']})\n", f"- machine: {report['machine']}",
               f"- search backend: {report['search_backend']}",
               f"- synthetic catalogue generation (1,200 products): {report['synthetic_generate_s']} s",
               f"- command: `{command}`", f"- commit: {report['commit']}\n",
               "| catalogue | measure | value (steps/s unless stated) |", "|---|---|---|", *rows, ""]
    with RESULTS.open("a") as f:
        f.write("\n".join(section))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer goals and pool rounds (about 2 minutes)")
    parser.add_argument("--search-backend", choices=search.SEARCH_BACKENDS, default="pyserini",
                        help="search engine of every catalogue: Lucene through pyserini (Java) or the identical numpy BM25")
    args = parser.parse_args()
    backend = args.search_backend
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    report = {
        "bench": "env_bench", "quick": args.quick, "search_backend": backend,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {round(psutil.virtual_memory().total / 2**30)} GiB, "
                   f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f} at start",
        "commit": commit, "catalogues": {},
    }
    report["synthetic_generate_s"] = round(timed(generate_raw)[1], 3)
    report["catalogues"]["embedded"] = bench_catalogue(
        "embedded", lambda: Catalogue.embedded_default(backend), CatalogueSpec("embedded", search_backend=backend),
        "test", args.quick)
    if (REAL_DATA / "items_shuffle_1000.json").exists():
        report["catalogues"]["real_1k_synthetic_goals"] = bench_catalogue(
            "real_1k_synthetic_goals", lambda: Catalogue.from_dir(REAL_DATA, search_backend=backend),
            CatalogueSpec(str(REAL_DATA.resolve()), search_backend=backend), "all", args.quick)
    else:
        log(f"real 1k data not found at {REAL_DATA}: skipped")
    append_results(report, "python bench/env_bench.py" + (" --quick" if args.quick else "") +
                   (f" --search-backend {backend}" if backend != "pyserini" else ""))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
