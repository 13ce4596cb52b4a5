"""The ReAct conversation of ETO / SPA-RL on WebShop (spa-rl.md §3, webshop.md §10).

A conversation is a list of chat messages `{"role": "user"|"assistant", "content": str}`:
  0 user       the WebShop instruction (INSTRUCTION, verbatim)
  1 assistant  "OK"
  2..9         optional one-shot demonstration (4 observation/action exchanges, our own, on an
               invented product), the same shape as ETO's
  then per step: user "Observation:\n<page>" and assistant "Thought: ...\nAction: ...".
The messages before the first real observation are the *prompt*; only the assistant turns after
it are agent steps (the "OK" and demo turns are not, spa-rl.md §7.4).

History window: with `window = K > 0` every observation but the last K is replaced by a short
placeholder. That changes the prefix every turn, so a windowed episode re-encodes its whole
conversation each turn instead of extending its KV cache (episodes.py); `window = 0` keeps
everything and lets the cache grow turn by turn.
"""

import dataclasses
import json
import pathlib
import re
from typing import Sequence

from spa_jax.errors import InputFileError

INSTRUCTION = """You are web shopping.
I will give you instructions about what to do.
You have to follow the instructions.
Every round I will give you an observation and a list of available actions, you have to respond an action based on the state and instruction.
You can use search action if search is available.
You can click one of the buttons in clickables.
An action should be of the following structure:
search[keywords]
click[value]
If the action is not valid, perform nothing.
Keywords in search are up to you, but the value in click must be a value in the list of available actions.
Remember that your keywords in search should be carefully designed.
Your response should use the following format:

Thought: I think ...
Action: click[something]"""
ACKNOWLEDGEMENT = "OK"
OBSERVATION_PREFIX = "Observation:\n"
INVALID_FORMAT_MESSAGE = "Observation: Invalid format. The input must contains 'Action: '"
ELIDED_OBSERVATION = "Observation:\n(earlier page omitted)"

_DEMO_GOAL = ("i need a stainless steel insulated water bottle that holds 24 oz, "
              "and price lower than 30.00 dollars")
_DEMO_ITEM = ("Instruction: [SEP] " + _DEMO_GOAL + " [SEP] Back to Search [SEP] < Prev [SEP] size "
              "[SEP] 18 oz [SEP] 24 oz [SEP] 32 oz [SEP] Insulated Stainless Steel Water Bottle, "
              "Double Wall Vacuum, Leak Proof Lid [SEP] Price: $21.99 [SEP] Rating: N.A. [SEP] "
              "Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
DEMO_EXCHANGES = (
    ("WebShop [SEP] Instruction: [SEP] " + _DEMO_GOAL + " [SEP] Search",
     "Thought: I think I should search for an insulated stainless steel water bottle of 24 oz.\n"
     "Action: search[insulated stainless steel water bottle 24 oz]"),
    ("Instruction: [SEP] " + _DEMO_GOAL + " [SEP] Back to Search [SEP] Page 1 (Total results: 50) "
     "[SEP] Next > [SEP] B0D3M0W4T1 [SEP] Insulated Stainless Steel Water Bottle, Double Wall "
     "Vacuum, Leak Proof Lid [SEP] $21.99 [SEP] B0D3M0PL45 [SEP] Plastic Sports Water Bottle with "
     "Straw, 32 oz [SEP] $9.99 [SEP] B0D3M0GL77 [SEP] Glass Water Bottle with Silicone Sleeve "
     "[SEP] $34.50",
     "Thought: I think the first item is an insulated stainless steel bottle under 30 dollars; "
     "I should check it.\nAction: click[B0D3M0W4T1]"),
    (_DEMO_ITEM,
     "Thought: I think I should choose the 24 oz size.\nAction: click[24 oz]"),
    (_DEMO_ITEM,
     "Thought: I think the bottle has the right material and size and costs less than 30 dollars; "
     "I should buy it.\nAction: click[Buy Now]"),
)

_ACTION_MARKER = re.compile(r"action\s*:", re.IGNORECASE)
_ACTION_FORM = re.compile(r"^([A-Za-z_]+)\s*\[(.*)\]$", re.DOTALL)
_EDGE_JUNK = " \t\"'`*"
_TRAILING_PUNCTUATION = ".,;:!"
VERBS = ("search", "click")


def user(content: str) -> dict:
  return {"role": "user", "content": content}


def assistant(content: str) -> dict:
  return {"role": "assistant", "content": content}


def observation_message(observation: str) -> str:
  """The user turn that shows an environment observation."""
  return OBSERVATION_PREFIX + observation


def prompt_messages(one_shot: bool = True) -> list[dict]:
  """Instruction, "OK" and (with `one_shot`) the demonstration: everything before the first real step."""
  messages = [user(INSTRUCTION), assistant(ACKNOWLEDGEMENT)]
  if one_shot:
    for observation, reply in DEMO_EXCHANGES:
      messages += [user(observation_message(observation)), assistant(reply)]
  return messages


@dataclasses.dataclass(frozen=True)
class Conversation:
  """Chat messages; those from index `num_prompt_messages` on are the episode's own turns."""
  messages: tuple[dict, ...]
  num_prompt_messages: int

  def __post_init__(self):
    if not 0 <= self.num_prompt_messages <= len(self.messages):
      raise ValueError(f"num_prompt_messages={self.num_prompt_messages} outside 0..{len(self.messages)}")

  def step_indices(self) -> list[int]:
    """Message indices of the agent's steps (assistant turns after the prompt)."""
    return [i for i in range(self.num_prompt_messages, len(self.messages))
            if self.messages[i]["role"] == "assistant"]


def start_conversation(first_observation: str, one_shot: bool = True) -> Conversation:
  """The prompt followed by the task's first observation, ready for the first step."""
  prompt = prompt_messages(one_shot)
  return Conversation(tuple(prompt) + (user(observation_message(first_observation)),), len(prompt))


def windowed(conversation: Conversation, window: int) -> Conversation:
  """The conversation with all but the last `window` episode observations elided (0: unchanged)."""
  if window == 0:
    return conversation
  episode_user_turns = [i for i in range(conversation.num_prompt_messages, len(conversation.messages))
                        if conversation.messages[i]["role"] == "user"]
  elide = set(episode_user_turns[:-window])
  messages = tuple(user(ELIDED_OBSERVATION) if i in elide else m
                   for i, m in enumerate(conversation.messages))
  return dataclasses.replace(conversation, messages=messages)


def truncate_output(text: str) -> str:
  """The model output up to the end of its first `Action:` line (ETO cuts eval outputs there)."""
  match = _ACTION_MARKER.search(text)
  if match is None:
    return text.strip()
  line_end = text.find("\n", match.end())
  if line_end != -1 and not text[match.end():line_end].strip():  # "Action:\nclick[...]"
    line_end = text.find("\n", line_end + 1)
  return (text if line_end == -1 else text[:line_end]).strip()


def parse_action(text: str) -> tuple[str | None, str | None]:
  """(normalised action, None) from a model output, or (None, what was wrong).

  Takes the first non-empty line after the first `Action:` (any case), strips quotes, backticks,
  asterisks and trailing punctuation, lowercases the verb and accepts `search[...]` / `click[...]`
  with a non-empty argument: `Action: "Click[Buy Now]."` -> `click[Buy Now]`.
  """
  match = _ACTION_MARKER.search(text)
  if match is None:
    return None, "no 'Action:' in the output"
  lines = [line for line in text[match.end():].splitlines() if line.strip()]
  if not lines:
    return None, "nothing after 'Action:'"
  action = lines[0].strip(_EDGE_JUNK).rstrip(_TRAILING_PUNCTUATION).strip(_EDGE_JUNK)
  form = _ACTION_FORM.match(action) or _ACTION_FORM.match(action[:action.find("]") + 1])
  if form is None:
    return None, f"action {action!r} is not of the form search[...] or click[...]"
  verb, argument = form.group(1).lower(), form.group(2).strip()
  if verb not in VERBS:
    return None, f"unknown action verb {form.group(1)!r}; expected one of {VERBS}"
  if not argument:
    return None, f"action {action!r} has an empty argument"
  return f"{verb}[{argument}]", None


# --------------------------------------------------------------------------------------------
# Token ids + masks for training


@dataclasses.dataclass(frozen=True)
class SftExample:
  """One sequence per conversation.

  ids: token ids; loss_mask: 1 on every assistant turn's tokens incl. its end-of-turn
  (the SFT loss mask); step_mask: 1 on the agent steps' tokens only (prompt turns excluded);
  step_ends: index of each step's end-of-turn token, in step order.
  """
  ids: list[int]
  loss_mask: list[int]
  step_mask: list[int]
  step_ends: list[int]


def _runs(mask: Sequence[int]) -> list[tuple[int, int]]:
  """[start, end) of each run of ones."""
  runs, start = [], None
  for i, bit in enumerate([*mask, 0]):
    if bit and start is None:
      start = i
    elif not bit and start is not None:
      runs.append((start, i))
      start = None
  return runs


def build_sft_example(conversation: Conversation, tokenizer) -> SftExample:
  """Ids and masks from the tokenizer's chat encoding, checked turn by turn.

  Fails loudly (ValueError) unless there is one masked span per assistant turn, each decoding to
  the turn's text followed by the end-of-turn token (spa-rl.md §7.8).
  """
  return _checked_sft_example(conversation, *tokenizer.encode_chat(list(conversation.messages)), tokenizer)


def build_sft_examples(conversations: Sequence[Conversation], tokenizer) -> list[SftExample]:
  """`build_sft_example` of each conversation, encoded together (`Tokenizer.encode_chats`)."""
  encodings = tokenizer.encode_chats([list(c.messages) for c in conversations])
  return [_checked_sft_example(c, ids, mask, tokenizer) for c, (ids, mask) in zip(conversations, encodings)]


def _checked_sft_example(conversation: Conversation, ids: list[int], mask: list[int], tokenizer) -> SftExample:
  messages = list(conversation.messages)
  spans = _runs(mask)
  assistant_turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
  if not assistant_turns:
    raise ValueError("conversation has no assistant turn: nothing to train on")
  if len(spans) != len(assistant_turns):
    raise ValueError(f"tokenization mismatch: {len(spans)} masked spans for {len(assistant_turns)} "
                     "assistant turns")
  step_set = set(conversation.step_indices())
  step_mask = [0] * len(ids)
  step_ends = []
  for (start, end), turn in zip(spans, assistant_turns):
    content = messages[turn]["content"].strip()
    if ids[end - 1] != tokenizer.end_of_turn_id or tokenizer.decode(ids[start:end - 1]) != content:
      raise ValueError(f"tokenization mismatch in assistant turn {turn}: masked span decodes to "
                       f"{tokenizer.decode(ids[start:end])!r}, expected {content!r} + end-of-turn")
    if turn in step_set:
      step_mask[start:end] = [1] * (end - start)
      step_ends.append(end - 1)
  return SftExample(ids, mask, step_mask, step_ends)


# --------------------------------------------------------------------------------------------
# ETO / SPA-RL FastChat data

_FASTCHAT_ROLES = {"human": "user", "gpt": "assistant"}


def conversation_from_fastchat(record: dict) -> Conversation:
  """A FastChat record `{"id", "conversations": [{"from": "human"|"gpt", "value"}]}` as a Conversation.

  The prompt is the instruction turn and its "OK" acknowledgement (ETO's SFT data carry no demo).
  """
  record_id = record.get("id", "?")
  turns = record.get("conversations")
  if not isinstance(turns, list) or not turns:
    raise ValueError(f"FastChat record {record_id}: 'conversations' must be a non-empty list")
  messages = []
  for k, turn in enumerate(turns):
    role = _FASTCHAT_ROLES.get(turn.get("from"))
    if role is None:
      raise ValueError(f"FastChat record {record_id}, turn {k}: 'from' must be 'human' or 'gpt', "
                       f"got {turn.get('from')!r}")
    if role != ("user" if k % 2 == 0 else "assistant"):
      raise ValueError(f"FastChat record {record_id}, turn {k}: turns must alternate human, gpt, ...")
    messages.append({"role": role, "content": turn.get("value", "")})
  has_ack = len(messages) > 1 and messages[1]["content"].strip() == ACKNOWLEDGEMENT
  return Conversation(tuple(messages), 2 if has_ack else 1)


def read_fastchat_sft(path: str | pathlib.Path) -> list[Conversation]:
  """All conversations of an ETO/SPA-RL `webshop_sft.json` file."""
  try:
    with open(path) as f:
      records = json.load(f)
  except ValueError as error:
    raise InputFileError(f"{path} is not valid JSON ({error}): the SFT data file is empty, truncated or damaged; "
                         "download webshop_sft.json again or pass --config.sft.data=expert") from None
  if not isinstance(records, list):
    raise InputFileError(f"{path}: expected a JSON list of FastChat records")
  return [conversation_from_fastchat(record) for record in records]
