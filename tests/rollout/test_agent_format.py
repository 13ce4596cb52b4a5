"""ReAct agent format: prompt layout, action parsing, history window, SFT ids/masks, FastChat reader."""

import json

import pytest

from spa_jax.models.tokenizer import SentencePieceTokenizer
from spa_jax.rollout import agent_format as af

FIRST_OBS = "WebShop [SEP] Instruction: [SEP] i want red running shoes, price lower than 40.00 dollars [SEP] Search"
STEPS = [
    ("Thought: I think I should search.\nAction: search[red running shoes]",
     "Instruction: [SEP] i want red running shoes [SEP] Back to Search [SEP] Page 1 (Total results: 3) "
     "[SEP] Next > [SEP] B0RED00001 [SEP] Red Running Shoe [SEP] $19.99"),
    ("Thought: The first one fits.\nAction: click[B0RED00001]", "Instruction: [SEP] ... [SEP] Buy Now"),
    ("Thought: Buy it.\nAction: click[Buy Now]", None),
]


def episode_conversation(one_shot=True):
  conversation = af.start_conversation(FIRST_OBS, one_shot=one_shot)
  messages = list(conversation.messages)
  for reply, next_obs in STEPS:
    messages.append(af.assistant(reply))
    if next_obs is not None:
      messages.append(af.user(af.observation_message(next_obs)))
  return af.Conversation(tuple(messages), conversation.num_prompt_messages)


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
  texts = [m["content"] for m in episode_conversation().messages]
  return SentencePieceTokenizer.train_or_load(texts, tmp_path_factory.mktemp("spm"), vocab_size=600)


def test_prompt_has_the_eto_layout():
  messages = af.prompt_messages(one_shot=True)
  assert len(messages) == 10 and messages[0]["content"] == af.INSTRUCTION and messages[1]["content"] == "OK"
  assert af.INSTRUCTION.startswith("You are web shopping.\n") and af.INSTRUCTION.endswith("Action: click[something]")
  assert [m["role"] for m in messages] == ["user", "assistant"] * 5
  for demo_user, demo_reply in zip(messages[2::2], messages[3::2]):
    assert demo_user["content"].startswith("Observation:\n")
    action, error = af.parse_action(demo_reply["content"])
    assert error is None and demo_reply["content"].startswith("Thought: ")
  assert len(af.prompt_messages(one_shot=False)) == 2


def test_only_episode_assistant_turns_are_steps():
  conversation = episode_conversation()
  steps = conversation.step_indices()
  assert len(steps) == 3 and min(steps) > conversation.num_prompt_messages
  assert [conversation.messages[i]["content"] for i in steps] == [reply for reply, _ in STEPS]


@pytest.mark.parametrize("output, action", [
    ("Thought: I think so.\nAction: search[red shoes]", "search[red shoes]"),
    ("Thought: x\nAction: click[Buy Now]\nObservation: made up", "click[Buy Now]"),
    ("Thought: x\naction:  Click[B0RED00001].", "click[B0RED00001]"),
    ('Action: "search[blue mug 12 oz]"', "search[blue mug 12 oz]"),
    ("Action: `click[< Prev]`", "click[< Prev]"),
    ("Action:\nSEARCH [red shoes]", "search[red shoes]"),
    ("Thought: x\nAction: click[8] and then buy", "click[8]"),
    ("Action: click[x]\nAction: click[y]", "click[x]"),
])
def test_parse_action_tolerates_model_output(output, action):
  assert af.parse_action(output) == (action, None)


@pytest.mark.parametrize("output, error", [
    ("Thought: I will search for red shoes.", "no 'Action:'"),
    ("Thought: x\nAction:   \n", "nothing after 'Action:'"),
    ("Action: buy the shoes", "not of the form"),
    ("Action: purchase[shoes]", "unknown action verb 'purchase'"),
    ("Action: search[  ]", "empty argument"),
])
def test_parse_action_reports_what_it_could_not_parse(output, error):
  action, message = af.parse_action(output)
  assert action is None and error in message


def test_truncate_output_cuts_after_the_action_line():
  assert af.truncate_output("Thought: a\nAction: click[x]\nObservation: fake\nThought: b") == "Thought: a\nAction: click[x]"
  assert af.truncate_output("Thought: a\nAction:\nclick[x]\nmore") == "Thought: a\nAction:\nclick[x]"
  assert af.truncate_output("  no action here \n") == "no action here"


def test_history_window_elides_all_but_the_last_observations():
  conversation = episode_conversation()
  kept = af.windowed(conversation, 1)
  episode_users = [m["content"] for m in kept.messages[kept.num_prompt_messages:] if m["role"] == "user"]
  assert episode_users[:-1] == [af.ELIDED_OBSERVATION] * 2
  assert episode_users[-1] == af.observation_message(STEPS[1][1])
  assert kept.messages[:kept.num_prompt_messages] == conversation.messages[:conversation.num_prompt_messages]
  assert af.windowed(conversation, 0) is conversation
  assert af.windowed(conversation, 10) == conversation


def test_sft_example_masks_exactly_the_assistant_turns(spm):
  conversation = episode_conversation()
  example = af.build_sft_example(conversation, spm)
  assert len(example.ids) == len(example.loss_mask) == len(example.step_mask)
  assert len(example.step_ends) == 3
  for end, (reply, _) in zip(example.step_ends, STEPS):
    assert example.ids[end] == spm.end_of_turn_id and example.step_mask[end] == 1
  step_text = spm.decode([t for t, m in zip(example.ids, example.step_mask) if m and t != spm.end_of_turn_id])
  assert step_text == "".join(reply for reply, _ in STEPS)
  assert all(s <= m for s, m in zip(example.step_mask, example.loss_mask))
  assert sum(example.loss_mask) > sum(example.step_mask)  # "OK" and demo replies are trained, not steps


class ManglingTokenizer:
  """Wraps a tokenizer but drops the last token of the first assistant turn: a mask bug."""

  def __init__(self, inner):
    self.inner, self.end_of_turn_id, self.decode = inner, inner.end_of_turn_id, inner.decode

  def encode_chat(self, messages):
    ids, mask = self.inner.encode_chat(messages)
    first = mask.index(1)
    mask[first] = 0
    return ids, mask


def test_sft_example_fails_loudly_on_mask_mismatch(spm):
  with pytest.raises(ValueError, match="tokenization mismatch"):
    af.build_sft_example(episode_conversation(), ManglingTokenizer(spm))
  no_reply = af.Conversation((af.user("hello"),), 1)
  with pytest.raises(ValueError, match="no assistant turn"):
    af.build_sft_example(no_reply, spm)


def test_fastchat_reader(tmp_path):
  conversation = episode_conversation(one_shot=False)
  to_from = {"user": "human", "assistant": "gpt"}
  record = {"id": 7, "conversations": [{"from": to_from[m["role"]], "value": m["content"]}
                                       for m in conversation.messages]}
  path = tmp_path / "webshop_sft.json"
  path.write_text(json.dumps([record]))
  [read] = af.read_fastchat_sft(path)
  assert read == conversation
  record["conversations"][1]["from"] = "bot"
  with pytest.raises(ValueError, match="record 7, turn 1: 'from' must be"):
    af.conversation_from_fastchat(record)
  for broken in ("", json.dumps([record])[:40]):  # empty, truncated
    path.write_text(broken)
    with pytest.raises(ValueError, match=f"^{path} is not valid JSON .* pass --config.sft.data=expert$"):
      af.read_fastchat_sft(path)
