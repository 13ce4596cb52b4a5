"""Two JAX processes give the result of one: `python -m spa_jax.main --config=configs/ppo.py`
(sft -> explore -> prm -> label -> online PPO with SPA rewards -> greedy eval), run as 1 process x
2 CPU devices and as 2 processes x 1 CPU device (localhost coordinator, gloo collectives), each run
in its own workspace, must leave the same files with the same contents, each written once (by
process 0, or one trajectory shard per process).

Why 1 x 2 against 2 x 1: both runs have the same global mesh (data=2), so each device runs the same
program on the same shapes, and a two-way sum is the same in either order: the runs agree to float
rounding (bitwise, in practice). `env.num_envs` is per process, 4 for the single process and 2 for
each of the two, so the Sampler has 4 global rows in both. 2 train tasks x 2 samples fill them in
one wave, and process k's round-robin share of the tasks (task k) lands on the same global rows
(2k, 2k + 1) as in the one-process run, so every episode sees the same sampling noise. With more
episodes than rows the refill order would differ: same distribution, other samples.

The tiny policy earns no reward and no grounding, so rewards are zero: an entropy bonus makes the
first PPO update move the policy, and a second iteration then has KL-shaped rewards (value loss).
"""

import collections
import json
import pathlib
import re

import numpy as np
import pytest
from safetensors.numpy import load_file

import multiprocess_launch as launch
from spa_jax.rollout.trajectory_store import read_jsonl

CONFIG_FILE = "ppo.py"
STAGES = ("sft", "explore", "prm", "label", "ppo", "eval")
SHARED = {
    "run.targets": "ppo,eval",
    "model.arch.hidden_size": 64, "model.arch.intermediate_size": 128, "model.arch.num_layers": 1,
    "model.arch.num_heads": 2, "model.arch.num_kv_heads": 1, "model.arch.head_dim": 32,
    "env.pool_workers": 1, "env.max_steps": 5, "agent.max_context": 512,
    "sft.expert_episodes": 4, "sft.epochs": 1, "sft.batch_size": 2, "sft.micro_batch_size": 2,
    "explore.max_tasks": 2, "explore.samples_per_task": 2, "explore.max_new_tokens": 16,
    "prm.epochs": 1, "prm.batch_size": 4, "prm.micro_batch_size": 2,
    "ppo.reward_modes": "spa", "ppo.iterations": 2, "ppo.rollouts_per_iteration": 4, "ppo.entropy_coef": 0.01,
    "ppo.samples_per_task": 2, "ppo.mini_batch_size": 2, "ppo.ppo_epochs": 1, "ppo.max_new_tokens": 16,
    "eval.policies": "ppo_spa", "eval.max_tasks": 2, "eval.max_new_tokens": 16,
    "tracking.progress": False,
}
GLOBAL_ROWS = 4  # sampler rows of every rollout: env.num_envs x processes
PROCESSES = 2
TIMEOUT_S = 1500  # both runs together; about 4 min on an idle 2-core machine, twice that under load
# Keys whose values legitimately differ between the runs: wall-clock times (also every time_<phase>_s) and
# device memory, and the process layout (the config's distributed section and per-process env.num_envs,
# so also the fingerprints of them).
LAYOUT_KEYS = {"time", "seconds", "finished_at", "distributed", "num_envs", "fingerprint", "inputs",
               "peak_memory_gb"}
FLOAT_TOLERANCE = dict(rtol=1e-5, atol=1e-6)
WORKSPACE = "<workspace>"  # stands for the workspace root in the JSON files compared


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
  """(one-process workspace, two-process workspace) after both runs (side by side)."""
  root = tmp_path_factory.mktemp("multiprocess")
  runs = [launch.start(root / "single", CONFIG_FILE, SHARED | {"env.num_envs": GLOBAL_ROWS},
                       processes=1, devices_per_process=PROCESSES),
          launch.start(root / "multi", CONFIG_FILE, SHARED | {"env.num_envs": GLOBAL_ROWS // PROCESSES},
                       processes=PROCESSES, devices_per_process=1)]
  launch.wait(runs, TIMEOUT_S)
  return runs[0].workdir, runs[1].workdir


# ----------------------------------------------------------------------------- file inventory

# checkpoints/<stage>/<config hash>/[<reward mode>/]<step>/
_CHECKPOINT_STEP = re.compile(r"^(checkpoints/[^/]+)/[^/]+/((?:[^/]+/)*?\d+)/")
_TB_EVENTS = re.compile(r"^(tb/[^/]+)/events\.out\.tfevents\..*$")  # named after time and host
_SHARD = re.compile(r"^(trajectories/.+)\.p(\d+)\.jsonl$")


def inventory_key(relative: str) -> str | None:
  """What a file stands for, independent of process count and timing; None: a trajectory shard."""
  if match := _CHECKPOINT_STEP.match(relative):
    return f"{match[1]}/<{match[2]}>"  # Orbax writes one ocdbt part per process inside
  if match := _TB_EVENTS.match(relative):
    return f"{match[1]}/<events>"
  if _SHARD.match(relative):
    return None
  return relative


def inventory(ws: pathlib.Path) -> collections.Counter:
  """How many files stand for each inventory key (an Orbax checkpoint step counts once)."""
  keys = [key for f in files(ws) if (key := inventory_key(f))]
  steps = {key for key in keys if key.startswith("checkpoints/")}
  return collections.Counter(key for key in keys if key not in steps) + collections.Counter(steps)


def files(ws: pathlib.Path) -> list[str]:
  return sorted(str(p.relative_to(ws)) for p in ws.rglob("*") if p.is_file())


def compared_files(ws: pathlib.Path) -> list[str]:
  """Files the runs must share byte for byte or value for value (no checkpoints, events, shards, plots)."""
  return [f for f in files(ws) if inventory_key(f) == f and not f.endswith(".png")]


def shards(ws: pathlib.Path) -> dict[str, list[int]]:
  """Trajectory set name -> the process indices of its shards."""
  found = collections.defaultdict(list)
  for f in files(ws):
    if match := _SHARD.match(f):
      found[match[1]].append(int(match[2]))
  return {name: sorted(ks) for name, ks in found.items()}


# ----------------------------------------------------------------------------- value comparison


def assert_same(single, multi, where: str) -> None:
  """Equal JSON values: floats to FLOAT_TOLERANCE, LAYOUT_KEYS skipped, "outputs" as inventories."""
  if isinstance(single, dict) and isinstance(multi, dict):
    assert single.keys() == multi.keys(), f"{where}: keys {sorted(single)} != {sorted(multi)}"
    for key in single:
      if key == "outputs":
        assert _output_set(single[key]) == _output_set(multi[key]), f"{where}.outputs"
      elif key not in LAYOUT_KEYS and not key.endswith("_per_s") and not re.fullmatch(r"time_\w+_s", key):
        assert_same(single[key], multi[key], f"{where}.{key}")
  elif isinstance(single, list) and isinstance(multi, list):
    assert len(single) == len(multi), f"{where}: {len(single)} != {len(multi)} items"
    for i, (a, b) in enumerate(zip(single, multi)):
      assert_same(a, b, f"{where}[{i}]")
  elif isinstance(single, float) or isinstance(multi, float):
    np.testing.assert_allclose(multi, single, **FLOAT_TOLERANCE, err_msg=where)
  else:
    assert single == multi, f"{where}: {single!r} != {multi!r}"


def _output_set(paths: list[str]) -> set[str]:
  """A stage's outputs (relative or absolute), by what they stand for; shards by their set."""
  keys = set()
  for path in paths:
    relative = path.removeprefix(WORKSPACE + "/")
    keys.add(inventory_key(relative) or _SHARD.match(relative)[1])
  return keys


def _relative_paths(text: str, ws: pathlib.Path) -> str:
  return text.replace(str(ws.resolve()), WORKSPACE)


def assert_same_file(single_ws: pathlib.Path, multi_ws: pathlib.Path, relative: str) -> None:
  a, b = single_ws / relative, multi_ws / relative
  if relative.endswith(".safetensors"):
    single, multi = load_file(str(a)), load_file(str(b))
    assert single.keys() == multi.keys(), relative
    for name in single:
      np.testing.assert_allclose(multi[name], single[name], **FLOAT_TOLERANCE, err_msg=f"{relative}: {name}")
  elif relative.endswith(".json"):
    assert_same(json.loads(_relative_paths(a.read_text(), single_ws)),
                json.loads(_relative_paths(b.read_text(), multi_ws)), relative)
  elif relative.endswith(".jsonl"):
    assert_same(list(read_jsonl(a)), list(read_jsonl(b)), relative)
  else:
    assert a.read_bytes() == b.read_bytes(), f"{relative} differs"


# ----------------------------------------------------------------------------- tests


@pytest.mark.slow
def test_two_processes_write_the_same_files_each_once(workspaces):
  single, multi = workspaces
  assert inventory(multi) == inventory(single)
  assert all((multi / stage / "DONE.json").exists() for stage in STAGES)
  tables = lambda ws, k: launch.log_path(ws, k).read_text().count("Evaluation on test")  # noqa: E731
  assert tables(single, 0) >= 1
  assert [tables(multi, k) for k in range(PROCESSES)] == [tables(single, 0), 0], "process 0 alone prints"
  single_shards, multi_shards = shards(single), shards(multi)
  assert single_shards.keys() == multi_shards.keys() and single_shards
  assert all(ks == [0] for ks in single_shards.values())
  assert all(ks == list(range(PROCESSES)) for ks in multi_shards.values())


@pytest.mark.slow
def test_each_process_writes_only_its_own_files(workspaces):
  """Process 0 writes the shared files; process k > 0 only its trajectory shards and its part of
  each Orbax checkpoint (as recorded by the write audit)."""
  _, multi = workspaces
  writes = [launch.written_files(multi, k) for k in range(PROCESSES)]
  assert {"config.json", "ppo/DONE.json", "metrics/sft.jsonl", "metrics/ppo_spa.jsonl",
          "reports/eval.json"} <= writes[0], "the audit missed process 0's writes"
  for k in range(PROCESSES):
    own_shards = {f for f in writes[k] if (m := _SHARD.match(f)) and int(m[2]) == k}
    other_shards = {f for f in writes[k] if _SHARD.match(f)} - own_shards
    assert own_shards and not other_shards, f"process {k} wrote shards {sorted(other_shards)}"
    if k > 0:
      shared = sorted(f for f in writes[k] - own_shards if not f.startswith("checkpoints/"))
      assert not shared, f"process {k} wrote shared files {shared}"


def _episode(record: dict) -> tuple[int, int]:
  return record["task_id"], record["rollout"]


@pytest.mark.slow
def test_two_processes_sample_the_same_trajectories_each_once(workspaces):
  single, multi = workspaces
  for name in shards(single):
    parts = [list(read_jsonl(multi / f"{name}.p{k}.jsonl")) for k in range(PROCESSES)]
    assert all(parts), f"{name}: a process wrote no trajectories"
    union = [record for part in parts for record in part]
    counts = collections.Counter(_episode(record) for record in union)
    assert all(n == 1 for n in counts.values()), f"{name}: episodes recorded twice {counts.most_common(3)}"
    reference = sorted(read_jsonl(single / f"{name}.p0.jsonl"), key=_episode)
    union.sort(key=_episode)
    assert_same(reference, union, name)


@pytest.mark.slow
def test_two_processes_train_the_same_parameters(workspaces):
  single, multi = workspaces
  weights = [f for f in compared_files(single) if f.endswith(".safetensors")]
  assert {"policies/sft/model.safetensors", "policies/ppo_spa/model.safetensors"} <= set(weights)
  sft, ppo = (load_file(str(single / "policies" / name / "model.safetensors")) for name in ("sft", "ppo_spa"))
  assert any(not np.array_equal(sft[k], ppo[k]) for k in sft), "PPO left the policy as it was: a void check"
  for relative in weights:
    assert_same_file(single, multi, relative)


@pytest.mark.slow
def test_two_processes_record_the_same_configs_metrics_and_summaries(workspaces):
  single, multi = workspaces
  records = [f for f in compared_files(single) if not f.endswith(".safetensors")]
  assert {"config.json", "ppo/DONE.json", "metrics/ppo_spa.jsonl", "reports/eval.json"} <= set(records)
  for relative in records:
    assert_same_file(single, multi, relative)
