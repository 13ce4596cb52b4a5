"""Batched episodes with a scripted sampler: slot refilling, KV bookkeeping, terminations, records."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from spa_jax.models.tokenizer import SentencePieceTokenizer
from spa_jax.rollout import agent_format as af
from spa_jax.rollout import episodes
from spa_jax.rollout.generate import Generation, SharedPrefix

ASIN = "B0TEST0001"
SEARCH_PAGE = "WebShop [SEP] Instruction: [SEP] {goal} [SEP] Search"
RESULTS_PAGE = "Instruction: [SEP] {goal} [SEP] Back to Search [SEP] Page 1 (Total results: 1) [SEP] B0TEST0001 [SEP] Mug [SEP] $5.00"
ITEM_PAGE = "Instruction: [SEP] {goal} [SEP] Back to Search [SEP] < Prev [SEP] Mug [SEP] Buy Now"
FAILING_TASK = 13


class ToyShop:
  """A tiny deterministic shop with the EnvPool interface: search -> results -> item -> buy.

  Task t buys with reward (t % 4) / 3 capped at 1; task 13's env crashes on its first step."""

  def __init__(self, num_envs, max_steps=10):
    self.num_envs, self.max_steps = num_envs, max_steps
    self.envs = [None] * num_envs

  def reset(self, goal_indices, env_ids):
    observations, infos = [], []
    for env_id, goal in zip(env_ids, goal_indices):
      self.envs[env_id] = {"goal": goal, "page": SEARCH_PAGE, "steps": 0}
      observations.append(self._render(env_id))
      infos.append({"goal": {"instruction_text": f"buy mug {goal}"}, "valid": True})
    return observations, infos

  def _render(self, env_id):
    return self.envs[env_id]["page"].format(goal=f"buy mug {self.envs[env_id]['goal']}")

  def step(self, actions):
    results = []
    for env_id, action in enumerate(actions):
      if action is None:
        results.append(None)
        continue
      env = self.envs[env_id]
      env["steps"] += 1
      if env["goal"] == FAILING_TASK:
        results.append(("", 0.0, False, True, {"failed": True, "valid": False}))
        continue
      moves = {(SEARCH_PAGE, "search"): RESULTS_PAGE, (RESULTS_PAGE, f"click[{ASIN.lower()}]"): ITEM_PAGE}
      key = (env["page"], "search" if action.startswith("search[") else action.lower())
      valid = key in moves or (env["page"] == ITEM_PAGE and action.lower() == "click[buy now]")
      if env["page"] == ITEM_PAGE and valid:
        results.append(("Thank you", min(1.0, (env["goal"] % 4) / 3), True, False, {"valid": True}))
        continue
      env["page"] = moves.get(key, env["page"])
      results.append((self._render(env_id), 0.0, False, env["steps"] >= self.max_steps, {"valid": valid}))
    return results


def scripted_reply(context: str, task: int) -> str:
  """The toy policy: acts on the last real page; task 5 always rambles; odd tasks stall once."""
  episode = context.split(af.DEMO_EXCHANGES[-1][1])[-1]
  pages = [p for p in episode.split("Observation:")[1:] if "Invalid format" not in p]
  if task == 5:
    return "I am not sure what to do here."
  if "[SEP] Search" in pages[-1]:
    return f"Thought: search it.\nAction: search[mug {task}]"
  if "Total results" in pages[-1]:
    if task % 2 and "Invalid format" not in episode:
      return "Thought: hmm"  # no action: answered with the invalid-format observation
    return f"Thought: the mug.\nAction: Click[{ASIN}]."
  return "Thought: buy.\nAction: click[Buy Now]"


class ScriptedSampler:
  """The Sampler API over host lists: each row's full sequence is kept to check the runner's bookkeeping."""

  def __init__(self, tokenizer, batch_size, max_len=4096):
    self.tokenizer, self.batch_size, self.max_len = tokenizer, batch_size, max_len
    self.generate_calls = 0
    self.row_task = {}

  def init_state(self):
    return [[] for _ in range(self.batch_size)]

  def reset_rows(self, state, rows):
    return [[] if r in rows else seq for r, seq in enumerate(state)]

  def prefill_prefix(self, params, tokens):
    self.prefix_calls = getattr(self, "prefix_calls", 0) + 1
    return SharedPrefix(tuple(tokens), cache=None)

  def start_rows(self, state, rows, prefix):
    assert all(not state[r] for r in rows), "start_rows on a row that was not emptied"
    self.started_rows = getattr(self, "started_rows", 0) + len(rows)
    return [list(prefix.tokens) if r in rows else seq for r, seq in enumerate(state)]

  def overflowing_rows(self, state, rows, token_lists, reserve=1):
    return [r for r, t in zip(rows, token_lists) if len(state[r]) + len(t) + reserve > self.max_len]

  def extend(self, params, state, rows, token_lists):
    state = [list(seq) for seq in state]
    for r, tokens in zip(rows, token_lists):
      state[r] += tokens
    return state

  def generate(self, params, state, rows_mask, *, rng, max_new_tokens, temperature, top_p, stop):
    self.generate_calls += 1
    state = [list(seq) for seq in state]
    ids, logprobs, texts, reasons = [], [], [], []
    for r in range(self.batch_size):
      if not rows_mask[r]:
        ids.append([]), logprobs.append([]), texts.append(""), reasons.append("")
        continue
      context = self.tokenizer.decode(state[r])
      task = int(context.split("buy mug ")[1].split(" ")[0])
      text = scripted_reply(context, task)
      use_eos = len(state[r]) % 2 == 0  # alternate "eos" and "stop" endings
      tokens = self.tokenizer.encode(text) + ([self.tokenizer.end_of_turn_id] if use_eos else [])
      state[r] += tokens
      ids.append(tokens), logprobs.append([-0.5] * len(tokens)), texts.append(text)
      reasons.append("eos" if use_eos else "stop")
    return state, Generation(ids, logprobs, texts, reasons)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  corpus = [m["content"] for m in af.prompt_messages(True)] + [
      SEARCH_PAGE, RESULTS_PAGE, ITEM_PAGE, "Thought: search it.\nAction: search[mug 12]",
      "Thought: the mug.\nAction: Click[B0TEST0001].", af.INVALID_FORMAT_MESSAGE, "buy mug 0123456789"]
  return SentencePieceTokenizer.train_or_load(corpus, tmp_path_factory.mktemp("spm"), vocab_size=700)


def run(tokenizer, tasks, *, batch=3, samples=2, max_steps=10, max_len=4096, history_window=0, share_prefix=True):
  sampler = ScriptedSampler(tokenizer, batch, max_len)
  records = []
  summary = episodes.run_episodes(
      sampler, None, ToyShop(batch, max_steps), tokenizer, tasks, samples_per_task=samples,
      temperature=1.0, top_p=1.0, max_new_tokens=64, rng=jax.random.key(0),
      on_trajectory=records.append, history_window=history_window, policy="test-policy",
      env_settings={"catalogue": "toy"}, show_progress=False, share_prefix=share_prefix)
  return sampler, records, summary


@pytest.mark.parametrize("history_window", [0, 2])
def test_the_shared_prompt_prefix_changes_no_record(tokenizer, history_window):
  """Rows started from the once-prefilled prompt record the same episodes as rows prefilled whole;
  every episode start (and, with a window, every re-encoded turn) takes the prefix."""
  tasks = [0, 1, 2, 3, 4, 6]
  shared, with_prefix, summary = run(tokenizer, tasks, batch=4, history_window=history_window)
  plain, without, plain_summary = run(tokenizer, tasks, batch=4, history_window=history_window, share_prefix=False)
  key = lambda r: (r["task_id"], r["rollout"])  # noqa: E731
  assert sorted(with_prefix, key=key) == sorted(without, key=key)
  assert shared.prefix_calls == 1 and not hasattr(plain, "prefix_calls")
  episode_starts = len(with_prefix)
  turns = sum(r["num_steps"] for r in with_prefix)
  assert shared.started_rows == summary["prefix_starts"] == (episode_starts if history_window == 0 else turns)
  assert summary["prefix_tokens"] > 100 and plain_summary["prefix_starts"] == plain_summary["prefix_tokens"] == 0


def test_every_task_and_rollout_runs_once_with_a_full_batch(tokenizer):
  sampler, records, summary = run(tokenizer, [0, 1, 2, 3, 4, 6], batch=4, samples=2)
  assert sorted((r["task_id"], r["rollout"]) for r in records) == [(t, k) for t in [0, 1, 2, 3, 4, 6] for k in (0, 1)]
  assert summary["episodes"] == 12
  # 12 episodes of 3-4 turns on 4 slots: refilling keeps the batch full, far fewer calls than serial turns.
  assert sampler.generate_calls <= 14
  by_task = {r["task_id"]: r for r in records}
  assert by_task[4]["final_reward"] == 0.0 and by_task[4]["purchased"] and not by_task[4]["success"]
  assert by_task[2]["final_reward"] == pytest.approx(2 / 3)
  assert by_task[3]["success"] and by_task[3]["termination"] == "purchase"
  assert summary["purchase_rate"] == 100.0


def test_invalid_output_gets_the_eto_observation_and_counts_as_an_invalid_step(tokenizer):
  _, records, _ = run(tokenizer, [1], samples=1)
  [record] = records
  actions = [s["parsed_action"] for s in record["steps"]]
  assert actions == ["search[mug 1]", None, "click[B0TEST0001]", "click[Buy Now]"]
  assert [s["valid"] for s in record["steps"]] == [True, False, True, True]
  assert record["steps"][2]["observation"] == af.INVALID_FORMAT_MESSAGE
  assert record["steps"][1]["parse_error"] == "no 'Action:' in the output"


def test_max_steps_and_env_failure_end_episodes(tokenizer):
  _, records, summary = run(tokenizer, [5, FAILING_TASK], samples=1, max_steps=4)
  by_task = {r["task_id"]: r for r in records}
  assert by_task[5]["termination"] == "max_steps" and by_task[5]["num_steps"] == 4
  assert by_task[5]["final_reward"] == 0.0 and not any(s["valid"] for s in by_task[5]["steps"])
  assert by_task[FAILING_TASK]["termination"] == "env_failed"
  assert summary["ended_max_steps"] == 1 and summary["ended_env_failed"] == 1


def test_recorded_tokens_are_the_conversation_the_model_saw(tokenizer):
  _, records, _ = run(tokenizer, [0, 1, 2], batch=2, samples=1)
  for record in records:
    conversation = episodes.trajectory_conversation(record)
    ids, mask = tokenizer.encode_chat(list(conversation.messages))
    assert record["tokens"] == ids
    example = af.build_sft_example(conversation, tokenizer)
    assert record["action_mask"] == example.step_mask
    assert len(record["steps"]) == len(example.step_ends)


def test_context_limit_ends_the_episode(tokenizer):
  prompt_len = len(tokenizer.encode_chat(list(af.start_conversation(SEARCH_PAGE.format(goal="buy mug 0")).messages),
                                         add_generation_prompt=True)[0])
  _, records, _ = run(tokenizer, [0], samples=1, max_len=prompt_len + 80)
  [record] = records
  assert record["termination"] == "context_limit" and 1 <= record["num_steps"] < 4


def test_history_window_reprefills_an_elided_conversation(tokenizer):
  sampler, records, _ = run(tokenizer, [2], samples=1, history_window=1)
  [record] = records
  assert record["termination"] == "purchase" and record["tokens"] is None


@pytest.mark.slow
def test_tiny_model_on_the_embedded_env_pool(tokenizer):
  """Real components end to end: tiny random Llama + Sampler + EnvPool on the embedded catalogue."""
  from flax import nnx
  from webshop.pool import EnvPool

  from spa_jax.models.config import LlamaConfig
  from spa_jax.models.llama import Llama
  from spa_jax.rollout.generate import Sampler

  cfg = LlamaConfig.preset("tiny", vocab_size=1024, num_layers=2, hidden_size=64, intermediate_size=128,
                           num_heads=2, num_kv_heads=1, head_dim=32)
  graphdef, params = nnx.split(Llama(cfg, rngs=nnx.Rngs(0)))
  sampler = Sampler(graphdef, cfg, tokenizer, batch_size=3, max_len=2048, length_buckets=(512,))
  records = []
  with EnvPool("embedded", num_envs=3, num_workers=1, max_steps=2) as pool:
    summary = episodes.run_episodes(
        sampler, params, pool, tokenizer, [0, 1], samples_per_task=2, temperature=0.0,
        max_new_tokens=8, rng=jax.random.key(0), on_trajectory=records.append, one_shot=False,
        show_progress=False)
  assert summary["episodes"] == 4 and len(records) == 4
  for record in records:
    assert record["termination"] in ("max_steps", "purchase") and 1 <= record["num_steps"] <= 2
    assert record["steps"][0]["observation"].startswith("Observation:\nWebShop [SEP] Instruction:")
    assert record["instruction"] and record["instruction"] in record["steps"][0]["observation"]
    for step in record["steps"]:
      assert 1 <= len(step["token_logprobs"]) <= 8 and max(step["token_logprobs"]) <= 0.0
    assert sum(record["action_mask"]) >= sum(len(s["token_logprobs"]) for s in record["steps"])
    assert len(record["tokens"]) == len(record["action_mask"])
  by_task = {}
  for record in records:  # greedy decoding: both rollouts of a task are identical
    by_task.setdefault(record["task_id"], []).append([s["model_output"] for s in record["steps"]])
  assert all(a == b for a, b in by_task.values())


@pytest.mark.parametrize("history_window", [0, 2])
def test_process_rows_lockstep_gives_the_same_episodes_on_one_process(tokenizer, history_window):
  """The multi-process path (gathered rows, one reset/extend/generate per turn) changes nothing alone."""
  tasks = [0, 1, 2, 3, 4, 6, 13]  # not 5: it never acts, so a window would show no instruction
  _, plain, plain_summary = run(tokenizer, tasks, batch=4, history_window=history_window)
  records = []
  summary = episodes.run_episodes(
      episodes.ProcessRowsSampler(ScriptedSampler(tokenizer, 4, 4096)), None, ToyShop(4, 10), tokenizer, tasks,
      samples_per_task=2, temperature=1.0, top_p=1.0, max_new_tokens=64, rng=jax.random.key(0),
      on_trajectory=records.append, history_window=history_window, policy="test-policy",
      env_settings={"catalogue": "toy"}, show_progress=False)
  key = lambda r: (r["task_id"], r["rollout"])  # noqa: E731
  assert sorted(records, key=key) == sorted(plain, key=key)
  assert {k: v for k, v in summary.items() if "per_s" not in k and k != "seconds"} == \
      {k: v for k, v in plain_summary.items() if "per_s" not in k and k != "seconds"}


_TWO_PROCESS_WORKER = """
import json, sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
pid, port, out, tokenizer_file, tests_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid)
sys.path.insert(0, tests_dir)
from test_episodes import ScriptedSampler, ToyShop, episodes
from spa_jax.models.tokenizer import SentencePieceTokenizer
tokenizer = SentencePieceTokenizer(tokenizer_file)
records = []
tasks = [0, 1, 2, 3, 4, 6, 13]
episodes.run_episodes(episodes.ProcessRowsSampler(ScriptedSampler(tokenizer, 4, 4096)), None, ToyShop(2, 10),
                      tokenizer, tasks[pid::2], samples_per_task=2, temperature=1.0, top_p=1.0,
                      max_new_tokens=64, rng=jax.random.key(0), on_trajectory=records.append,
                      policy="test-policy", env_settings={"catalogue": "toy"}, show_progress=False)
json.dump(records, open(out, "w"))
"""


@pytest.mark.slow
def test_two_processes_each_drive_their_rows_and_together_run_every_episode(tokenizer, tmp_path):
  """Two JAX processes (CPU, gloo): unequal task shares, one global sampler, same episodes as one process."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  worker = tmp_path / "worker.py"
  worker.write_text(_TWO_PROCESS_WORKER)
  tests_dir = str(pathlib.Path(__file__).parent)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  procs = [subprocess.Popen([sys.executable, str(worker), str(k), str(port), str(tmp_path / f"p{k}.json"),
                             str(tokenizer.path), tests_dir], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True) for k in (0, 1)]
  errors = [p.communicate(timeout=300)[1] for p in procs]
  assert all(p.returncode == 0 for p in procs), errors
  merged = [r for k in (0, 1) for r in json.loads((tmp_path / f"p{k}.json").read_text())]
  _, single, _ = run(tokenizer, [0, 1, 2, 3, 4, 6, 13], batch=4)
  key = lambda r: (r["task_id"], r["rollout"])  # noqa: E731
  assert sorted(merged, key=key) == sorted(single, key=key)
