"""`EnvPool`: a batch of `WebShopEnv`s spread over host worker processes.

Each worker hosts a contiguous block of envs that share ONE read-only catalogue (the parent's own, read
from the files at pool creation and handed to each worker as it starts; no catalogue file is cached, so
workers serve exactly what the parent read) and ONE search engine (one JVM per worker with the "pyserini"
search backend, none with "bm25"). `reset` and `step` scatter one message per worker and gather the replies, so a batch
costs one round trip. Workers are started with the "spawn" context (the parent may hold JAX threads;
forking it is unsafe).

Failure handling: a worker that dies, or does not answer within `step_timeout_s`, is killed and restarted;
each of its envs comes back as `(failure observation, 0.0, False, True, info)` with `info["failed"] = True`
and `info["error"]`, and has no episode until its next reset. An exception inside one env fails only that
env. The pool never hangs on a worker and never loses a batch.

Determinism: env slot i's reset number n uses seed `(seed, i, n)`; goals, prices and pages depend only on
the catalogue, so results are the same for any `num_workers` (except the `<r>` debug search, whose random
draw is per worker).
"""

import multiprocessing
import os
import random
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from webshop.catalogue import Catalogue
from webshop.search import check_backend

WORKER_START_TIMEOUT_S = 300.0
_FAILED_AVAILABLE_ACTIONS = {"has_search_bar": False, "clickables": []}


@dataclass(frozen=True)
class CatalogueSpec:
    """A picklable name for a catalogue: `"embedded"` or a WebShop data directory, with its goal kind and
    search backend (`webshop.search.SEARCH_BACKENDS`)."""
    source: str = "embedded"
    goals: str = "synthetic"
    num_products: int | None = None
    search_backend: str = "pyserini"

    def __post_init__(self):
        check_backend(self.search_backend)

    @classmethod
    def parse(cls, spec: "CatalogueSpec | str | os.PathLike") -> "CatalogueSpec":
        if isinstance(spec, CatalogueSpec):
            return spec
        if isinstance(spec, (str, os.PathLike)):
            return cls(source=os.fspath(spec))
        raise TypeError(f"a catalogue must be a Catalogue, a CatalogueSpec, 'embedded' or a data directory path, "
                        f"got {type(spec).__name__}")

    def build(self) -> Catalogue:
        if self.source == "embedded":
            if self.goals != "synthetic" or self.num_products is not None:
                raise ValueError("the embedded catalogue has fixed size and synthetic goals; "
                                 "use CatalogueSpec('embedded') without goals/num_products")
            return Catalogue.embedded_default(self.search_backend)
        return Catalogue.from_dir(self.source, self.goals, num_products=self.num_products,
                                  search_backend=self.search_backend)


def resolve_catalogue(catalogue: "Catalogue | CatalogueSpec | str | os.PathLike") -> Catalogue:
    """A `Catalogue` as given, or built from a spec / `"embedded"` / a data directory (read now)."""
    return catalogue if isinstance(catalogue, Catalogue) else CatalogueSpec.parse(catalogue).build()


def failed_result(error: str) -> tuple[str, float, bool, bool, dict]:
    """The step result reported for an env whose worker or episode failed."""
    info = {"failed": True, "error": error, "valid": False, "available_actions": _FAILED_AVAILABLE_ACTIONS}
    return f"Environment failure: {error}", 0.0, False, True, info


def _worker_main(conn: Connection, catalogue: Catalogue, num_envs: int, env_kwargs: dict) -> None:
    """Serve `("reset", [(slot, goal, seed)])` / `("step", [(slot, action)])` requests until "close"."""
    from webshop.env import WebShopEnv
    _ = catalogue.search_engine  # build the search engine (pyserini: start the JVM, open the index) before "ready"
    envs = [WebShopEnv(catalogue, **env_kwargs) for _ in range(num_envs)]
    conn.send("ready")
    while True:
        command, requests = conn.recv()
        if command == "close":
            return
        replies = []
        for slot, *args in requests:
            try:
                if command == "reset":
                    goal_index, seed = args
                    replies.append(envs[slot].reset(goal_index, seed=seed))
                else:
                    replies.append(envs[slot].step(args[0]))
            except Exception as error:  # one broken episode must not take the worker down
                replies.append(failed_result(f"{type(error).__name__}: {error}"))
        conn.send(replies)


class _Worker:
    """One worker process and its pipe."""

    def __init__(self, context, catalogue: Catalogue, num_envs: int, env_kwargs: dict):
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(target=_worker_main, daemon=True,
                                       args=(child_conn, catalogue, num_envs, env_kwargs))
        self.process.start()
        child_conn.close()

    def wait_ready(self, timeout_s: float) -> None:
        if not self.conn.poll(timeout_s):
            self.kill()
            raise TimeoutError(f"an EnvPool worker did not start within {timeout_s:.0f} s")
        try:
            message = self.conn.recv()
        except EOFError:
            message = None
        if message != "ready":
            self.kill()
            raise RuntimeError(f"an EnvPool worker failed to start (exit code {self.process.exitcode}); "
                               "build the catalogue and its search engine in one process to see the error")

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


class EnvPool:
    """`num_envs` WebShop envs over `num_workers` processes; batched `reset` / `step`.

    `catalogue`: a `Catalogue`, or a `CatalogueSpec` / `"embedded"` / data directory to build one from now.
    """

    def __init__(self, catalogue, num_envs: int, num_workers: int, seed: int = 0,
                 step_timeout_s: float = 60.0, **env_kwargs):
        if num_envs < 1 or not 1 <= num_workers <= num_envs:
            raise ValueError(f"need num_envs >= 1 and 1 <= num_workers <= num_envs, got num_envs={num_envs}, "
                             f"num_workers={num_workers}")
        self.num_envs, self.seed, self.step_timeout_s = num_envs, seed, step_timeout_s
        self._env_kwargs = env_kwargs
        self._context = multiprocessing.get_context("spawn")
        self._catalogue = resolve_catalogue(catalogue)
        base, extra = divmod(num_envs, num_workers)
        sizes = [base + (w < extra) for w in range(num_workers)]
        starts = [sum(sizes[:w]) for w in range(num_workers)]
        self._blocks = [range(start, start + size) for start, size in zip(starts, sizes)]
        self._reset_counts = [0] * num_envs
        self._workers: list[_Worker] = []
        # With pyserini the first worker builds the Lucene index if needed and the others then open it;
        # "bm25" workers index in memory, all at once.
        first_wave = 1 if self._catalogue.search_backend == "pyserini" else num_workers
        for wave in (range(first_wave), range(first_wave, num_workers)):
            self._workers += [self._start_worker(w) for w in wave]
            for w in wave:
                self._workers[w].wait_ready(WORKER_START_TIMEOUT_S)

    @property
    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def reset(self, goal_indices, env_ids=None) -> tuple[list[str], list[dict]]:
        """Start episodes: env `env_ids[k]` (default: all, in order) on goal `goal_indices[k]` (None: drawn by weight)."""
        env_ids = self._check_env_ids(env_ids, len(goal_indices), "goal_indices")
        requests = {}
        for env_id, goal_index in zip(env_ids, goal_indices):
            seed = random.Random(f"{self.seed}:{env_id}:{self._reset_counts[env_id]}").getrandbits(31)
            self._reset_counts[env_id] += 1
            requests[env_id] = (goal_index, seed)
        results = self._run("reset", requests)
        pairs = [(r[0], r[4]) if len(r) == 5 else r for r in (results[e] for e in env_ids)]
        return [obs for obs, _ in pairs], [info for _, info in pairs]

    def step(self, actions) -> list[tuple | None]:
        """One action per env (None: leave that env alone, its result is None); `(obs, r, term, trunc, info)` each."""
        if len(actions) != self.num_envs:
            raise ValueError(f"step needs one action per env ({self.num_envs}), got {len(actions)}; "
                             "use None for envs to leave alone")
        requests = {env_id: (a,) for env_id, a in enumerate(actions) if a is not None}
        results = self._run("step", requests)
        return [results.get(env_id) for env_id in range(self.num_envs)]

    def close(self) -> None:
        for worker in self._workers:
            try:
                worker.conn.send(("close", None))
            except OSError:
                pass
        for worker in self._workers:
            worker.process.join(timeout=5)
            worker.kill()
        self._workers = []

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_env_ids(self, env_ids, count: int, what: str) -> list[int]:
        env_ids = list(range(self.num_envs)) if env_ids is None else list(env_ids)
        if len(env_ids) != count:
            raise ValueError(f"{what} has {count} entries but {len(env_ids)} envs were named")
        if any(not 0 <= e < self.num_envs for e in env_ids) or len(set(env_ids)) != len(env_ids):
            raise ValueError(f"env_ids must be distinct integers in [0, {self.num_envs}), got {env_ids}")
        return env_ids

    def _start_worker(self, w: int) -> _Worker:
        return _Worker(self._context, self._catalogue, len(self._blocks[w]), self._env_kwargs)

    def _run(self, command: str, requests: dict) -> dict:
        """Scatter per-env requests to their workers and gather `{env_id: result}`; failed workers restarted."""
        if not self._workers:
            raise RuntimeError("this EnvPool is closed")
        pending = {}
        for w, block in enumerate(self._blocks):
            mine = [(env_id - block.start, *requests[env_id]) for env_id in block if env_id in requests]
            if not mine:
                continue
            pending[w] = [block.start + slot for slot, *_ in mine]
            try:
                self._workers[w].conn.send((command, mine))
            except OSError:
                pass  # a dead worker: the gather below sees its closed pipe and reports it
        results, failures = {}, {}
        deadline = time.monotonic() + self.step_timeout_s
        while len(results) + len(failures) < len(pending):
            waiting = {self._workers[w].conn: w for w in pending if w not in results and w not in failures}
            sentinels = {self._workers[w].process.sentinel: w for w in waiting.values()}
            ready = wait([*waiting, *sentinels], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                failures.update({w: f"worker did not answer within {self.step_timeout_s} s" for w in waiting.values()})
                break
            for handle in ready:
                w = waiting.get(handle, sentinels.get(handle))
                if w in results or w in failures:
                    continue
                try:
                    results[w] = self._workers[w].conn.recv()
                except (EOFError, OSError):
                    failures[w] = f"worker process died (exit code {self._workers[w].process.exitcode})"
        gathered = {}
        for w, replies in results.items():
            gathered.update(zip(pending[w], replies))
        for w, error in failures.items():
            self._restart(w)
            gathered.update({env_id: failed_result(error) for env_id in pending[w]})
        return gathered

    def _restart(self, w: int) -> None:
        self._workers[w].kill()
        self._workers[w] = self._start_worker(w)
        self._workers[w].wait_ready(WORKER_START_TIMEOUT_S)
