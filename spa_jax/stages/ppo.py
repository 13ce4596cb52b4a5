"""PPO stage: step-level PPO from the SFT policy, one run per reward mode (spa-rl.md §1, §4, §7).

Each agent turn is one action (step). Per iteration:

1. data: `ppo.mode = "online"` (default) samples `rollouts_per_iteration` fresh episodes of the
   current policy on the train tasks (F's episodes, written to trajectories/ppo_<mode>_it<k>.p*.jsonl);
   `"offline"` (the released pipeline, §7.5) takes the next `rollouts_per_iteration` trajectories
   of the labelled held-out exploration set (label/labels.jsonl);
2. step rewards (`training.rewards.step_rewards`, reward mode m): "spa" = alpha c_t + beta g_t with
   c_t from the FROZEN progress estimator (online) or the label file (offline) and g_t the env's
   grounding; "sparse" = R at the last step; "grounding_only" = beta g_t plus R at the last step;
3. old log-probs: the current (= sampling, online) policy before the update; reference log-probs:
   the frozen SFT policy (LoRA: the same network with adapters zeroed); values: the critic, a
   separate `ValueModel` (backbone from the SFT policy or the estimator, `ppo.critic_init`, fresh
   head) read at each step's START (the last token before the action); scored in length-sorted
   chunks, each cut after its own last step (`score_rows`);
4. targets (`training.ppo_targets`): KL-shaped rewards r_t - kl_coef KL_t, GAE over steps (a
   step-limit truncation is terminal: the env gives it reward 0), whitened advantages;
5. `ppo_epochs` passes over shuffled mini-batches of `mini_batch_size * grad_accum` trajectories (of
   like lengths with `group_by_length`: `epoch_mini_batches`), one optimizer step each: its rows sorted
   by length into micro-batches of `mini_batch_size` (`micro_batch_rows`), each micro-batch cut after
   its own last step token (`trim_to_steps`, in `length_bucket` multiples), their gradient sums added:
   clipped policy + clipped value loss (`training.make_ppo_step`; the same update as on the padded
   mini-batch, on fewer tokens). With `ppo.target_kl`, the first mini-batch whose approx KL to the
   sampling policy exceeds 1.5 x target_kl stops the policy's updates for the rest of the iteration
   (the critic's go on);
6. the KL coefficient's controller (fixed or adaptive) sees the batch's mean KL.

Each iteration's metrics (metrics/ppo_<mode>.jsonl) hold the rollout summary, the losses, `kl` (mean KL
to the reference per trajectory, from the sampled tokens) with `kl_stderr`, the critic's
`explained_variance`, `policy_updated` (the share of the iteration's mini-batch updates that moved the
policy: 0 in critic warm-up, below 1 after a skip or the KL early stop), `beyond_kl` (the share beyond
the early stop's limit), and, online, `sampler_logp_gap` / `_max`: the mean / max |sampler log-prob -
old-policy log-prob| over the sampled tokens, an invariant (0 up to float noise) that catches a
sampler running other weights than the policy it is trained as. They also time the phases
(wall seconds, compilation included: the first iteration compiles): `time_rollout_s` (1, online
or offline data), `time_rewards_s` (2), `time_targets_s` (3-4), `time_update_s` (5); count the tokens
(`generated_tokens` by the sampler, online; `batch_tokens` in the trajectories trained on;
`padded_tokens` in their padded batch; `targets_tokens`, the tokens the targets' scoring passes read,
in length-sorted chunks each trimmed to its own longest row; `update_tokens`, the tokens of the
update's micro-batches, each trimmed, summed over its epochs); and, on
GPU/TPU, `peak_memory_gb`: the device allocator's high-water mark at the iteration's end (GB since
the process started, so it includes earlier stages run in the same process).

Each mode m starts from the SFT policy and writes policies/ppo_<m>/ (LoRA merged),
checkpoints/ppo/<fingerprint>/<m>/ (after every `checkpoint_every` iterations; a rerun resumes),
metrics/ppo_<m>.jsonl and plots/ppo_<m>.png. With `ppo.time_budget_s` set, a mode's run stops after
the first iteration that ends past that many seconds (of this invocation), checkpoints it and writes
that iteration's policy; `--config.run.force=ppo` later goes on from there. `ppo.seed` (default:
config.seed) seeds PPO alone, so several PPO seeds can share one SFT policy and estimator.

Held-out learning curves: with `ppo.eval_every = k > 0`, the policy is evaluated greedily on the
first `ppo.eval_tasks` goals of env.eval_split (default: eval.max_tasks), as the eval stage runs
them (eval.temperature, top_p, max_new_tokens, config.seed), before the first iteration (the SFT
policy, step 0), after every k-th iteration and after the last one the run makes (including a stop
by the time budget); metrics/ppo_<m>_eval.jsonl holds eval_score, eval_success_rate, ... per step
(= iterations done), plots/ppo_<m>_eval.png the curves, trajectories/ppo_<m>_eval<k>.p*.jsonl the
episodes. The evaluation only watches: the training rollouts, updates and policy are the same with
it on or off, so ppo.eval_every and ppo.eval_tasks are not part of the stage's fingerprint.
"""

import contextlib
import dataclasses
import logging
import math
import shutil
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from spa_jax import distributed, tracking
from spa_jax.configuration import split_names
from spa_jax.models import Llama, LlamaConfig, ValueModel, apply_lora, merge_lora
from spa_jax.rollout import episodes
from spa_jax.rollout.trajectory_store import read_trajectories
from spa_jax.sharding import shard_model
from spa_jax.stages import common, label, prm
from spa_jax.stages import eval as eval_stage
from spa_jax.training.batch import trim_to_steps
from spa_jax.training.checkpoint import Checkpointer
from spa_jax.training.global_batch import batch_devices, to_global_batch
from spa_jax.training.kl import make_kl_controller
from spa_jax.training.optim import OptimizerConfig, make_optimizer
from spa_jax.training.ppo_targets import ppo_targets
from spa_jax.training.rewards import purchases_a_stall_outearns, step_rewards
from spa_jax.training.steps import (PPOConfig, PPOState, forward_logprobs, forward_step_values,
                                    lora_reference, make_ppo_step)
from spa_jax.training.train_state import TrainState, abstract_train_state, create_train_state, frozen_train_state
from spa_jax.workspace import Workspace

ROLLOUT_METRICS = ("score", "success_rate", "purchase_rate", "grounding", "mean_steps", "generated_tokens")
EVAL_METRICS = ("score", "success_rate", "purchase_rate", "grounding", "mean_steps")  # logged as eval_<name>
_ppo_targets = jax.jit(ppo_targets, static_argnames=("gamma", "lam", "kl_estimator", "whiten_advantages"))
TRAINABLE = {"full": ("full", "full"), "lora": ("lora", "lora_and_head")}  # (policy, critic)


# ----------------------------------------------------------------------------- models and state


def ppo_seed(cfg: ml_collections.ConfigDict) -> int:
  """The seed of PPO's own randomness (LoRA and critic-head init, task order, rollout sampling,
  mini-batch order): ppo.seed, or config.seed when unset. A separate ppo.seed gives several PPO runs
  from ONE SFT policy and estimator (whose fingerprints depend on config.seed, not on this)."""
  return cfg.seed if cfg.ppo.seed is None else cfg.ppo.seed


def _with_lora(cfg: ml_collections.ConfigDict, model: Llama, seed: int) -> Llama:
  if cfg.ppo.finetune == "lora":
    lora = cfg.model.lora
    apply_lora(model, lora.rank, lora.alpha, tuple(lora.targets.split(",")), rngs=nnx.Rngs(seed))
  return model


def _critic(cfg: ml_collections.ConfigDict, backbone: Llama) -> ValueModel:
  return ValueModel(_with_lora(cfg, backbone, ppo_seed(cfg) + 11), nnx.Rngs(ppo_seed(cfg) + 12))


class Optimizers(NamedTuple):
  policy: optax.GradientTransformation
  critic: optax.GradientTransformation


def optimizers(cfg: ml_collections.ConfigDict) -> Optimizers:
  """The policy's and the critic's optimizers (Adam, constant LR; the critic's own LR if set; the
  policy's ramped from 0 over its first `ppo.warmup_updates` updates, which critic-only iterations
  do not count)."""
  def adam(learning_rate: float, warmup_steps: int = 0):
    return make_optimizer(OptimizerConfig(learning_rate=learning_rate, schedule="constant",
                                          warmup_steps=warmup_steps, grad_clip_norm=cfg.ppo.grad_clip))
  critic_lr = cfg.ppo.critic_learning_rate
  return Optimizers(policy=adam(cfg.ppo.learning_rate, cfg.ppo.warmup_updates),
                    critic=adam(cfg.ppo.learning_rate if critic_lr is None else critic_lr))


def _critic_dir(cfg: ml_collections.ConfigDict, ws: Workspace):
  return prm.estimator_dir(ws) if cfg.ppo.critic_init == "prm" else common.policy_dir(ws, "sft")


def initial_state(cfg: ml_collections.ConfigDict, ws: Workspace, mesh, tx: Optimizers) -> tuple[LlamaConfig, PPOState]:
  """Policy (SFT, + LoRA) and critic (SFT or estimator backbone, + LoRA, fresh head) train states;
  `tx` holds each one's optimizer (`optimizers`)."""
  policy_trainable, critic_trainable = TRAINABLE[cfg.ppo.finetune]
  model_cfg, policy = prm.load_backbone(cfg, common.policy_dir(ws, "sft"), mesh, cfg.model.dtype)
  _, critic_backbone = prm.load_backbone(cfg, _critic_dir(cfg, ws), mesh, cfg.model.dtype)
  policy = shard_model(_with_lora(cfg, policy, ppo_seed(cfg) + 10), mesh)
  critic = shard_model(_critic(cfg, critic_backbone), mesh)
  return model_cfg, PPOState(policy=create_train_state(policy, tx.policy, trainable=policy_trainable, seed=ppo_seed(cfg)),
                             critic=create_train_state(critic, tx.critic, trainable=critic_trainable, seed=ppo_seed(cfg)))


def abstract_state(cfg: ml_collections.ConfigDict, model_cfg: LlamaConfig, tx: Optimizers, mesh) -> PPOState:
  """`initial_state`'s shapes and shardings: the restore target of a checkpoint."""
  policy_trainable, critic_trainable = TRAINABLE[cfg.ppo.finetune]
  policy = abstract_train_state(lambda: _with_lora(cfg, Llama(model_cfg, rngs=nnx.Rngs(0)), 0), tx.policy,
                                trainable=policy_trainable, mesh=mesh)
  critic = abstract_train_state(lambda: _critic(cfg, Llama(model_cfg, rngs=nnx.Rngs(0))), tx.critic,
                                trainable=critic_trainable, mesh=mesh)
  return PPOState(policy=policy, critic=critic)


def frozen_sft(cfg: ml_collections.ConfigDict, ws: Workspace, mesh) -> TrainState:
  """The SFT policy as a never-updated train state: the reference of full fine-tuning."""
  _, model = prm.load_backbone(cfg, common.policy_dir(ws, "sft"), mesh, cfg.model.dtype)
  return frozen_train_state(model)


def sampling_model(policy: TrainState) -> Llama:
  """The policy as a plain Llama (LoRA merged), for the sampler and for export. The module is
  built on copies of the state's Variables (`copy=True`): `merge_lora` writes the merged kernels
  into the module's Variables, and without the copy those are the train state's own, so every
  call would add the LoRA delta to the frozen base (and to the LoRA reference)."""
  return merge_lora(nnx.merge(policy.graphdef, policy.params, policy.frozen, copy=True))


# ----------------------------------------------------------------------------- data per iteration


@dataclasses.dataclass
class Shared:
  """What every reward mode's run uses: tokenizer, mesh, sampler, env pool, the frozen models."""
  cfg: ml_collections.ConfigDict
  ws: Workspace
  tokenizer: object
  mesh: object
  sampler: object = None
  pool: object = None
  estimator: TrainState | None = None
  reference: TrainState | None = None  # full fine-tuning: the frozen SFT policy
  offline: list[prm.TrajectorySequence] | None = None
  offline_progress: dict[str, np.ndarray] | None = None
  step_fn: object = None  # the jitted PPO step, compiled once for every mode


def ppo_step_fn(shared: "Shared", state: PPOState):
  """The jitted PPO update (made on first use; every mode's state has the same layout)."""
  if shared.step_fn is None:
    p = shared.cfg.ppo
    shared.step_fn = make_ppo_step(state, PPOConfig(
        clip_eps=p.clip_ratio, value_clip_eps=p.value_clip, vf_coef=p.vf_coef, entropy_coef=p.entropy_coef,
        max_mean_ratio=p.max_mean_ratio, max_update_kl=1.5 * p.target_kl if p.target_kl else math.inf))
  return shared.step_fn


def online_sequences(shared: Shared, mode: str, iteration: int, state: PPOState) -> tuple[list, dict]:
  """Fresh episodes of the current policy on the next train tasks: (sequences, rollout summary)."""
  cfg = shared.cfg
  per_iteration = cfg.ppo.rollouts_per_iteration // cfg.ppo.samples_per_task
  all_tasks = common.split_tasks(cfg, cfg.env.train_split, None)
  order = np.random.default_rng([ppo_seed(cfg), 31]).permutation(len(all_tasks))
  tasks = [all_tasks[order[(iteration * per_iteration + k) % len(all_tasks)]] for k in range(per_iteration)]
  name = f"ppo_{mode}_it{iteration:04d}"
  _, params = nnx.split(sampling_model(state.policy))
  common.rollout(cfg, shared.ws, policy=f"ppo_{mode}@{iteration}", sampler=shared.sampler, params=params,
                 tokenizer=shared.tokenizer, tasks=tasks, split=cfg.env.train_split, name=name,
                 samples_per_task=cfg.ppo.samples_per_task, temperature=cfg.ppo.temperature,
                 top_p=cfg.ppo.top_p, max_new_tokens=cfg.ppo.max_new_tokens,
                 seed=ppo_seed(cfg) * 100_003 + iteration, pool=shared.pool)  # same across modes: paired runs
  distributed.barrier(f"{name}-written")
  records = read_trajectories(shared.ws, name)
  sequences, _ = prm.load_sequences(records, shared.tokenizer, cfg.ppo.max_len)
  generated = sum(len(step["token_logprobs"]) for record in records for step in record["steps"])
  return sequences, {**episodes.summarize(records), "generated_tokens": generated}


def evaluate_policy(shared: Shared, mode: str, done: int, state: PPOState) -> dict[str, float]:
  """Greedy episodes of the policy after `done` iterations on the eval split's first ppo.eval_tasks
  goals, run as the eval stage runs them: {eval_<metric>: value}."""
  cfg = shared.cfg
  tasks = common.split_tasks(cfg, cfg.env.eval_split,
                             cfg.ppo.eval_tasks if cfg.ppo.eval_tasks is not None else cfg.eval.max_tasks)
  _, params = nnx.split(sampling_model(state.policy))
  metrics = eval_stage.evaluate(cfg, shared.ws, policy=f"ppo_{mode}@{done}", name=f"ppo_{mode}_eval{done:04d}",
                                sampler=shared.sampler, params=params, tokenizer=shared.tokenizer, tasks=tasks,
                                pool=shared.pool)
  return {f"eval_{key}": metrics[key] for key in EVAL_METRICS}


def offline_sequences(shared: Shared, iteration: int) -> tuple[list, dict]:
  """The next `rollouts_per_iteration` labelled held-out exploration trajectories (cycling)."""
  data, count = shared.offline, shared.cfg.ppo.rollouts_per_iteration
  order = np.random.default_rng([ppo_seed(shared.cfg), 37]).permutation(len(data))
  picked = [data[order[(iteration * count + k) % len(data)]] for k in range(min(count, len(data)))]
  return picked, {"score": 100.0 * float(np.mean([s.final_reward for s in picked])),
                  "grounding": 100.0 * float(np.mean([g for s in picked for g in s.grounding]))}


def load_offline(shared: Shared) -> None:
  """The labelled trajectories (label/labels.jsonl) and their estimator outputs."""
  cfg = shared.cfg
  progress = label.read_progress(shared.ws)
  records = [r for r in read_trajectories(shared.ws, prm.EXPLORE) if f"{r['task_id']}:{r['rollout']}" in progress]
  sequences, _ = prm.load_sequences(records, shared.tokenizer, cfg.ppo.max_len)
  if not sequences:
    raise ValueError("offline PPO has no labelled trajectories: the label stage labels the held-out tasks "
                     "only; raise prm.holdout_fraction or explore.max_tasks")
  shared.offline = sequences
  shared.offline_progress = progress


def progress_of(shared: Shared, mode: str, sequences) -> dict[str, np.ndarray]:
  """c_t per step: the label file's (offline) or the frozen estimator's (online); zeros when the
  reward mode does not use it."""
  if mode != "spa":
    return {s.key: np.zeros(s.num_steps, np.float32) for s in sequences}
  if shared.offline is not None:
    return {s.key: shared.offline_progress[s.key] for s in sequences}
  cfg = shared.cfg
  return prm.estimate_progress(shared.estimator, sequences, **prm.estimator_forward(cfg, shared.tokenizer, shared.mesh))


def progress_fit(mode: str, sequences, progress: dict[str, np.ndarray]) -> dict[str, float]:
  """For `spa` rewards, how the progress sums of this iteration's rollouts fit their final rewards
  (`prm.fit_metrics` as progress_<key>; progress_mean_predicted is the mean sum). The estimator was
  fit on exploration trajectories; a policy that drifts to where it is wrong (longer episodes, for an
  estimator that counts steps) shows here as a falling progress_pearson and a rising progress_steps_pearson."""
  if mode != "spa":
    return {}
  fit = prm.fit_metrics(sequences, progress)
  return {f"progress_{key}": value for key, value in fit.items() if key not in ("trajectories", "mean_reward")}


def reward_batch(cfg: ml_collections.ConfigDict, mode: str, sequences, progress, pad_id: int,
                 rows: int | None = None) -> dict[str, np.ndarray]:
  """The trajectory batch of one iteration (`rows` rows, unset: rollouts_per_iteration; one length
  bucket) with its task rewards `task_rewards_bs` for reward mode `mode` and `sampler_logp_bt`, the
  log-probs the sampler recorded for each sampled action token (0 elsewhere and without exact tokens)."""
  seq_len = prm.padded_length(sequences, cfg.ppo.length_bucket, cfg.ppo.max_len)
  batch = prm.sequence_batch(sequences, seq_len, rows or cfg.ppo.rollouts_per_iteration, cfg.env.max_steps, pad_id)
  progress_bs = np.zeros_like(batch["grounding_bs"])
  sampler_logp_bt = np.zeros_like(batch["loss_mask_bt"])
  for row, sequence in enumerate(sequences):
    progress_bs[row, :sequence.num_steps] = progress[sequence.key]
    if sequence.sampler_logprobs is not None:
      sampler_logp_bt[row, :len(sequence.tokens)] = sequence.sampler_logprobs
  rewards_bs = step_rewards(mode, progress_bs=jnp.asarray(progress_bs), grounding_bs=jnp.asarray(batch["grounding_bs"]),
                            step_mask_bs=jnp.asarray(batch["step_mask_bs"]),
                            final_reward_b=jnp.asarray(batch["final_reward_b"]),
                            alpha=cfg.label.progress_coef, beta=cfg.label.grounding_coef,
                            grounding_form=cfg.label.grounding_form)
  return batch | {"task_rewards_bs": np.asarray(rewards_bs), "sampler_logp_bt": sampler_logp_bt}


def batch_sizes(batch: dict[str, np.ndarray], sequences) -> dict[str, int]:
  """Tokens of one iteration's update: in the trajectories it trains on and in their padded batch
  (rows x length bucket)."""
  return {"batch_tokens": int(sum(len(s.tokens) for s in sequences)), "padded_tokens": int(batch["tokens_bt"].size)}


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
  """1 - Var(returns - values) / Var(returns) over the given steps (NaN when the returns are constant):
  1 is a perfect critic, 0 one no better than the mean return."""
  spread = float(np.var(returns))
  return float("nan") if spread < 1e-12 else 1.0 - float(np.var(returns - values)) / spread


def sampler_agreement(batch: dict[str, np.ndarray], old_logp_bt: np.ndarray) -> dict[str, float]:
  """How far the update's old-policy log-probs are from the sampler's on the sampled action tokens
  (online PPO: the same policy, so only float noise; a stale or altered sampler shows up here):
  mean and max |difference| in nats per token."""
  tokens = (batch["loss_mask_bt"] > 0) & (batch["sampler_logp_bt"] != 0)
  if not tokens.any():
    return {}
  gap = np.abs(old_logp_bt - batch["sampler_logp_bt"])[tokens]
  return {"sampler_logp_gap": float(gap.mean()), "sampler_logp_gap_max": float(gap.max())}


# ----------------------------------------------------------------------------- one iteration


def row_unit(mesh) -> int:
  """The fewest rows a global batch can hold: one per batch device and per process."""
  return math.lcm(batch_devices(mesh), distributed.process_count())


def scoring_chunk_rows(rows: int, grad_accum: int, mesh) -> int:
  """Rows per scoring chunk: the smallest divisor of `rows` that is at least an update micro-batch
  (rows / grad_accum) and splits over the batch's devices and processes (at most `rows`: one chunk)."""
  unit = row_unit(mesh)
  return next(d for d in range(max(1, rows // grad_accum), rows + 1) if rows % d == 0 and d % unit == 0)


def length_chunks(batch: dict[str, np.ndarray], chunk_rows: int) -> list[np.ndarray]:
  """`batch`'s row indices sorted by where their last step ends, `chunk_rows` at a time: chunks of
  similar lengths, each of which `trim_to_steps` cuts to its own longest row."""
  order = np.argsort(batch["step_end_idx_bs"].max(axis=1), kind="stable")
  return [order[start:start + chunk_rows] for start in range(0, len(order), chunk_rows)]


def score_rows(shared: Shared, state: PPOState, batch: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
  """The old policy's and the reference's token log-probs and the critic's values at each step's start
  for every row of `batch` (host numpy, `batch`'s shapes; 0 past a row's last step), and the tokens
  scored. Rows go in length-sorted chunks of about an update micro-batch (`scoring_chunk_rows`), each
  trimmed after its own last step: a causal model scores a row's steps the same without the cut
  tokens, and short rows no longer pay for the iteration's longest."""
  cfg, mesh = shared.cfg, shared.mesh
  reference = shared.reference or lora_reference(state.policy)
  rows, seq_len = batch["tokens_bt"].shape
  scored = {"old_logp_bt": np.zeros((rows, seq_len), np.float32), "ref_logp_bt": np.zeros((rows, seq_len), np.float32),
            "old_values_bs": np.zeros(batch["step_mask_bs"].shape, np.float32)}
  keys, tokens, chunks = ("tokens_bt", "positions_bt", "step_start_idx_bs", "step_end_idx_bs", "step_mask_bs"), 0, []
  for index in length_chunks(batch, scoring_chunk_rows(rows, cfg.ppo.grad_accum, mesh)):
    chunk = trim_to_steps({key: batch[key][index] for key in keys}, cfg.ppo.length_bucket)
    tokens += chunk["tokens_bt"].size
    with jax.set_mesh(mesh):
      inputs = to_global_batch(prm.process_rows(chunk), mesh)
      chunks.append((index, {"old_logp_bt": forward_logprobs(state.policy, inputs),
                             "ref_logp_bt": forward_logprobs(reference, inputs),
                             "old_values_bs": forward_step_values(state.critic, inputs, at="start")}))
  for index, outputs in chunks:  # fetched after every chunk is dispatched: the device runs them back to back
    for key, value in outputs.items():
      value = prm.to_host(value)
      scored[key][index, :value.shape[1]] = value
  return scored, tokens


TARGET_KEYS = ("step_mask_bs", "step_id_bt", "loss_mask_bt", "task_rewards_bs")  # what ppo_targets reads of the batch


def targets_batch(shared: Shared, state: PPOState, batch: dict[str, np.ndarray], kl_coef: float) -> tuple[dict, dict]:
  """The batch with old log-probs, old values, advantages and returns (host numpy), and the KL stats
  (with `targets_tokens`: the tokens the scoring passes read, `score_rows`)."""
  cfg, mesh = shared.cfg, shared.mesh
  scored, targets_tokens = score_rows(shared, state, batch)
  with jax.set_mesh(mesh):
    inputs = to_global_batch(prm.process_rows({key: batch[key] for key in TARGET_KEYS} | scored), mesh)
    targets = _ppo_targets(inputs, old_logp_bt=inputs["old_logp_bt"], ref_logp_bt=inputs["ref_logp_bt"],
                          old_values_bs=inputs["old_values_bs"], task_rewards_bs=inputs["task_rewards_bs"],
                          kl_coef=jnp.float32(kl_coef), gamma=cfg.ppo.gamma, lam=cfg.ppo.gae_lambda,
                          kl_estimator=cfg.ppo.kl.estimator, whiten_advantages=cfg.ppo.whiten_advantages)
  full = batch | {"old_logp_bt": scored["old_logp_bt"], "old_values_bs": scored["old_values_bs"],
                  "advantages_bt": prm.to_host(targets["advantages_bt"]), "returns_bs": prm.to_host(targets["returns_bs"])}
  has_steps, steps = batch["step_mask_bs"].any(axis=1), batch["step_mask_bs"] > 0
  kl_b = prm.to_host(targets["kl_bs"]).sum(axis=1)[has_steps]
  stats = {"kl": float(targets["mean_kl"]), "kl_coef": kl_coef, "targets_tokens": targets_tokens,
           "kl_stderr": float(kl_b.std(ddof=1) / np.sqrt(kl_b.size)) if kl_b.size > 1 else float("nan"),
           "shaped_return": float(prm.to_host(targets["rewards_bs"]).sum(axis=1)[has_steps].mean()),
           "task_return": float(batch["task_rewards_bs"].sum(axis=1)[has_steps].mean()),
           "explained_variance": explained_variance(full["old_values_bs"][steps], full["returns_bs"][steps])}
  if shared.offline is None:  # offline data was sampled by the SFT policy, not the current one
    stats |= sampler_agreement(batch, full["old_logp_bt"])
  return full, stats


def epoch_mini_batches(ends: np.ndarray, rows: int, rng: np.random.Generator, length_bucket: int,
                       group_by_length: bool = False) -> list[np.ndarray]:
  """One update epoch's mini-batches of `rows` trajectory indices, given where each trajectory's last
  step ends (`ends`): a random permutation cut in order; with `group_by_length`, that permutation
  sorted (stably) by each row's trimmed length (`ends` + 1 rounded up to `length_bucket`, as
  `trim_to_steps` cuts) before the cut, and the mini-batches' order shuffled. Rows of one length are
  then grouped at random each epoch, and a mini-batch mixes lengths only where one length's rows run
  out, so short rows seldom pay for a long one's padding. Every row appears once either way."""
  order = rng.permutation(len(ends))
  if group_by_length:
    lengths = -(-(ends[order] + 1) // length_bucket)
    order = order[np.argsort(lengths, kind="stable")]
  minis = [order[start:start + rows] for start in range(0, len(order), rows)]
  return [minis[i] for i in rng.permutation(len(minis))] if group_by_length else minis


def micro_batch_rows(mini_batch_size: int, rows: int, mesh) -> int:
  """Rows per update micro-batch: ppo.mini_batch_size, raised to the least multiple of `row_unit`
  (every device and process holds rows of each micro-batch; the update's sums do not depend on how the
  mini-batch is cut). It must divide the mini-batch's `rows`."""
  unit = row_unit(mesh)
  micro = math.lcm(mini_batch_size, unit)
  if rows % micro:
    raise ValueError(f"a mini-batch of ppo.mini_batch_size * ppo.grad_accum = {rows} trajectories does not split "
                     f"into micro-batches of {micro} (a multiple of ppo.mini_batch_size={mini_batch_size} and of the "
                     f"{unit} rows one global batch needs: a row per batch device and per process): make "
                     f"ppo.grad_accum a multiple of {micro // mini_batch_size}")
  return micro


def update(shared: Shared, step_fn, state: PPOState, batch: dict[str, np.ndarray], iteration: int):
  """`ppo_epochs` passes of shuffled mini-batches (`epoch_mini_batches`, grouped by length with
  ppo.group_by_length), each as micro-batches trimmed to their own steps; returns (state, mean metrics
  over the updates, with `update_tokens`: the micro-batches' tokens, padding included). With
  ppo.target_kl, the first mini-batch beyond its KL limit stops the policy's updates for the rest of the
  iteration (a host sync per mini-batch: off, the loop never waits for the device)."""
  cfg = shared.cfg
  rows = cfg.ppo.mini_batch_size * cfg.ppo.grad_accum
  micro_rows = micro_batch_rows(cfg.ppo.mini_batch_size, rows, shared.mesh)
  train_policy = np.asarray(iteration >= cfg.ppo.critic_warmup)  # the first critic_warmup iterations: critic only
  keys = [k for k in batch if k not in ("grounding_bs", "task_rewards_bs", "final_reward_b", "sampler_logp_bt")]
  ends = batch["step_end_idx_bs"].max(axis=1)
  history, tokens = [], 0
  for epoch in range(cfg.ppo.ppo_epochs):
    rng = np.random.default_rng([ppo_seed(cfg), iteration, epoch])
    for index in epoch_mini_batches(ends, rows, rng, cfg.ppo.length_bucket, cfg.ppo.group_by_length):
      micros = [trim_to_steps({key: batch[key][index[chunk]] for key in keys}, cfg.ppo.length_bucket)
                for chunk in length_chunks({"step_end_idx_bs": batch["step_end_idx_bs"][index]}, micro_rows)]
      tokens += sum(micro["tokens_bt"].size for micro in micros)
      with jax.set_mesh(shared.mesh):
        state, metrics = step_fn(state, [to_global_batch(prm.process_rows(micro), shared.mesh) for micro in micros],
                                 train_policy)
      history.append(metrics)  # device arrays: no host sync, the next mini-batch is prepared meanwhile
      if cfg.ppo.target_kl and train_policy and float(metrics["beyond_kl"]):
        train_policy = np.asarray(False)  # the KL early stop: the critic alone from here
  history = jax.device_get(history)
  return state, {name: float(np.mean([h[name] for h in history])) for name in history[0]} | {
      "update_tokens": tokens}


# ----------------------------------------------------------------------------- one reward mode


def checkpointer(cfg: ml_collections.ConfigDict, ws: Workspace, mode: str) -> Checkpointer:
  """checkpoints/ppo/<fingerprint>/<mode>/; checkpoints of other configs or inputs are removed."""
  root = ws.checkpoint_dir("ppo")
  current = root / prm.run_fingerprint(cfg, "ppo")
  if distributed.is_main_process():
    for stale in root.iterdir():
      if stale != current:
        shutil.rmtree(stale, ignore_errors=True)
  distributed.barrier(f"ppo-checkpoints-{mode}")
  return Checkpointer(current / mode, save_every=cfg.ppo.checkpoint_every, keep=cfg.ppo.keep_checkpoints)


def stall_warning(cfg: ml_collections.ConfigDict, mode: str) -> str | None:
  """Why reward mode `mode` may teach a policy to stop buying, or None: the grounding bonus paid per valid
  step makes an episode that runs to the step cap out-earn a purchase."""
  if mode not in ("spa", "grounding_only"):
    return None
  beta, max_steps = cfg.label.grounding_coef, cfg.env.max_steps
  last = purchases_a_stall_outearns(beta, max_steps, cfg.label.grounding_form)
  if not last:
    return None
  return (f"ppo {mode}: label.grounding_form=bonus pays label.grounding_coef={beta} per valid step, so an episode "
          f"of valid actions up to env.max_steps={max_steps} without a purchase earns {beta * max_steps:g}, more "
          f"than any purchase by step {last} (at most 1 + {beta} k): PPO can learn to stop buying, as 2 of 5 "
          f"SmolLM2 seeds did at a KL coefficient of 0.03 (bench/RESULTS.md, 2026-12-07 21:08). "
          f"label.grounding_form=penalty charges invalid steps instead and pays nothing for length")


def train_mode(shared: Shared, mode: str) -> dict:
  """PPO from the SFT policy with reward mode `mode`; writes policy ppo_<mode>; returns its summary."""
  cfg, ws = shared.cfg, shared.ws
  if warning := stall_warning(cfg, mode):
    logging.warning(warning)
  tx = optimizers(cfg)
  controller = make_kl_controller("adaptive" if cfg.ppo.kl.adaptive else "fixed", init=cfg.ppo.kl.init_coef,
                                  target=cfg.ppo.kl.target, horizon=cfg.ppo.kl.horizon)
  ckpt = checkpointer(cfg, ws, mode)
  resumed = ckpt.latest_step() is not None
  if resumed:
    model_cfg = prm.backbone_config(cfg, common.policy_dir(ws, "sft"), cfg.model.dtype)
    state, metadata = ckpt.restore(abstract_state(cfg, model_cfg, tx, shared.mesh))
    start, kl_coef = metadata["iteration"], metadata["kl_coef"]
    logging.info("ppo %s: resuming after iteration %d of %d", mode, start, cfg.ppo.iterations)
  else:
    model_cfg, state = initial_state(cfg, ws, shared.mesh, tx)
    start, kl_coef = 0, controller.initial()
  step_fn = ppo_step_fn(shared, state)
  metrics_name = f"ppo_{mode}"
  last, done, started = {}, start, time.monotonic()
  eval_metrics = (tracking.MetricsWriter(ws, f"{metrics_name}_eval", cfg.tracking.tensorboard, append=resumed)
                  if cfg.ppo.eval_every else contextlib.nullcontext())
  with ckpt, tracking.MetricsWriter(ws, metrics_name, cfg.tracking.tensorboard, append=resumed) as writer, \
      eval_metrics as eval_writer:
    if cfg.ppo.eval_every and not resumed:
      eval_writer.write(0, evaluate_policy(shared, mode, 0, state))
    for iteration in range(start, cfg.ppo.iterations):
      times = {}
      with tracking.timed(times, "time_rollout_s"):
        if shared.offline is not None:
          sequences, rollout = offline_sequences(shared, iteration)
        else:
          sequences, rollout = online_sequences(shared, mode, iteration, state)
      if not sequences:
        raise ValueError(f"ppo {mode} iteration {iteration}: every rollout was dropped (no steps or longer "
                         f"than ppo.max_len={cfg.ppo.max_len})")
      with tracking.timed(times, "time_rewards_s"):
        progress = progress_of(shared, mode, sequences)
        batch = reward_batch(cfg, mode, sequences, progress, shared.tokenizer.pad_id)
      with tracking.timed(times, "time_targets_s"):
        batch, kl_stats = targets_batch(shared, state, batch, kl_coef)
      with tracking.timed(times, "time_update_s"):
        state, train = update(shared, step_fn, state, batch, iteration)
        jax.block_until_ready(state)
      kl_coef = controller.update(kl_coef, kl_stats["kl"], len(sequences))
      last = {**{k: rollout[k] for k in ROLLOUT_METRICS if k in rollout}, **kl_stats, **train,
              **progress_fit(mode, sequences, progress), "trajectories": len(sequences), **times,
              **batch_sizes(batch, sequences)}
      if (peak := tracking.peak_memory_gb()) is not None:
        last["peak_memory_gb"] = peak
      writer.write(iteration + 1, last)
      logging.info("ppo %s iteration %d/%d: score %.1f, policy loss %.4f, value loss %.4f, KL %.4f",
                   mode, iteration + 1, cfg.ppo.iterations, rollout.get("score", float("nan")),
                   train["policy_loss"], train["value_loss"], kl_stats["kl"])
      done = iteration + 1
      out_of_time = distributed.main_process_decides(
          cfg.ppo.time_budget_s is not None and time.monotonic() - started > cfg.ppo.time_budget_s)
      if cfg.ppo.eval_every and (done % cfg.ppo.eval_every == 0 or done == cfg.ppo.iterations or out_of_time):
        eval_writer.write(done, evaluate_policy(shared, mode, done, state))
      ckpt.save(done, state, {"iteration": done, "kl_coef": kl_coef, "fingerprint": prm.run_fingerprint(cfg, "ppo")},
                force=done == cfg.ppo.iterations or out_of_time)
      if out_of_time and done < cfg.ppo.iterations:
        logging.warning("ppo %s: stopped after iteration %d of %d, past ppo.time_budget_s=%s; the policy is "
                        "this iteration's (run again with --config.run.force=ppo to go on from it)",
                        mode, done, cfg.ppo.iterations, cfg.ppo.time_budget_s)
        break
  if not last:  # resumed after its last iteration: report the recorded one
    last = {k: v for k, v in tracking.read_metrics(ws.metrics_path(metrics_name))[-1].items()
            if k not in ("step", "time")}
  outputs = common.save_policy(ws, metrics_name, sampling_model(state.policy), model_cfg)
  if cfg.tracking.plots and distributed.is_main_process() and ws.metrics_path(metrics_name).exists():
    tracking.plot_metrics(ws.metrics_path(metrics_name), ws.plot_path(metrics_name), title=f"PPO ({mode} rewards)")
    outputs.append(str(ws.plot_path(metrics_name)))
    if cfg.ppo.eval_every and ws.metrics_path(f"{metrics_name}_eval").exists():
      tracking.plot_metrics(ws.metrics_path(f"{metrics_name}_eval"), ws.plot_path(f"{metrics_name}_eval"),
                            title=f"PPO ({mode} rewards): greedy on {cfg.env.eval_split}")
      outputs.append(str(ws.plot_path(f"{metrics_name}_eval")))
  return {"resumed": resumed, "iterations": done, "final": last, "outputs": outputs}


@contextlib.contextmanager
def rollouts(shared: Shared):
  """Opens the sampler and the env pool that every reward mode's rollouts (online data, held-out
  evaluation) share."""
  cfg = shared.cfg
  model_cfg = prm.backbone_config(cfg, common.policy_dir(shared.ws, "sft"), cfg.model.dtype)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: Llama(model_cfg, rngs=nnx.Rngs(0))))
  shared.sampler = common.make_sampler(cfg, model_cfg, graphdef, shared.tokenizer, shared.mesh)
  with common.open_pool(cfg, shared.sampler.batch_size) as shared.pool:
    yield shared


def run(cfg: ml_collections.ConfigDict, ws: Workspace) -> dict:
  """One PPO run per ppo.reward_modes entry. Settings are checked by `configuration.validate`,
  which main runs before any stage."""
  modes = split_names(cfg.ppo.reward_modes)
  shared = Shared(cfg=cfg, ws=ws, tokenizer=common.load_tokenizer(cfg, ws), mesh=common.make_mesh(cfg))
  if cfg.ppo.finetune == "full":
    shared.reference = frozen_sft(cfg, ws, shared.mesh)
  if cfg.ppo.mode == "offline":
    load_offline(shared)
  elif "spa" in modes:
    shared.estimator = prm.load_estimator(cfg, ws, shared.mesh)
  if cfg.ppo.mode == "online" or cfg.ppo.eval_every:
    with rollouts(shared):
      summaries = {mode: train_mode(shared, mode) for mode in modes}
  else:
    summaries = {mode: train_mode(shared, mode) for mode in modes}
  return {**{f"{mode}_{key}": value for mode, s in summaries.items() for key, value in s["final"].items()
             if key in ("score", "kl", "policy_loss", "value_loss", "task_return")},
          "resumed": {mode: s["resumed"] for mode, s in summaries.items()},
          "iterations": {mode: s["iterations"] for mode, s in summaries.items()},
          "outputs": [path for s in summaries.values() for path in s["outputs"]]}
