"""SFT stage: expert data and masks, length-bucketed batches, and exact resume after SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import MICRO, as_flags
from spa_jax import configuration
from spa_jax.rollout import agent_format as af
from spa_jax.stages import common, sft
from spa_jax.training import steps
from spa_jax.training.batch import bucketed_length
from spa_jax.workspace import Workspace

REPO = configuration.CONFIGS_DIR.parent


def test_sft_train_split_picks_the_demonstration_goals_apart_from_the_rl_goals(micro_config):
  shared = micro_config("sft", {"env.train_split": "train[2:]"})  # exploration and PPO: from goal 2 on
  apart = micro_config("sft", {"env.train_split": "train[2:]", "sft.train_split": "train[:2]"})
  first_two = micro_config("sft", {"sft.expert_episodes": 2})
  instructions = lambda cfg: [c.messages[len(af.prompt_messages(cfg.agent.one_shot))]["content"]
                              for c in sft.expert_conversations(cfg)]
  assert instructions(apart) == instructions(first_two)
  assert not set(instructions(apart)) & set(instructions(shared))


def test_expert_recovery_adds_demonstrations_that_go_back(micro_config):
  went_back = lambda cfg: [any(m["content"].endswith("Action: click[< Prev]") for m in c.messages)
                           for c in sft.expert_conversations(cfg)]
  plain = went_back(micro_config("sft", {"sft.expert_episodes": 24}))
  recovering = went_back(micro_config("sft", {"sft.expert_episodes": 24, "sft.expert_recovery": 1.0}))
  assert len(plain) == len(recovering) and not any(plain) and sum(recovering) >= 4


def test_expert_examples_train_on_the_agent_steps_only(micro_config):
  cfg = micro_config("sft")
  tokenizer = common.load_tokenizer(cfg, Workspace(cfg.workspace))
  examples, dropped = sft.load_examples(cfg, tokenizer)
  assert len(examples) == 4 and dropped == 0
  prompt_len = len(tokenizer.encode_chat(af.prompt_messages(cfg.agent.one_shot))[0])
  for example in examples:
    assert not any(example.step_mask[:prompt_len])  # instruction and "OK" carry no loss
    text = tokenizer.decode([t for t, m in zip(example.ids, example.step_mask) if m])
    assert text.startswith("Thought: ") and "Action: search[" in text and "Action: click[Buy Now]" in text
    assert len(example.step_ends) >= 3  # search, click product, ..., buy


def test_model_vocabulary_follows_the_tokenizer_unless_set_larger(micro_config):
  """model.arch.vocab_size: unset, the SentencePiece tokenizer's; larger, e.g. Llama-3's for speed
  benchmarks (ids past the tokenizer's stay unused); smaller than the tokenizer's, an error."""
  cfg = micro_config("sft")
  tokenizer = common.load_tokenizer(cfg, Workspace(cfg.workspace))
  assert common.model_config(cfg, tokenizer).vocab_size == tokenizer.vocab_size
  cfg.model.arch.vocab_size = 128_256
  assert common.model_config(cfg, tokenizer).vocab_size == 128_256
  cfg.model.arch.vocab_size = tokenizer.vocab_size - 1
  with pytest.raises(ValueError, match="smaller than the tokenizer's"):
    common.model_config(cfg, tokenizer)


def test_dataset_without_agent_steps_is_an_error(micro_config, tmp_path):
  path = tmp_path / "webshop_sft.json"
  path.write_text(json.dumps([{"id": "0", "conversations": [
      {"from": "human", "value": af.INSTRUCTION}, {"from": "gpt", "value": "OK"}]}]))
  cfg = micro_config("sft", {"sft.data": str(path)})
  tokenizer = common.load_tokenizer(cfg, Workspace(cfg.workspace))
  with pytest.raises(ValueError, match="no agent"):
    sft.load_examples(cfg, tokenizer)
  with pytest.raises(ValueError, match="no agent"):  # built in the stage's data thread, raised by the stage
    sft.run(cfg, Workspace(cfg.workspace))


def test_epoch_batches_cover_every_example_once_grouped_by_length():
  lengths = [100, 600, 1100, 90, 700, 1500, 400, 2000, 30]
  batches = sft.epoch_batches(lengths, batch_size=2, max_len=2048, length_bucket=256, seed=0, epoch=0)
  assert sorted(i for _, rows in batches for i in rows) == list(range(len(lengths)))
  for seq_len, rows in batches:
    assert all(lengths[i] <= seq_len and seq_len % 256 == 0 for i in rows)
  buckets = [{bucketed_length(lengths[i], 256, 2048) for i in rows} for _, rows in batches]
  assert sum(len(b) > 1 for b in buckets) <= 3  # only the leftovers of a bucket mix lengths
  assert batches == sft.epoch_batches(lengths, batch_size=2, max_len=2048, length_bucket=256, seed=0, epoch=0)
  assert batches != sft.epoch_batches(lengths, batch_size=2, max_len=2048, length_bucket=256, seed=0, epoch=1)
  coarse = sft.epoch_batches(lengths, batch_size=2, max_len=2048, length_bucket=1024, seed=0, epoch=0)
  assert {seq_len for seq_len, _ in coarse} == {1024, 2048}  # fewer compiled shapes than 256-token buckets
  assert len({seq_len for seq_len, _ in batches}) > 2


def test_epoch_batches_pad_to_the_fitted_lengths_when_given():
  lengths = [100, 700, 90, 650, 400, 1000]
  batches = sft.epoch_batches(lengths, batch_size=2, max_len=2048, length_bucket=256, seed=0, epoch=0,
                              padded_lengths=[128, 1024])
  assert sorted(i for _, rows in batches for i in rows) == list(range(6))
  assert {seq_len for seq_len, _ in batches} <= {128, 1024}
  assert all(seq_len >= max(lengths[i] for i in rows) for seq_len, rows in batches)
  assert any(seq_len == 128 and sorted(rows) == [0, 2] for seq_len, rows in batches)  # the two short ones


def test_batch_mask_weighs_agent_tokens_one_context_tokens_by_weight_and_padding_zero():
  short = af.SftExample(ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], step_mask=[0, 0, 1, 1], step_ends=[3])
  long = af.SftExample(ids=[5, 6, 7, 8, 9, 10], loss_mask=[0, 1, 1, 0, 1, 1], step_mask=[0, 0, 0, 0, 1, 1],
                       step_ends=[5])
  batch = sft.sft_batch([short, long], rows=[1, 0], seq_len=8, batch_size=3, pad_id=0, context_weight=0.25)
  np.testing.assert_array_equal(batch["loss_mask_bt"], [
      [0.25, 0.25, 0.25, 0.25, 1, 1, 0, 0],
      [0.25, 0.25, 1, 1, 0, 0, 0, 0],
      [0, 0, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch["tokens_bt"][:2], [[5, 6, 7, 8, 9, 10, 0, 0], [5, 6, 7, 8, 0, 0, 0, 0]])
  agent_only = sft.sft_batch([short, long], rows=[1, 0], seq_len=8, batch_size=3, pad_id=0)
  np.testing.assert_array_equal(agent_only["loss_mask_bt"][0], long.step_mask + [0, 0])  # the paper's SFT


class _LowerOnlyStep:
  """A jitted step that may be lowered (compiled ahead) but not called: a call would compile mid-loop."""

  def __init__(self, jitted):
    self._jitted, self.lowered_lengths = jitted, []

  def lower(self, state, batch):
    self.lowered_lengths.append(batch["tokens_bt"].shape[1])
    return self._jitted.lower(state, batch)

  def __call__(self, *args):
    raise AssertionError("the SFT loop called the jitted step instead of its compiled executables")


def test_sft_compiles_each_padded_length_once_before_the_loop(micro_config, monkeypatch):
  cfg = micro_config("sft", {"sft.batch_size": 8, "sft.micro_batch_size": 4, "sft.expert_episodes": 16,
                             "sft.length_bucket": 64})
  made = []

  def make_lower_only_step(*args, **kwargs):
    made.append(_LowerOnlyStep(steps.make_sft_step(*args, **kwargs)))
    return made[-1]

  monkeypatch.setattr(sft, "make_sft_step", make_lower_only_step)
  summary = sft.run(cfg, Workspace(cfg.workspace))
  assert len(summary["padded_lengths"]) == 2, summary["padded_lengths"]  # the point of the test
  assert sorted(made[0].lowered_lengths) == summary["padded_lengths"]
  assert summary["steps"] == 2 and np.isfinite(summary["final_loss"])
  # sft.max_padded_lengths=1: one length fitted to the data (the longest, in length_bucket multiples), one compile
  cfg.sft.max_padded_lengths = 1
  made.clear()
  one = sft.run(cfg, Workspace(cfg.workspace))
  assert one["padded_lengths"] == [max(summary["padded_lengths"])] and made[0].lowered_lengths == one["padded_lengths"]


RESUME = {key: value for key, value in MICRO.items() if key.split(".")[0] not in ("explore", "eval")}
RESUME |= {"sft.expert_episodes": 8, "sft.epochs": 2}


def _sft_command(workdir):
  return [sys.executable, "-m", "spa_jax.main", "--config=configs/sft.py", f"--workdir={workdir}",
          *as_flags(RESUME)]


def _policy(workdir):
  return load_file(str(workdir / "policies" / "sft" / "model.safetensors"))


@pytest.mark.slow
def test_sft_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  straight, killed = tmp_path / "straight", tmp_path / "killed"
  subprocess.run(_sft_command(straight), cwd=REPO, env=env, check=True, capture_output=True, timeout=600)

  process = subprocess.Popen(_sft_command(killed), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  checkpoints = killed / "checkpoints" / "sft"
  deadline = time.time() + 600
  while not any(checkpoints.glob("*/1")) and process.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  os.kill(process.pid, signal.SIGKILL)
  process.wait()
  assert Workspace(killed).done_record("sft") is None, "the run finished before it could be killed"
  subprocess.run(_sft_command(killed), cwd=REPO, env=env, check=True, capture_output=True, timeout=600)

  summary = Workspace(killed).done_record("sft")["summary"]
  reference = Workspace(straight).done_record("sft")["summary"]
  assert summary["resumed"] and not reference["resumed"] and summary["steps"] == reference["steps"] == 8
  assert summary["final_loss"] == pytest.approx(reference["final_loss"], abs=1e-6)
  resumed_params, straight_params = _policy(killed), _policy(straight)
  assert resumed_params.keys() == straight_params.keys()
  for name, value in straight_params.items():
    np.testing.assert_allclose(resumed_params[name], value, rtol=0, atol=1e-6, err_msg=name)



@pytest.mark.slow
def test_lora_sft_changes_only_the_adapted_projections(micro_config):
  cfg = micro_config("sft", {"sft.finetune": "lora", "sft.expert_episodes": 2, "model.lora.targets": "q_proj,v_proj"})
  ws = Workspace(cfg.workspace)
  summary = sft.run(cfg, ws)
  assert summary["steps"] == 1 and not summary["resumed"]
  # where the time went: tokenizer, demonstrations and devices side by side, train state, compiling, steps
  phases = ("tokenizer", "setup", "data", "devices", "init", "compile", "train")
  assert all(summary[f"time_{phase}_s"] > 0 for phase in phases)
  assert summary["time_setup_s"] >= max(summary["time_data_s"], summary["time_devices_s"])  # waits for both
  assert len(summary["padded_lengths"]) == 1 and summary["padded_lengths"][0] % cfg.sft.length_bucket == 0
  tokenizer = common.load_tokenizer(cfg, ws)
  initial_cfg, initial = common.init_policy(cfg, tokenizer, common.make_mesh(cfg))
  common.save_policy(ws, "untrained_copy", initial, initial_cfg)
  before, after = _tensors(ws, "untrained_copy"), _tensors(ws, "sft")
  assert before.keys() == after.keys()
  changed = {name for name in before if not np.array_equal(before[name], after[name])}
  assert changed and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in changed)


def _tensors(ws, policy):
  return load_file(str(common.policy_dir(ws, policy) / "model.safetensors"))
