"""Config files: every stage config loads and validates; mistakes fail before any work, naming the field."""

import json
import os
import subprocess
import sys

import pytest

from spa_jax import configuration

REPO = configuration.CONFIGS_DIR.parent


@pytest.mark.parametrize("stage", configuration.STAGES)
def test_every_stage_config_contains_its_whole_chain_and_validates(stage):
  cfg = configuration.validate(configuration.load_config(stage))
  assert stage in configuration.split_names(cfg.run.targets)
  for section in configuration.REQUIRED_SECTIONS.get(stage, ()):
    assert section in cfg


def test_real_preset_requires_weights_and_data_paths():
  cfg = configuration.load_config("ppo", "llama3.2-3b")
  with pytest.raises(ValueError) as error:
    configuration.validate(cfg)
  assert "model.hf_path is required" in str(error.value)
  assert "env.data_dir is required" in str(error.value)


def test_real_preset_carries_the_released_hyperparameters():
  cfg = configuration.load_config("eval", "llama3.2-3b")
  assert (cfg.sft.learning_rate, cfg.sft.epochs, cfg.sft.batch_size) == (2e-5, 3, 16)
  assert (cfg.explore.samples_per_task, cfg.explore.temperature, cfg.explore.max_new_tokens) == (5, 1.0, 512)
  assert (cfg.prm.learning_rate, cfg.prm.weight_decay) == (3e-6, 0.01)
  assert (cfg.model.lora.rank, cfg.model.lora.alpha, cfg.model.lora.targets) == (8, 16.0, "q_proj,v_proj")
  assert (cfg.ppo.learning_rate, cfg.ppo.ppo_epochs, cfg.ppo.gamma, cfg.ppo.gae_lambda) == (1e-5, 4, 0.99, 0.95)
  assert (cfg.eval.temperature, cfg.env.max_steps) == (0.0, 10)


def test_unknown_preset_is_rejected():
  with pytest.raises(ValueError, match="Unknown config preset 'llama9'"):
    configuration.load_config("sft", "llama9")


@pytest.mark.parametrize("path, value, message", [
    ("run.targets", "sft,evl", "unknown stage name(s) ['evl']"),
    ("env.catalogue", "embeded", "config.env.catalogue='embeded': must be one of"),
    ("env.max_steps", 0, "config.env.max_steps=0: must be >= 1"),
    ("eval.top_p", 1.5, "config.eval.top_p=1.5: must be in (0, 1]"),
    ("eval.policies", "sft,dpo", "unknown policy name(s) ['dpo']"),
    ("eval.policies", "sft,ppo_grounding_only", "unknown policy name(s) ['ppo_grounding_only']"),
    ("ppo.reward_modes", "spa,dense", "config.ppo.reward_modes='spa,dense': must name one or more of"),
    ("sft.checkpoint_every", 0, "config.sft.checkpoint_every=0: must be >= 1"),
    ("sft.batch_size", 10, "positive multiple of sft.micro_batch_size"),
    ("sft.data", "/no/such/webshop_sft.json", "does not exist"),
    ("env.eval_split", "paper_test", "must be one of ('train', 'test', 'all') for env.catalogue='embedded'"),
    ("env.train_split", "file:/no/such/indices.json", "the indices file does not exist"),
    ("env.train_split", "train[::0]", "config.env.train_split: split 'train[::0]': the part in brackets must be"),
    ("sft.train_split", "paper_train[:100]", "config.sft.train_split='paper_train[:100]': must be one of"),
    ("env.search_backend", "lucene", "config.env.search_backend='lucene': must be one of ('', 'pyserini', 'bm25')"),
    ("seed", -1, "config.seed=-1: must be >= 0"),
    ("model.lora.targets", "q_proj,qkv", "config.model.lora.targets='q_proj,qkv': must be comma-separated names"),
    ("model.lora.targets", "q_proj, v_proj", "config.model.lora.targets='q_proj, v_proj': must be comma-separated"),
    ("model.remat_policy", "some", "config.model.remat_policy='some': must be one of ('none', 'full', 'dots', 'dots_no_batch')"),
    ("model.decode_attention", "flash", "config.model.decode_attention='flash': must be one of ('dense', 'ragged')"),
    ("sft.context_loss_weight", -0.5, "config.sft.context_loss_weight=-0.5: must be >= 0.0"),
    ("sft.schedule", "cosin", "config.sft.schedule='cosin': must be one of ('cosine', 'constant')"),
    ("sft.length_bucket", 0, "config.sft.length_bucket=0: must be >= 1"),
    ("prm.dtype", "fp8", "config.prm.dtype='fp8': must be one of ('', 'float32', 'bfloat16', 'float16')"),
    ("prm.length_bucket", 0, "config.prm.length_bucket=0: must be >= 1"),
    ("prm.checkpoint_every", 0, "config.prm.checkpoint_every=0: must be >= 1"),
    ("ppo.mode", "replay", "config.ppo.mode='replay': must be one of ('online', 'offline')"),
    ("ppo.critic_init", "value", "config.ppo.critic_init='value': must be one of ('sft', 'prm')"),
    ("ppo.samples_per_task", 0, "config.ppo.samples_per_task=0: must be >= 1"),
    ("ppo.samples_per_task", 5, "config.ppo.rollouts_per_iteration=12: must be a multiple of ppo.samples_per_task=5"),
    ("ppo.rollouts_per_iteration", 16, "config.ppo.rollouts_per_iteration=16: must be a multiple of "
                                       "ppo.mini_batch_size * ppo.grad_accum = 6"),
    ("ppo.length_bucket", 0, "config.ppo.length_bucket=0: must be >= 1"),
    ("ppo.checkpoint_every", 0, "config.ppo.checkpoint_every=0: must be >= 1"),
    ("ppo.kl.estimator", "k2", "config.ppo.kl.estimator='k2': must be one of ('kl', 'k3')"),
    ("model.arch.vocab_size", 0, "config.model.arch.vocab_size=0: must be None (the preset's) or >= 1"),
    ("ppo.time_budget_s", 0.0, "config.ppo.time_budget_s=0.0: must be > 0 seconds"),
    ("ppo.seed", -2, "config.ppo.seed=-2: must be >= 0"),
    ("ppo.eval_every", -1, "config.ppo.eval_every=-1: must be >= 0 iterations"),
    ("ppo.eval_tasks", 0, "config.ppo.eval_tasks=0: must be > 0 goals"),
    ("ppo.critic_warmup", 2, "config.ppo.critic_warmup=2: must be >= 0 and below ppo.iterations=2"),
    ("ppo.warmup_updates", -1, "config.ppo.warmup_updates=-1: must be >= 0"),
    ("sft.expert_recovery", 1.5, "config.sft.expert_recovery=1.5: must be in [0, 1]"),
    ("sft.epochs", 0, "config.sft.epochs=0: must be >= 1"),
    ("sft.max_padded_lengths", -1, "config.sft.max_padded_lengths=-1: must be >= 0"),
    ("prm.epochs", -1, "config.prm.epochs=-1: must be >= 1, or 0 with prm.head_init=probe"),
    ("prm.validation_fraction", 1.0, "config.prm.validation_fraction=1.0: must be in [0, 1)"),
    ("label.grounding_form", "none", "config.label.grounding_form='none': must be one of ('bonus', 'penalty')"),
])
def test_bad_values_are_named(path, value, message):
  cfg = configuration.load_config("eval")
  cfg.update_from_flattened_dict({path: value})
  with pytest.raises(ValueError) as error:
    configuration.validate(cfg)
  assert message in str(error.value)


def test_no_estimator_epochs_needs_the_probed_head():
  cfg = configuration.load_config("eval")
  cfg.update_from_flattened_dict({"prm.epochs": 0, "prm.head_init": "zero"})
  with pytest.raises(ValueError, match=r"config.prm.epochs=0: must be >= 1, or 0 with prm.head_init=probe"):
    configuration.validate(cfg)
  cfg.prm.head_init = "probe"
  configuration.validate(cfg)


def test_ragged_decode_attention_needs_a_kv_cache_its_kernel_can_tile():
  cfg = configuration.load_config("eval")
  cfg.update_from_flattened_dict({"model.decode_attention": "ragged", "agent.max_context": 2040})
  with pytest.raises(ValueError, match=r"config.agent.max_context=2040: must be a multiple of 16 with "
                                       r"model.decode_attention='ragged'"):
    configuration.validate(cfg)
  cfg.agent.max_context = 2048
  configuration.validate(cfg)


def test_offline_ppo_needs_held_out_trajectories():
  cfg = configuration.load_config("ppo")
  cfg.ppo.mode = "offline"
  configuration.validate(cfg)
  cfg.prm.holdout_fraction = 0.0
  with pytest.raises(ValueError, match=r"ppo.mode='offline' .* set config.prm.holdout_fraction > 0"):
    configuration.validate(cfg)


def test_choice_lists_equal_the_modules_they_copy():
  from spa_jax.models.config import DECODE_ATTENTION_IMPLS, REMAT_POLICIES
  from spa_jax.models.decode_attention import SLOT_MULTIPLE
  from spa_jax.models.lora import ALL_TARGETS
  from spa_jax.training.kl import KL_ESTIMATORS
  from spa_jax.training.rewards import GROUNDING_FORMS, REWARD_MODES
  assert configuration.LORA_TARGETS == ALL_TARGETS
  assert configuration.KL_ESTIMATORS == KL_ESTIMATORS
  assert configuration.REMAT_POLICIES == REMAT_POLICIES
  assert configuration.DECODE_ATTENTION_IMPLS == DECODE_ATTENTION_IMPLS
  assert configuration.RAGGED_SLOT_MULTIPLE == SLOT_MULTIPLE
  assert configuration.REWARD_MODES == REWARD_MODES
  assert configuration.GROUNDING_FORMS == tuple(GROUNDING_FORMS)


def test_target_outside_the_config_chain_names_the_config_to_use():
  cfg = configuration.load_config("sft")
  cfg.run.targets = "ppo"
  with pytest.raises(ValueError, match=r"use --config=configs/ppo.py"):
    configuration.validate(cfg)


def _main(*args, workdir):
  return subprocess.run([sys.executable, "-m", "spa_jax.main", f"--workdir={workdir}", *args],
                        cwd=REPO, capture_output=True, text=True, timeout=120,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})


@pytest.mark.parametrize("args, message", [
    (["--config.sft.learning_rat=3"], 'Did you mean "learning_rate"'),
    (["--config.run.targets=sft,evl"], "unknown stage name(s) ['evl']"),
    (["--config=configs/ppo.py:llama3.2-3b", "--config.run.targets=sft"], "model.hf_path is required"),
])
def test_main_rejects_bad_config_before_any_work(tmp_path, args, message):
  result = _main(*args, workdir=tmp_path / "run")
  assert result.returncode != 0
  assert message in result.stderr + result.stdout
  assert not (tmp_path / "run").exists()


def test_tpu_preset_shards_llama_3b_fsdp_over_the_whole_slice():
  cfg = configuration.load_config("ppo", "llama3.2-3b-tpu")
  assert cfg.model.preset == "llama3.2-3b" and cfg.preset == "llama3.2-3b-tpu"
  assert (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor) == (1, -1, 1)
  with pytest.raises(ValueError, match="model.hf_path is required"):
    configuration.validate(cfg)


def test_policy_names_follow_the_reward_modes():
  cfg = configuration.load_config("eval")
  assert configuration.policy_names(cfg) == ("untrained", "sft", "ppo_sparse", "ppo_spa")
  assert [configuration.policy_stage(p) for p in configuration.policy_names(cfg)] == [None, "sft", "ppo", "ppo"]
  with pytest.raises(ValueError, match="Unknown policy 'ppo'"):
    configuration.policy_stage("ppo")


def test_broken_input_paths_are_named_with_the_fix_before_any_work(tmp_path):
  cfg = configuration.load_config("eval")
  empty = tmp_path / "webshop_sft.json"
  empty.write_text("")
  not_hf = tmp_path / "weights"
  not_hf.mkdir()
  cfg.sft.data, cfg.model.hf_path = str(empty), str(not_hf)
  cfg.ppo.reward_modes = "spa"
  cfg.eval.policies = "untrained,sft,ppo_sparse,ppo_spa"
  with pytest.raises(ValueError) as error:
    configuration.validate(cfg)
  assert f"config.sft.data='{empty}' is an empty file" in str(error.value)
  assert f"config.model.hf_path='{not_hf}' has no config.json" in str(error.value)
  assert "unknown policy name(s) ['ppo_sparse']" in str(error.value)
  assert "pass e.g. --config.eval.policies=untrained,sft,ppo_spa" in str(error.value)


def test_default_eval_policies_follow_the_reward_modes():
  cfg = configuration.load_config("eval")
  cfg.ppo.reward_modes = "spa"  # alone: the default eval.policies ("untrained,sft,ppo_*") follows
  configuration.validate(cfg)
  assert configuration.eval_policies(cfg) == ["untrained", "sft", "ppo_spa"]
  cfg.ppo.reward_modes = "grounding_only,sparse"
  assert configuration.eval_policies(cfg) == ["untrained", "sft", "ppo_grounding_only", "ppo_sparse"]
  assert configuration.eval_policies(configuration.load_config("eval", "smollm2-135m")) == [
      "sft", "ppo_sparse", "ppo_spa"]


def test_workspace_config_gives_fields_added_since_their_defaults(tmp_path):
  saved = configuration.load_config("eval").to_dict()
  del saved["label"]["grounding_form"], saved["prm"]["validation_fraction"]  # a workspace from before them
  saved["prm"]["learning_rate"] = 2e-5
  (tmp_path / "config.json").write_text(json.dumps(saved))
  cfg = configuration.workspace_config(tmp_path)
  assert cfg.label.grounding_form == "bonus" and cfg.prm.validation_fraction == 0.2  # the tiny defaults
  assert cfg.prm.learning_rate == 2e-5 and cfg.preset == "tiny"  # what the workspace ran with
