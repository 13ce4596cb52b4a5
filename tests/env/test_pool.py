"""EnvPool: same results as in-process envs, deterministic, survives killed and hung workers."""

import json
import os
import signal
import time

import psutil

import pytest

from webshop.catalogue import Catalogue
from webshop.env import WebShopEnv
from webshop.expert import ScriptedExpert, action_of
from webshop.pool import CatalogueSpec, EnvPool
from webshop.synthetic import generate_raw

NUM_ENVS = 6


@pytest.fixture(scope="module")
def catalogue():
    return Catalogue.embedded_default()


@pytest.fixture(scope="module")
def pool():
    with EnvPool("embedded", num_envs=NUM_ENVS, num_workers=2, step_timeout_s=60.0) as pool:
        yield pool


def _expert_rollout(reset, step, catalogue, goal_indices) -> list[list[tuple]]:
    """Drive a batch with one expert per env; each env's list of (obs, reward, terminated, truncated, valid)."""
    observations, infos = reset(goal_indices)
    experts = [ScriptedExpert(catalogue) for _ in goal_indices]
    traces = [[(obs, 0.0, False, False, True)] for obs in observations]
    live = [True] * len(goal_indices)
    while any(live):
        actions = [action_of(x.act(o, i)) if alive else None
                   for x, o, i, alive in zip(experts, observations, infos, live)]
        for k, result in enumerate(step(actions)):
            if result is None:
                continue
            obs, reward, terminated, truncated, info = result
            traces[k].append((obs, reward, terminated, truncated, info["valid"]))
            observations[k], infos[k] = obs, info
            live[k] = not (terminated or truncated)
    return traces


def _in_process(catalogue, n):
    envs = [WebShopEnv(catalogue) for _ in range(n)]

    def reset(goal_indices):
        pairs = [env.reset(g) for env, g in zip(envs, goal_indices)]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def step(actions):
        return [env.step(a) if a is not None else None for env, a in zip(envs, actions)]
    return reset, step


def test_pool_matches_in_process_envs_and_is_deterministic(pool, catalogue):
    goals = catalogue.split("test")[:NUM_ENVS]
    pooled = _expert_rollout(pool.reset, pool.step, catalogue, goals)
    again = _expert_rollout(pool.reset, pool.step, catalogue, goals)
    local = _expert_rollout(*_in_process(catalogue, NUM_ENVS), catalogue, goals)
    assert pooled == again == local
    assert all(trace[-1][2] and trace[-1][1] > 0 for trace in pooled)


def test_partial_reset_and_step_leave_other_envs_alone(pool, catalogue):
    goals = catalogue.split("test")
    observations, _ = pool.reset(goals[:NUM_ENVS])
    obs, infos = pool.reset([goals[10]], env_ids=[3])
    assert infos[0]["goal_index"] == goals[10]
    results = pool.step([None, None, None, "search[red]", None, None])
    assert [r is None for r in results] == [True, True, True, False, True, True]
    assert "Page 1" in results[3][0]
    with pytest.raises(ValueError, match="one action per env"):
        pool.step(["search[red]"])


def test_killed_worker_is_reported_and_replaced(pool, catalogue):
    goals = catalogue.split("test")[:NUM_ENVS]
    pool.reset(goals)
    victim = pool.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    results = pool.step(["search[shoes]"] * NUM_ENVS)
    failed = [r[4].get("failed", False) for r in results]
    assert failed == [False] * 3 + [True] * 3
    assert all(r[3] and "died" in r[4]["error"] for r in results[3:])
    assert pool.worker_pids[1] != victim
    observations, infos = pool.reset(goals)
    assert all(info["valid"] and info["goal_index"] == g for info, g in zip(infos, goals))


def test_hung_worker_times_out_and_is_replaced(pool, catalogue):
    goals = catalogue.split("test")[:NUM_ENVS]
    pool.reset(goals)
    victim = pool.worker_pids[0]
    os.kill(victim, signal.SIGSTOP)
    pool.step_timeout_s = 2.0
    try:
        started = time.monotonic()
        results = pool.step(["search[shoes]"] * NUM_ENVS)
        assert time.monotonic() - started < 60
    finally:
        pool.step_timeout_s = 60.0
    assert [r[4].get("failed", False) for r in results] == [True] * 3 + [False] * 3
    assert "did not answer" in results[0][4]["error"]
    assert pool.worker_pids[0] != victim
    assert pool.step(["search[shoes]"] * NUM_ENVS)[0][4]["failed"]      # no episode until the next reset
    pool.reset(goals)
    assert not any(r[4].get("failed") for r in pool.step(["search[shoes]"] * NUM_ENVS))


def _runs_a_jvm(pid: int) -> bool:
    return any("libjvm" in m.path for m in psutil.Process(pid).memory_maps())


def test_bm25_pool_gives_the_same_episodes_without_a_jvm(pool, catalogue):
    goals = catalogue.split("test")[:2]
    local = _expert_rollout(*_in_process(catalogue, 2), catalogue, goals)
    with EnvPool(CatalogueSpec("embedded", search_backend="bm25"), num_envs=2, num_workers=2) as bm25_pool:
        assert _expert_rollout(bm25_pool.reset, bm25_pool.step, catalogue, goals) == local
        assert not any(_runs_a_jvm(pid) for pid in bm25_pool.worker_pids)
    assert all(_runs_a_jvm(pid) for pid in pool.worker_pids)   # the pyserini workers do


def test_bad_arguments_are_rejected_clearly():
    with pytest.raises(TypeError, match="a catalogue must be a Catalogue, a CatalogueSpec"):
        EnvPool(42, num_envs=2, num_workers=1)
    with pytest.raises(ValueError, match="num_workers"):
        EnvPool("embedded", num_envs=2, num_workers=3)
    with pytest.raises(ValueError, match="embedded catalogue has fixed size"):
        CatalogueSpec("embedded", goals="human").build()


def _write_data_dir(directory, seed: int) -> None:
    raw = generate_raw(num_products=40, seed=seed)
    (directory / "items_shuffle_40.json").write_text(json.dumps(raw["items"]))
    (directory / "items_ins_v2_40.json").write_text(json.dumps(raw["attributes"]))


def test_a_pool_serves_the_data_files_as_they_are_now_and_caches_no_catalogue(tmp_path, monkeypatch):
    """Data files replaced in place (same directory) are what the next pool's workers serve; the pool
    writes no catalogue file that a later pool (or another user) could load."""
    cache_dir = tmp_path / "cache"
    monkeypatch.setenv("WEBSHOP_CACHE_DIR", str(cache_dir))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    spec = CatalogueSpec(str(data_dir), search_backend="bm25")
    first_goals = []
    for seed in (1, 2):
        _write_data_dir(data_dir, seed)
        expected = Catalogue.from_dir(data_dir, search_backend="bm25").goals[0]["instruction_text"]
        with EnvPool(spec, num_envs=1, num_workers=1) as pool:
            _, infos = pool.reset([0])
        assert infos[0]["goal"]["instruction_text"] == expected
        first_goals.append(expected)
    assert first_goals[0] != first_goals[1]
    assert not cache_dir.exists() or not any(cache_dir.rglob("*"))
