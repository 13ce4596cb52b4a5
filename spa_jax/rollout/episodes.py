"""Batched episodes: one sampler call per turn for every live episode, the env pool stepped alongside.

Each sampler row / pool env is a slot. A slot runs one episode at a time; when it ends, the slot
is reset and refilled from the queue of (task, rollout) pairs so the batch stays full. With
`history_window == 0` a slot's KV cache grows turn by turn: only the closing end-of-turn token,
the next observation turn and the assistant header are prefilled. With a window, the elided
prefix changes every turn, so the slot is reset and its windowed conversation re-prefilled.

Every finished episode becomes one trajectory record (schema in WORKSPACE.md), handed to
`on_trajectory`. This module runs whatever tasks it is given on whatever sampler it is given;
callers decide how tasks are shared between processes.

Multi-process: each process runs its own env pool on its own tasks, while the Sampler needs the
same global inputs on every process. `ProcessRowsSampler` gives each process a block of the
global rows and all-gathers every call's (rows, tokens); its `lockstep` flag makes the loop call
reset/extend/generate once per turn on every process (empty when idle) until all are done.
"""

import dataclasses
import time
from collections import deque
from typing import Callable, Protocol, Sequence

import jax
import numpy as np

from spa_jax import distributed, tracking
from spa_jax.rollout import agent_format as af
from spa_jax.rollout.stop import REACT_ACTION_LINE

# Sent to the env for an output without a parsable action: a no-op that still counts as a step
# (ETO counts every assistant turn), so the env's max_steps truncation stays in charge.
NO_OP_ACTION = "invalid format"
TERMINATIONS = ("purchase", "max_steps", "context_limit", "env_failed")


class EnvBatch(Protocol):
  """The env pool as used here (webshop.EnvPool)."""
  num_envs: int

  def reset(self, goal_indices: Sequence[int], env_ids: Sequence[int]) -> tuple[list[str], list[dict]]:
    """Starts env `env_ids[k]` on goal `goal_indices[k]`."""

  def step(self, actions: Sequence[str | None]) -> list[tuple[str, float, bool, bool, dict] | None]:
    """One action per env; None leaves that env alone (its result is None)."""


@dataclasses.dataclass
class _Episode:
  """A live episode in a slot."""
  task_id: int
  rollout: int
  conversation: af.Conversation
  pending_ids: list[int]  # tokens to prefill before the next generation
  pending_recorded: int = 0  # how many of pending_ids are already in `tokens` (the closing end-of-turn)
  tokens: list[int] = dataclasses.field(default_factory=list)  # the slot's sequence so far
  action_mask: list[int] = dataclasses.field(default_factory=list)
  steps: list[dict] = dataclasses.field(default_factory=list)
  goal: dict | None = None

  def user_turn(self) -> str:
    return self.conversation.messages[-1]["content"]


def trajectory_record(episode: _Episode, *, termination: str, final_reward: float,
                      reward_info: dict | None, policy: str, env_settings: dict,
                      one_shot: bool, history_window: int) -> dict:
  """The JSONL record of a finished episode (WORKSPACE.md)."""
  exact_tokens = history_window == 0
  return {
      "task_id": episode.task_id,
      "rollout": episode.rollout,
      "policy": policy,
      "instruction": (episode.goal or {}).get("instruction_text"),
      "steps": episode.steps,
      "num_steps": len(episode.steps),
      "final_reward": float(final_reward),
      "purchased": termination == "purchase",
      "success": termination == "purchase" and final_reward >= 1.0,
      "termination": termination,
      "reward_info": reward_info,
      "env": env_settings,
      "one_shot": one_shot,
      "history_window": history_window,
      "tokens": episode.tokens if exact_tokens else None,
      "action_mask": episode.action_mask if exact_tokens else None,
  }


def trajectory_conversation(record: dict) -> af.Conversation:
  """The conversation the agent saw (without history elision): prompt, then each step's turns."""
  prompt = af.prompt_messages(record["one_shot"])
  messages = list(prompt)
  for step in record["steps"]:
    messages += [af.user(step["observation"]), af.assistant(step["model_output"])]
  return af.Conversation(tuple(messages), len(prompt))


def summarize(records: Sequence[dict]) -> dict:
  """Mean reward x 100 ("score"), success (r == 1) and purchase rates in %, grounding accuracy
  (valid actions / all actions) in %, mean steps, and termination counts."""
  if not records:
    return {"episodes": 0}
  actions = [step["valid"] for r in records for step in r["steps"]]
  return {
      "episodes": len(records),
      "score": 100.0 * float(np.mean([r["final_reward"] for r in records])),
      "success_rate": 100.0 * float(np.mean([r["success"] for r in records])),
      "purchase_rate": 100.0 * float(np.mean([r["purchased"] for r in records])),
      "grounding": 100.0 * float(np.mean(actions)) if actions else 0.0,
      "mean_steps": float(np.mean([r["num_steps"] for r in records])),
      **{f"ended_{t}": sum(r["termination"] == t for r in records) for t in TERMINATIONS},
  }


def run_episodes(policy_sampler, params, pool: EnvBatch, tokenizer, tasks: Sequence[int], *,
                 samples_per_task: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 512, rng: jax.Array,
                 on_trajectory: Callable[[dict], None],
                 one_shot: bool = True, history_window: int = 0, policy: str = "",
                 env_settings: dict | None = None, show_progress: bool = True, share_prefix: bool = True) -> dict:
  """Runs `samples_per_task` episodes of each task (a goal index); returns `summarize` + throughput.

  `policy_sampler` is a `spa_jax.rollout.generate.Sampler` (or anything with its API); it and
  `pool` must have at least one slot each and use the first min(batch_size, num_envs) slots.
  With `share_prefix`, the prompt every episode starts with (`agent_format.prompt_messages`) is
  prefilled once for `params` and its keys/values copied into each row that starts from it.
  """
  num_slots = min(policy_sampler.batch_size, pool.num_envs)
  if num_slots < 1:
    raise ValueError("run_episodes needs a sampler batch_size >= 1 and a pool with >= 1 env")
  if samples_per_task < 1:
    raise ValueError(f"samples_per_task must be >= 1, got {samples_per_task}")
  queue = deque((int(task), k) for task in tasks for k in range(samples_per_task))
  total = len(queue)
  env_settings = dict(env_settings or {})
  slots: list[_Episode | None] = [None] * num_slots
  state = policy_sampler.init_state()
  records: list[dict] = []
  generated_tokens = 0
  started = time.time()
  bar = tracking.progress(total, "episodes", unit="ep", enabled=show_progress)

  def finish(slot: int, termination: str, reward: float = 0.0, reward_info: dict | None = None):
    record = trajectory_record(slots[slot], termination=termination, final_reward=reward,
                               reward_info=reward_info, policy=policy, env_settings=env_settings,
                               one_shot=one_shot, history_window=history_window)
    records.append(record)
    on_trajectory(record)
    slots[slot] = None
    elapsed = max(time.time() - started, 1e-9)
    bar.update(1)
    bar.set_postfix(ep_s=f"{len(records) / elapsed:.2f}", tok_s=f"{generated_tokens / elapsed:.0f}")

  lockstep = getattr(policy_sampler, "lockstep", False)
  resets: list[int] = []  # rows to empty before their next extend (windowed re-encoding)
  prefix, prefix_starts = None, 0
  if share_prefix:
    prefix = policy_sampler.prefill_prefix(params, tokenizer.encode_chat(af.prompt_messages(one_shot))[0])

  def start_from_prefix(state, emptied: list[int]):
    """Rows among `emptied` whose next tokens begin with the shared prefix take its keys/values."""
    nonlocal prefix_starts
    if prefix is None:
      return state
    size = len(prefix.tokens)
    starts = [s for s in emptied if tuple(slots[s].pending_ids[:size]) == prefix.tokens]
    state = policy_sampler.start_rows(state, starts, prefix)
    prefix_starts += len(starts)
    for s in starts:  # recorded as if extended: the tokens are the episode's, only their prefill is shared
      slots[s].tokens += slots[s].pending_ids[:size]
      slots[s].action_mask += [0] * size
      slots[s].pending_ids = slots[s].pending_ids[size:]
    return state

  def working() -> bool:
    local = bool(queue or any(slots))
    return policy_sampler.any_process(local) if lockstep else local

  while working():
    free = [s for s in range(num_slots) if slots[s] is None][:len(queue)]
    if free:
      work = [queue.popleft() for _ in free]
      observations, infos = pool.reset([task for task, _ in work], free)
      for slot, (task, k), observation, info in zip(free, work, observations, infos):
        conversation = af.start_conversation(observation, one_shot)
        ids, mask = tokenizer.encode_chat(list(af.windowed(conversation, history_window).messages),
                                          add_generation_prompt=True)
        slots[slot] = _Episode(task, k, conversation, ids, goal=info.get("goal"))
    emptied, resets = free + resets, []
    if emptied or lockstep:
      state = start_from_prefix(policy_sampler.reset_rows(state, emptied), emptied)

    rows = [s for s in range(num_slots) if slots[s] is not None]
    for slot in policy_sampler.overflowing_rows(state, rows, [slots[s].pending_ids for s in rows]):
      finish(slot, "context_limit")
    rows = [s for s in rows if slots[s] is not None]
    if not rows and not lockstep:
      continue
    state = policy_sampler.extend(params, state, rows, [slots[s].pending_ids for s in rows])
    for s in rows:
      new_ids = slots[s].pending_ids[slots[s].pending_recorded:]
      slots[s].tokens += new_ids
      slots[s].action_mask += [0] * len(new_ids)
      slots[s].pending_ids, slots[s].pending_recorded = [], 0

    rng, key = jax.random.split(rng)
    rows_mask = np.zeros(policy_sampler.batch_size, bool)
    rows_mask[rows] = True
    state, generation = policy_sampler.generate(
        params, state, rows_mask, rng=key, max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=top_p, stop=REACT_ACTION_LINE)
    generated_tokens += sum(len(generation.token_ids[s]) for s in rows)

    acting = []
    for s in rows:
      episode = slots[s]
      episode.tokens += generation.token_ids[s]
      episode.action_mask += [1] * len(generation.token_ids[s])
      if generation.finish_reasons[s] != "eos":  # close the turn as the chat format does
        episode.tokens.append(tokenizer.end_of_turn_id)
        episode.action_mask.append(1)
      if generation.finish_reasons[s] == "context_limit":
        finish(s, "context_limit")
      else:
        acting.append(s)
    if not acting:
      continue
    parsed = {s: af.parse_action(generation.texts[s]) for s in acting}
    actions: list[str | None] = [None] * pool.num_envs
    for s in acting:
      actions[s] = parsed[s][0] or NO_OP_ACTION
    results = pool.step(actions)
    for s in acting:
      observation, reward, terminated, truncated, info = results[s]
      episode = slots[s]
      action, error = parsed[s]
      output = generation.texts[s]
      episode.steps.append({
          "observation": episode.user_turn(), "model_output": output, "parsed_action": action,
          "parse_error": error, "valid": bool(action is not None and info.get("valid", False)),
          "reward": float(reward), "token_logprobs": generation.logprobs[s],
          "finish_reason": generation.finish_reasons[s]})
      if info.get("failed"):
        finish(s, "env_failed")
      elif terminated:
        finish(s, "purchase", reward, info.get("reward_info"))
      elif truncated:
        finish(s, "max_steps")
      else:
        next_user = af.observation_message(observation) if action is not None else af.INVALID_FORMAT_MESSAGE
        messages = episode.conversation.messages + (af.assistant(output), af.user(next_user))
        episode.conversation = dataclasses.replace(episode.conversation, messages=messages)
        if history_window:
          resets.append(s)
          episode.pending_ids, _ = tokenizer.encode_chat(
              list(af.windowed(episode.conversation, history_window).messages), add_generation_prompt=True)
        else:
          closing = [] if generation.finish_reasons[s] == "eos" else [tokenizer.end_of_turn_id]
          suffix, _ = tokenizer.encode_turn_suffix([af.user(next_user)], add_generation_prompt=True)
          episode.pending_ids, episode.pending_recorded = closing + suffix, len(closing)
  bar.close()
  elapsed = max(time.time() - started, 1e-9)
  return {**summarize(records), "generated_tokens": generated_tokens, "seconds": elapsed,
          "episodes_per_s": len(records) / elapsed, "tokens_per_s": generated_tokens / elapsed,
          "prefix_starts": prefix_starts, "prefix_tokens": len(prefix.tokens) if prefix else 0}


class ProcessRowsSampler:
  """This process's block of a global Sampler's rows: process k drives global rows
  [k * batch_size, (k + 1) * batch_size). Every call gathers all processes' requests, runs the
  global Sampler with identical inputs everywhere, and returns this process's part."""

  lockstep = True

  def __init__(self, sampler):
    count = distributed.process_count()
    if sampler.batch_size % count:
      raise ValueError(f"sampler batch_size {sampler.batch_size} does not split over {count} processes")
    self.sampler = sampler
    self.batch_size = sampler.batch_size // count
    self.offset = distributed.process_index() * self.batch_size

  @staticmethod
  def _gather(x: np.ndarray) -> np.ndarray:
    """[process_count, *x.shape]: every process's `x` (same shape everywhere)."""
    from jax.experimental import multihost_utils
    if distributed.process_count() == 1:
      return np.asarray(x)[None]
    return np.asarray(multihost_utils.process_allgather(np.asarray(x)))

  def _gather_rows(self, rows: Sequence[int]) -> list[int]:
    mask = np.zeros(self.batch_size, bool)
    mask[list(rows)] = True
    return np.flatnonzero(self._gather(mask).reshape(-1)).tolist()

  def any_process(self, flag: bool) -> bool:
    return bool(self._gather(np.array(flag)).any())

  def init_state(self):
    return self.sampler.init_state()

  def reset_rows(self, state, rows):
    return self.sampler.reset_rows(state, self._gather_rows(rows))

  def prefill_prefix(self, params, tokens):
    return self.sampler.prefill_prefix(params, tokens)  # the same prompt, hence the same prefix, everywhere

  def start_rows(self, state, rows, prefix):
    return self.sampler.start_rows(state, self._gather_rows(rows), prefix)

  def overflowing_rows(self, state, rows, token_lists, reserve: int = 1) -> list[int]:
    global_rows = [self.offset + r for r in rows]
    return [r - self.offset for r in self.sampler.overflowing_rows(state, global_rows, token_lists, reserve)]

  def extend(self, params, state, rows, token_lists):
    counts = np.zeros(self.batch_size, np.int64)
    for row, tokens in zip(rows, token_lists):
      counts[row] = len(tokens) + 1  # 0: row not extended
    all_counts = self._gather(counts).reshape(-1)
    width = max(int(all_counts.max(initial=0)) - 1, 0)
    padded = np.zeros((self.batch_size, width), np.int64)
    for row, tokens in zip(rows, token_lists):
      padded[row, :len(tokens)] = tokens
    all_tokens = self._gather(padded).reshape(-1, width)
    global_rows = np.flatnonzero(all_counts).tolist()
    return self.sampler.extend(params, state, global_rows,
                               [all_tokens[r, :all_counts[r] - 1].tolist() for r in global_rows])

  def generate(self, params, state, rows_mask, **kwargs):
    global_mask = self._gather(np.asarray(rows_mask, bool)).reshape(-1)
    state, out = self.sampler.generate(params, state, global_mask, **kwargs)
    block = slice(self.offset, self.offset + self.batch_size)
    return state, dataclasses.replace(out, token_ids=out.token_ids[block], logprobs=out.logprobs[block],
                                      texts=out.texts[block], finish_reasons=out.finish_reasons[block])
