"""Progress-estimator stage (spa-rl.md §1, §2.4, §7.4, §7.6), resumable.

The estimator is a `ValueModel`: a backbone initialised from the SFT policy plus a `ScalarHead`
read at the END of each agent action turn (the action's closing end-of-turn token,
`step_end_idx_bs`). Only the environment actions are steps: the instruction, "OK" and
demonstration turns are outside the trajectories' action masks, so they carry no c_t. It is
trained so that the per-step contributions of a trajectory sum to its final reward
(`training.progress_loss`), full / LoRA(+head) per `prm.finetune`, in `prm.dtype` activations.
With `prm.head_init=probe` the head starts from a linear probe of the SFT backbone (`probe_head`):
from a zero head, fine-tuning first learns only the mean reward per step, and a short run ends
with sums that count steps.

Held-out split: `prm.holdout_fraction` of the exploration TASK ids (chosen by `seed`) are never
trained on, so no task leaks; every epoch reports MSE and Pearson correlation of the predicted sums
against the final rewards on the held-out and the train trajectories. The label stage labels the
held-out trajectories only (out of sample), and PPO applies the frozen estimator to fresh rollouts.

Selection: `prm.validation_fraction` of the remaining tasks are not trained on either; the stage
keeps the estimator with the lowest MSE on them among its initial head (epoch 0: the probe) and
every epoch's end, so fine-tuning that undoes the probe does not ship (the held-out tasks play no
part in the choice, so their figures stay out of sample).

Writes prm/estimator/ (HF directory of the backbone, LoRA merged, plus head.safetensors),
prm/split.json (train / validation / held-out task ids), checkpoints/prm/<config hash>/, metrics/prm.jsonl,
plots/prm.png (metrics) and plots/prm_progress.png (per-step progress of held-out examples).
"""

import dataclasses
import json
import logging
import math
import pathlib
import shutil

import jax
import matplotlib.pyplot as plt
import ml_collections
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from spa_jax import distributed, pipeline, tracking
from spa_jax.models import Llama, LlamaConfig, ValueModel, apply_lora, load_hf, save_hf
from spa_jax.rollout import episodes
from spa_jax.rollout.agent_format import build_sft_example
from spa_jax.rollout.trajectory_store import read_trajectories
from spa_jax.sharding import shard_model
from spa_jax.stages import common
from spa_jax.stages.sft import epoch_batches
from spa_jax.training.batch import bucketed_length, make_trajectory_batch
from spa_jax.training.checkpoint import Checkpointer
from spa_jax.training.global_batch import to_global_batch
from spa_jax.training.optim import OptimizerConfig, make_optimizer
from spa_jax.training.steps import forward_step_features, forward_step_values, make_progress_step
from spa_jax.training.train_state import TrainState, abstract_train_state, create_train_state, frozen_train_state
from spa_jax.workspace import Workspace, write_json_atomic

EXPLORE = "explore"
ESTIMATOR_DIR = "estimator"
HEAD_FILE = "head.safetensors"
SPLIT_FILE = "split.json"
PROGRESS_PLOT = "prm_progress"
TRAINABLE = {"full": "full", "lora": "lora_and_head"}


# ----------------------------------------------------------------------------- trajectories


@dataclasses.dataclass(frozen=True)
class TrajectorySequence:
  """One trajectory as the training layout needs it: tokens, action mask, per-step grounding."""
  task_id: int
  rollout: int
  tokens: list[int]
  action_mask: list[int]  # 1 on the env actions' tokens (each closed by its end-of-turn token)
  grounding: list[float]  # g_s per step: 1 for an action the env accepted (record `valid`)
  actions: list[str | None]  # parsed action per step (None: unparsable)
  final_reward: float
  # 1 on the end-of-turn tokens the episode loop appended after a stop string (not sampled)
  forced_mask: list[int] | None = None
  # the sampler's log pi of each sampled action token (0 elsewhere); None without exact tokens
  sampler_logprobs: list[float] | None = None

  @property
  def num_steps(self) -> int:
    return len(self.grounding)

  @property
  def key(self) -> str:
    return f"{self.task_id}:{self.rollout}"


def _action_runs(mask: list[int]) -> list[tuple[int, int]]:
  """[start, end) of each run of ones in a 0/1 mask."""
  edges = np.diff(np.concatenate([[0], np.asarray(mask, np.int8), [0]]))
  return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def _forced_and_sampled(record: dict, runs: list[tuple[int, int]], length: int, exact: bool):
  """(forced mask, sampler log-probs per token or None) of a record's first num_steps actions.

  An action that did not end with the policy's own end token (finish_reason "stop" or "length")
  was closed by an appended end-of-turn token: that last token of its run is forced. With exact
  tokens the remaining tokens of each run are the sampled ones, in order, and carry the step's
  recorded `token_logprobs`.
  """
  forced = [0] * length
  logprobs = [0.0] * length if exact else None
  for step, (start, end) in zip(record["steps"], runs):
    produced_end = end - (step["finish_reason"] != "eos")
    forced[produced_end:end] = [1] * (end - produced_end)
    if exact:
      recorded = step["token_logprobs"]
      if len(recorded) != produced_end - start:
        raise ValueError(f"trajectory task {record['task_id']} rollout {record['rollout']}: "
                         f"{len(recorded)} recorded log-probs for an action of {produced_end - start} "
                         "sampled tokens; the record is corrupt")
      logprobs[start:produced_end] = recorded
  return forced, logprobs


def trajectory_sequence(record: dict, tokenizer) -> TrajectorySequence:
  """The record's exact token sequence (or, with history elision, its re-encoded conversation).

  An episode cut by the context limit in the middle of a generation has one more action run
  than steps; the sequence ends after the last completed step's action.
  """
  exact = record["tokens"] is not None
  if exact:
    tokens, mask = list(record["tokens"]), list(record["action_mask"])
  else:
    example = build_sft_example(episodes.trajectory_conversation(record), tokenizer)
    tokens, mask = example.ids, example.step_mask
  runs = _action_runs(mask)
  num_steps = record["num_steps"]
  if len(runs) < num_steps or len(runs) > num_steps + 1:
    raise ValueError(f"trajectory task {record['task_id']} rollout {record['rollout']}: {len(runs)} "
                     f"action spans in its action mask for {num_steps} steps; the record is corrupt")
  end = runs[num_steps - 1][1] if num_steps else 0
  forced, logprobs = _forced_and_sampled(record, runs[:num_steps], end, exact)
  return TrajectorySequence(
      task_id=int(record["task_id"]), rollout=int(record["rollout"]), tokens=tokens[:end],
      action_mask=mask[:end], grounding=[float(step["valid"]) for step in record["steps"]],
      actions=[step["parsed_action"] for step in record["steps"]],
      final_reward=float(record["final_reward"]), forced_mask=forced, sampler_logprobs=logprobs)


def load_sequences(records: list[dict], tokenizer, max_len: int) -> tuple[list[TrajectorySequence], dict]:
  """Sequences of the records with at least one step and at most `max_len` tokens; (kept, counts)."""
  sequences = [trajectory_sequence(r, tokenizer) for r in records]
  kept = [s for s in sequences if s.num_steps and len(s.tokens) <= max_len]
  return kept, {"no_steps": sum(not s.num_steps for s in sequences),
                "too_long": sum(s.num_steps > 0 and len(s.tokens) > max_len for s in sequences)}


def holdout_split(task_ids: list[int], fraction: float, seed: int, stream: int = 7) -> tuple[list[int], list[int]]:
  """(train, held-out) task ids: ceil(fraction * #tasks) random tasks held out (at least one task
  on each side when fraction > 0 and there are two or more tasks); `stream` names an independent
  draw for the same seed (the validation split inside the train tasks)."""
  tasks = sorted(set(task_ids))
  if fraction <= 0 or len(tasks) < 2:
    return tasks, []
  count = min(len(tasks) - 1, max(1, math.ceil(fraction * len(tasks))))
  held = set(np.random.default_rng([seed, stream]).permutation(tasks)[:count].tolist())
  return [t for t in tasks if t not in held], [t for t in tasks if t in held]


def sequence_batch(sequences: list[TrajectorySequence], seq_len: int, batch_size: int,
                   max_steps: int, pad_id: int) -> dict[str, np.ndarray]:
  """The `training.batch` layout of `sequences`, padded with step-less rows to `batch_size`,
  plus `grounding_bs` (g_s per step, 0 on padding)."""
  empty = [[]] * (batch_size - len(sequences))
  batch = make_trajectory_batch([s.tokens for s in sequences] + empty,
                                [s.action_mask for s in sequences] + empty,
                                [s.final_reward for s in sequences] + [0.0] * len(empty),
                                seq_len=seq_len, max_steps=max_steps, pad_id=pad_id,
                                forced_mask_rows=[s.forced_mask or [0] * len(s.tokens) for s in sequences] + empty)
  grounding_bs = np.zeros((batch_size, max_steps), np.float32)
  for row, sequence in enumerate(sequences):
    grounding_bs[row, :sequence.num_steps] = sequence.grounding
  return batch | {"grounding_bs": grounding_bs}


def process_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This process's contiguous block of a global batch's rows (what `to_global_batch` expects)."""
  k, n = distributed.process_index(), distributed.process_count()
  return {key: x[k * (len(x) // n):(k + 1) * (len(x) // n)] for key, x in batch.items()}


def to_host(x: jax.Array) -> np.ndarray:
  """A global array's full value on every process."""
  if distributed.process_count() == 1:
    return np.asarray(x)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def padded_length(sequences: list[TrajectorySequence], multiple: int, max_len: int) -> int:
  """The batch's sequence length: the longest sequence's, bucketed (`bucketed_length`)."""
  return bucketed_length(max(len(s.tokens) for s in sequences), multiple, max_len)


def length_groups(sequences: list[TrajectorySequence], batch_size: int, multiple: int, max_len: int):
  """(seq_len, sequences) chunks of at most `batch_size`, sorted by length (few compiled shapes)."""
  order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].tokens))
  for start in range(0, len(order), batch_size):
    rows = [sequences[i] for i in order[start:start + batch_size]]
    yield padded_length(rows, multiple, max_len), rows


def _forward_groups(sequences: list[TrajectorySequence], forward_fn, *, batch_size: int, length_bucket: int,
                    max_len: int, max_steps: int, pad_id: int, mesh) -> list[tuple[list[TrajectorySequence], np.ndarray]]:
  """(rows, host value of `forward_fn(global batch)`) for each length group of `sequences`."""
  out = []
  with jax.set_mesh(mesh):
    for seq_len, rows in length_groups(sequences, batch_size, length_bucket, max_len):
      batch = sequence_batch(rows, seq_len, batch_size, max_steps, pad_id)
      out.append((rows, to_host(forward_fn(to_global_batch(process_rows(batch), mesh)))))
  return out


def estimate_progress(state: TrainState, sequences: list[TrajectorySequence], *, num_micro_batches: int,
                      **forward) -> dict[str, np.ndarray]:
  """The estimator's c_t per step of every sequence: {sequence key: float32 [num_steps]}."""
  def values(batch):
    return forward_step_values(state, batch, at="end", num_micro_batches=num_micro_batches)
  return {sequence.key: values_bs[row, :sequence.num_steps].astype(np.float32)
          for rows, values_bs in _forward_groups(sequences, values, **forward)
          for row, sequence in enumerate(rows)}


def step_features(state: TrainState, sequences: list[TrajectorySequence], *, num_micro_batches: int,
                  **forward) -> np.ndarray:
  """[len(sequences), hidden_size] float64: each sequence's backbone hidden states at its action ends,
  summed (`forward_step_features`), in the order of `sequences`."""
  def features(batch):
    return forward_step_features(state, batch, num_micro_batches=num_micro_batches)
  by_key = {sequence.key: features_bd[row] for rows, features_bd in _forward_groups(sequences, features, **forward)
            for row, sequence in enumerate(rows)}
  return np.stack([by_key[s.key] for s in sequences]).astype(np.float64)


def reward_spread(sequences: list[TrajectorySequence], saturated_share: float = 0.85) -> dict:
  """How much the final rewards the estimator regresses onto vary: their std and the share of
  trajectories at the most common value. Logs a warning when that share is >= `saturated_share`
  (e.g. an SFT policy exploring the goals it was trained on succeeds almost always): the per-step
  contributions then have little to explain and the held-out Pearson correlation is noise or undefined."""
  rewards = np.array([s.final_reward for s in sequences], np.float64)
  if not rewards.size:
    return {"reward_std": float("nan"), "reward_modal_share": float("nan")}
  _, counts = np.unique(rewards.round(6), return_counts=True)
  spread = {"reward_std": float(rewards.std()), "reward_modal_share": float(counts.max() / rewards.size)}
  if spread["reward_modal_share"] >= saturated_share:
    logging.warning(
        "prm: %.0f%% of the %d exploration trajectories share one final reward (std %.3f): the estimator has "
        "little to learn. Explore where the SFT policy still fails: goals it was not trained on (a smaller "
        "sft.expert_episodes), a higher explore.temperature, or more explore.samples_per_task.",
        100 * spread["reward_modal_share"], rewards.size, spread["reward_std"])
  return spread


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson correlation (NaN when either side is constant)."""
  return float("nan") if x.std() < 1e-12 or y.std() < 1e-12 else float(np.corrcoef(x, y)[0, 1])


def fit_metrics(sequences: list[TrajectorySequence], progress: dict[str, np.ndarray]) -> dict[str, float]:
  """How the predicted sums sum_t c_t fit the final rewards R: MSE; R^2 = 1 - MSE / Var(R) (0: no
  better than predicting the mean reward; NaN when R is constant); Pearson correlation with R; and
  `steps_pearson`, their Pearson correlation with the number of steps (an estimator that only counts
  steps has a high one, and its positive c_t pay SPA's policy for longer episodes). NaN where a side
  is constant."""
  if not len(sequences):
    return {"mse": float("nan"), "r2": float("nan"), "pearson": float("nan"), "steps_pearson": float("nan"),
            "trajectories": 0}
  predicted = np.array([progress[s.key].sum() for s in sequences], np.float64)
  rewards = np.array([s.final_reward for s in sequences], np.float64)
  steps = np.array([s.num_steps for s in sequences], np.float64)
  mse = float(np.mean((predicted - rewards) ** 2))
  return {"mse": mse, "r2": float("nan") if rewards.std() < 1e-12 else 1.0 - mse / float(rewards.var()),
          "pearson": _pearson(predicted, rewards), "steps_pearson": _pearson(predicted, steps),
          "mean_predicted": float(predicted.mean()), "mean_reward": float(rewards.mean()),
          "trajectories": len(sequences)}


def r2_interval(sequences: list[TrajectorySequence], progress: dict[str, np.ndarray], *, seed: int,
                resamples: int = 2000, level: float = 0.95) -> tuple[float, float]:
  """Percentile bootstrap interval of `fit_metrics`' R^2 over goals: each resample draws the tasks
  with replacement and keeps all their trajectories (rollouts of one goal are not independent).
  (NaN, NaN) with fewer than two tasks or constant rewards."""
  tasks = sorted({s.task_id for s in sequences})
  if len(tasks) < 2:
    return float("nan"), float("nan")
  error_by_task = {t: [] for t in tasks}
  reward_by_task = {t: [] for t in tasks}
  for s in sequences:
    error_by_task[s.task_id].append(float(progress[s.key].sum()) - s.final_reward)
    reward_by_task[s.task_id].append(s.final_reward)
  rng = np.random.default_rng([seed, 13])
  r2s = []
  for _ in range(resamples):
    drawn = rng.choice(len(tasks), size=len(tasks))
    errors = np.concatenate([error_by_task[tasks[i]] for i in drawn])
    rewards = np.concatenate([reward_by_task[tasks[i]] for i in drawn])
    if rewards.std() > 1e-12:
      r2s.append(1.0 - float(np.mean(errors ** 2)) / float(rewards.var()))
  if not r2s:
    return float("nan"), float("nan")
  low, high = np.quantile(r2s, [(1 - level) / 2, (1 + level) / 2])
  return float(low), float(high)


def counting_baseline_r2(train: list[TrajectorySequence], heldout: list[TrajectorySequence]) -> float:
  """R^2 on `heldout` of a least-squares line through the number of steps and the number of
  ungrounded steps, fit on `train`: what a predictor reading nothing but those two counts reaches, a
  floor for the progress estimator (NaN when a side is empty or the held-out rewards are constant)."""
  def features(part):
    return np.array([[1.0, s.num_steps, s.num_steps - sum(s.grounding)] for s in part], np.float64)
  rewards = np.array([s.final_reward for s in heldout], np.float64)
  if not train or not heldout or rewards.std() < 1e-12:
    return float("nan")
  coef, *_ = np.linalg.lstsq(features(train), np.array([s.final_reward for s in train], np.float64), rcond=None)
  return 1.0 - float(np.mean((features(heldout) @ coef - rewards) ** 2)) / float(rewards.var())


PROBE_L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)


@dataclasses.dataclass(frozen=True)
class LinearProbe:
  """The scalar head fit by ridge regression on frozen features: c_t = kernel . h_t + bias."""
  kernel: np.ndarray  # [hidden_size]
  bias: float
  l2: float  # the chosen penalty, relative to the features' mean squared value
  cv_r2: float  # R^2 of the sums under task-grouped cross-validation at that penalty (NaN: no CV)


def _design(features_nd: np.ndarray, steps_n: np.ndarray) -> np.ndarray:
  """[F, T]: the summed step features and the number of steps, whose coefficients are (kernel, bias)."""
  return np.concatenate([features_nd, steps_n[:, None]], axis=1)


def _ridge(x_nk: np.ndarray, rewards_n: np.ndarray, l2: float) -> np.ndarray:
  """argmin_(w, b) |R - F w - T b|^2 / N + l2 * s * |w|^2 over the `_design` matrix [F, T], s = the mean
  of diag(F^T F) / N (so that `l2` does not depend on the features' scale); the step term b is not
  penalised. Returns (w, b)."""
  gram_kk = x_nk.T @ x_nk / len(x_nk)
  scale = float(np.mean(np.diag(gram_kk)[:-1])) or 1.0
  penalty_k = np.full(x_nk.shape[1], l2 * scale)
  penalty_k[-1] = 0.0
  return np.linalg.solve(gram_kk + np.diag(penalty_k), x_nk.T @ rewards_n / len(x_nk))


def fit_linear_probe(features_nd: np.ndarray, steps_n: np.ndarray, rewards_n: np.ndarray, groups_n: np.ndarray,
                     *, seed: int, folds: int = 5, l2_grid: tuple[float, ...] = PROBE_L2_GRID) -> LinearProbe:
  """The progress head that best predicts the final rewards R from the frozen backbone: since
  sum_t c_t = kernel . (sum_t h_t) + bias * T, a ridge regression of R on the summed step features and
  the number of steps. The penalty is chosen from `l2_grid` by cross-validation over folds of whole
  groups (tasks: no task's rollouts on both sides), then the probe is refit on everything (linear
  probing before fine-tuning, LP-FT, Kumar et al. 2022: the head starts where the features already
  point, instead of at zero where every c_t is the mean reward per step)."""
  tasks = np.random.default_rng([seed, 11]).permutation(np.unique(groups_n))
  fold_of_task = {task: i % folds for i, task in enumerate(tasks)}
  fold_n = np.array([fold_of_task[g] for g in groups_n])
  x_nk = _design(features_nd, steps_n)
  cv_mse = {}
  if len(tasks) >= 2 and np.std(rewards_n) > 1e-12:
    for l2 in l2_grid:
      errors = np.empty_like(rewards_n)
      for fold in np.unique(fold_n):
        held, kept = fold_n == fold, fold_n != fold
        errors[held] = rewards_n[held] - x_nk[held] @ _ridge(x_nk[kept], rewards_n[kept], l2)
      cv_mse[l2] = float(np.mean(errors ** 2))
  l2 = min(cv_mse, key=cv_mse.get) if cv_mse else l2_grid[len(l2_grid) // 2]
  coef = _ridge(x_nk, rewards_n, l2)
  cv_r2 = 1.0 - cv_mse[l2] / float(np.var(rewards_n)) if cv_mse else float("nan")
  return LinearProbe(kernel=coef[:-1], bias=float(coef[-1]), l2=l2, cv_r2=cv_r2)


def probe_head(model: ValueModel, train: list[TrajectorySequence], forward: dict, seed: int) -> LinearProbe:
  """Fits `fit_linear_probe` on `train`'s features under `model`'s backbone and sets its head to it
  (every process computes the same probe from all-gathered features)."""
  features_nd = step_features(frozen_train_state(model), train, **forward)
  probe = fit_linear_probe(features_nd, np.array([s.num_steps for s in train], np.float64),
                           np.array([s.final_reward for s in train], np.float64),
                           np.array([s.task_id for s in train]), seed=seed)
  model.head.kernel[...] = jax.numpy.asarray(probe.kernel, jax.numpy.float32)
  model.head.bias[...] = jax.numpy.asarray(probe.bias, jax.numpy.float32)
  shard_model(model, forward["mesh"])
  return probe


def warn_if_uninformative(fit: dict[str, float], where: str, baseline_r2: float = float("nan")) -> bool:
  """Logs a warning (and returns True) when the estimator predicts the final rewards of `where`'s
  trajectories no better than their mean (R^2 <= 0) or worse than `baseline_r2` (counting_baseline_r2):
  SPA's per-step rewards then carry less of the outcome than two counts would."""
  r2 = fit.get("r2", float("nan"))
  if not (r2 <= 0 or r2 < baseline_r2):  # NaN (constant rewards) is reward_spread's warning
    return False
  baseline = (f", a line through the numbers of steps and of ungrounded actions fits it with R^2 {baseline_r2:.2f}"
              if np.isfinite(baseline_r2) else "")
  logging.warning(
      "prm: on %s trajectories the progress estimator's sums fit the final reward with R^2 %.2f (Pearson %.2f; "
      "%.2f with the number of steps)%s. SPA's per-step rewards would carry little of the outcome, and where "
      "every c_t is positive they pay the policy for longer episodes. Start its head from the linear probe "
      "(prm.head_init=probe) and keep validation goals to choose among it and the epochs (prm.validation_fraction; "
      "the summary's kept_epoch and probe_heldout_r2 say what was kept and what the probe reached: fine-tuning at "
      "too high a prm.learning_rate undoes the probe), explore more and more varied goals "
      "(explore.max_tasks, explore.samples_per_task, goals the SFT policy still fails), and look at "
      "plots/prm_progress.png.",
      where, r2, fit["pearson"], fit["steps_pearson"], baseline)
  return True


# ----------------------------------------------------------------------------- the estimator model


def activation_dtype(cfg: ml_collections.ConfigDict) -> str:
  return cfg.prm.dtype or cfg.model.dtype


def _estimator_module(backbone: Llama, cfg: ml_collections.ConfigDict, seed: int) -> ValueModel:
  if cfg.prm.finetune == "lora":
    lora = cfg.model.lora
    apply_lora(backbone, lora.rank, lora.alpha, tuple(lora.targets.split(",")), rngs=nnx.Rngs(seed + 1))
  return ValueModel(backbone, nnx.Rngs(seed + 2))


def load_backbone(cfg: ml_collections.ConfigDict, path, mesh, dtype: str) -> tuple[LlamaConfig, Llama]:
  return load_hf(path, mesh=mesh, **common.run_settings(cfg, dtype))


def backbone_config(cfg: ml_collections.ConfigDict, path, dtype: str) -> LlamaConfig:
  """The LlamaConfig of the HF directory `path` (no weights read)."""
  hf_config = json.loads((pathlib.Path(path) / "config.json").read_text())
  return LlamaConfig.from_hf_dict(hf_config, **common.run_settings(cfg, dtype))


def estimator_dir(ws: Workspace):
  return ws.stage_dir("prm") / ESTIMATOR_DIR


def save_estimator(ws: Workspace, model: ValueModel, model_cfg) -> list[str]:
  """prm/estimator/: the backbone as an HF directory (LoRA merged) and head.safetensors.
  Every process calls; process 0 writes."""
  out = save_hf(model.backbone, model_cfg, estimator_dir(ws))
  head = {"kernel": to_host(model.head.kernel[...]), "bias": to_host(model.head.bias[...])}
  if distributed.is_main_process():
    save_file({k: np.asarray(v, np.float32) for k, v in head.items()}, out / HEAD_FILE)
  distributed.barrier("prm-estimator")
  return [str(path) for path in sorted(out.iterdir())]


def load_estimator(cfg: ml_collections.ConfigDict, ws: Workspace, mesh) -> TrainState:
  """The frozen estimator written by this stage, as a (never updated) train state for
  `forward_step_values`."""
  path = estimator_dir(ws)
  if not (path / HEAD_FILE).exists():
    raise FileNotFoundError(f"No progress estimator in {path}: run the prm stage first "
                            "(--config.run.targets=prm).")
  model_cfg, backbone = load_backbone(cfg, path, mesh, activation_dtype(cfg))
  model = ValueModel(backbone, nnx.Rngs(0))
  head = load_file(str(path / HEAD_FILE))
  model.head.kernel[...] = head["kernel"]
  model.head.bias[...] = head["bias"]
  shard_model(model, mesh)
  return frozen_train_state(model)


# ----------------------------------------------------------------------------- training


def optimizer_config(cfg: ml_collections.ConfigDict, total_steps: int) -> OptimizerConfig:
  """AdamW, linear warmup to prm.learning_rate then constant (the released WarmupLR)."""
  return OptimizerConfig(learning_rate=cfg.prm.learning_rate, schedule="constant",
                         warmup_steps=min(cfg.prm.warmup_steps, total_steps), total_steps=total_steps,
                         weight_decay=cfg.prm.weight_decay, grad_clip_norm=cfg.prm.grad_clip)


def run_fingerprint(cfg: ml_collections.ConfigDict, stage: str) -> str:
  """The stage's pipeline fingerprint: its config AND its inputs' (a checkpoint trained on other
  exploration data or another SFT policy is never resumed)."""
  return pipeline.fingerprints(cfg, [stage])[stage]


def checkpointer(cfg: ml_collections.ConfigDict, ws: Workspace) -> Checkpointer:
  """checkpoints/prm/<fingerprint>/; checkpoints of other configs or inputs are removed."""
  root = ws.checkpoint_dir("prm")
  current = root / run_fingerprint(cfg, "prm")
  if distributed.is_main_process():
    for stale in root.iterdir():
      if stale != current:
        shutil.rmtree(stale, ignore_errors=True)
  distributed.barrier("prm-checkpoints")
  return Checkpointer(current, save_every=cfg.prm.checkpoint_every, keep=cfg.prm.keep_checkpoints)


def _split_sequences(cfg, ws, sequences) -> dict[str, list[TrajectorySequence]]:
  """{"train", "validation", "heldout"}: sequences of disjoint task sets (prm/split.json)."""
  rest_ids, heldout_ids = holdout_split([s.task_id for s in sequences], cfg.prm.holdout_fraction, cfg.seed)
  train_ids, validation_ids = holdout_split(rest_ids, cfg.prm.validation_fraction, cfg.seed, stream=11)
  ids = {"train": train_ids, "validation": validation_ids, "heldout": heldout_ids}
  if distributed.is_main_process():
    write_json_atomic(ws.stage_dir("prm") / SPLIT_FILE, ids)
  part_of = {task: name for name, part in ids.items() for task in part}
  return {name: [s for s in sequences if part_of[s.task_id] == name] for name in ids}


def estimator_forward(cfg: ml_collections.ConfigDict, tokenizer, mesh) -> dict:
  """Keyword arguments of `estimate_progress` (and `step_features`) for this config."""
  return dict(batch_size=cfg.prm.batch_size, num_micro_batches=cfg.prm.batch_size // cfg.prm.micro_batch_size,
              length_bucket=cfg.prm.length_bucket, max_len=cfg.prm.max_len, max_steps=cfg.env.max_steps,
              pad_id=tokenizer.pad_id, mesh=mesh)


def initial_head(cfg: ml_collections.ConfigDict, model: ValueModel, train: list[TrajectorySequence],
                 heldout: list[TrajectorySequence], forward: dict) -> dict:
  """Sets the estimator's head per `prm.head_init` before training: "zero" leaves it at 0, "probe"
  fits it to the SFT backbone's features (`probe_head`). Returns the probe's summary (empty for
  "zero"): its penalty, its cross-validated R^2 and the held-out fit of the probed head, before any
  fine-tuning."""
  if cfg.prm.head_init == "zero":
    return {}
  probe = probe_head(model, train, forward, cfg.seed)
  summary = {"probe_l2": probe.l2, "probe_cv_r2": _json_number(probe.cv_r2)}
  if heldout:
    fit = fit_metrics(heldout, estimate_progress(frozen_train_state(model), heldout, **forward))
    summary |= {"probe_heldout_r2": _json_number(fit["r2"]), "probe_heldout_pearson": _json_number(fit["pearson"])}
  logging.info("prm: linear probe of the SFT features (l2 %g): %s", probe.l2, summary)
  return summary


def read_split(ws: Workspace) -> dict[str, list[int]]:
  """The task ids the estimator was trained on ("train"), chosen on ("validation", absent in
  workspaces from before the selection) and held out from ("heldout")."""
  return json.loads((ws.stage_dir("prm") / SPLIT_FILE).read_text())


def run(cfg: ml_collections.ConfigDict, ws: Workspace) -> dict:
  tokenizer = common.load_tokenizer(cfg, ws)
  mesh = common.make_mesh(cfg)
  max_steps, pad_id = cfg.env.max_steps, tokenizer.pad_id
  sequences, dropped = load_sequences(read_trajectories(ws, EXPLORE), tokenizer, cfg.prm.max_len)
  parts = _split_sequences(cfg, ws, sequences)
  train, validation, heldout = parts["train"], parts["validation"], parts["heldout"]
  if not train:
    raise ValueError(f"no exploration trajectory to train the progress estimator on (dropped: {dropped}); "
                     "run more exploration (explore.max_tasks) or raise prm.max_len")
  spread = reward_spread(sequences)
  lengths = [len(s.tokens) for s in train]
  plan = [(epoch, *batch) for epoch in range(cfg.prm.epochs)
          for batch in epoch_batches(lengths, cfg.prm.batch_size, cfg.prm.max_len, cfg.prm.length_bucket,
                                     cfg.seed, epoch)]
  tx = make_optimizer(optimizer_config(cfg, len(plan)))
  trainable = TRAINABLE[cfg.prm.finetune]
  num_micro = cfg.prm.batch_size // cfg.prm.micro_batch_size
  sft_dir = common.policy_dir(ws, "sft")

  ckpt = checkpointer(cfg, ws)
  resumed = ckpt.latest_step() is not None
  forward = estimator_forward(cfg, tokenizer, mesh)

  def measure(state) -> tuple[dict, dict]:
    """Per part: the estimator's c_t, and their fit_metrics."""
    progress = {name: estimate_progress(state, part, **forward) for name, part in parts.items()}
    return progress, {name: fit_metrics(part, progress[name]) for name, part in parts.items()}

  if resumed:
    model_cfg = backbone_config(cfg, sft_dir, activation_dtype(cfg))
    abstract = abstract_train_state(lambda: _estimator_module(Llama(model_cfg, rngs=nnx.Rngs(0)), cfg, cfg.seed),
                                    tx, trainable=trainable, mesh=mesh)
    state, metadata = ckpt.restore(abstract)
    probe, best = metadata.get("probe", {}), metadata.get("best")
    logging.info("prm: resuming from step %d of %d", int(state.step), len(plan))
  else:
    model_cfg, backbone = load_backbone(cfg, sft_dir, mesh, activation_dtype(cfg))
    model = shard_model(_estimator_module(backbone, cfg, cfg.seed), mesh)
    probe = initial_head(cfg, model, train, heldout, forward)
    state = create_train_state(model, tx, trainable=trainable, seed=cfg.seed)
    best = None
    if validation:  # epoch 0, the initial head, is a candidate too (its validation fit only: no train pass)
      best = _keep_if_best(ws, state, model_cfg, 0,
                           fit_metrics(validation, estimate_progress(state, validation, **forward)), None)

  step_fn = make_progress_step(state, num_micro_batches=num_micro)
  metadata = {"fingerprint": run_fingerprint(cfg, "prm"), "total_steps": len(plan), "probe": probe, "best": best}

  progress, fit = {}, {}
  with ckpt, tracking.MetricsWriter(ws, "prm", cfg.tracking.tensorboard, append=resumed) as writer, \
      tracking.progress(len(plan), "prm", unit="step", enabled=cfg.tracking.progress) as bar:
    if not plan and not resumed:  # prm.epochs=0: the probed head is the estimator; its fit on every part
      progress, fit = measure(state)
      writer.write(0, {f"{name}_{key}": value for name in parts for key, value in fit[name].items()
                       if key != "trajectories"} | {"epoch": 0})
    elif best is not None and not resumed:
      writer.write(0, {f"validation_{key}": value for key, value in best["fit"].items() if key != "trajectories"}
                   | {"epoch": 0})
    bar.update(int(state.step))
    for step in range(int(state.step), len(plan)):
      epoch, _, rows = plan[step]
      chosen = [train[i] for i in rows]
      seq_len = padded_length(chosen, cfg.prm.length_bucket, cfg.prm.max_len)
      batch = sequence_batch(chosen, seq_len, cfg.prm.batch_size, max_steps, pad_id)
      with jax.set_mesh(mesh):
        state, metrics = step_fn(state, to_global_batch(process_rows(batch), mesh))
      bar.update(1)
      bar.set_postfix(loss=f"{float(metrics['progress_loss']):.4f}")
      scalars = dict(metrics)
      if step + 1 == len(plan) or plan[step + 1][0] != epoch:  # end of an epoch
        progress, fit = measure(state)
        scalars |= {f"{name}_{key}": value for name in parts for key, value in fit[name].items()
                    if key != "trajectories"}
        scalars["epoch"] = epoch + 1
        logging.info("prm epoch %d: %s", epoch + 1, fit)
        if validation:
          best = metadata["best"] = _keep_if_best(ws, state, model_cfg, epoch + 1, fit["validation"], best)
      if (step + 1) % cfg.tracking.log_every == 0 or "epoch" in scalars:
        writer.write(step + 1, scalars)
      ckpt.save(step + 1, state, metadata, force=step + 1 == len(plan))

  if best is None:  # no validation tasks: the last epoch's estimator
    save_estimator(ws, state.model(), model_cfg)
  elif best["epoch"] != cfg.prm.epochs:  # an earlier epoch's estimator (exported then) is the stage's
    logging.info("prm: keeping epoch %d's estimator (validation MSE %.4f; the last epoch's: %s)", best["epoch"],
                 best["fit"]["mse"], fit.get("validation", {}).get("mse", "resumed"))
    state, fit = load_estimator(cfg, ws, mesh), {}
  outputs = [str(path) for path in sorted(estimator_dir(ws).iterdir())] + [str(ws.stage_dir("prm") / SPLIT_FILE)]
  if not fit:  # resumed after the last step, or an earlier epoch kept: the kept estimator's fit
    progress, fit = measure(state)
  if cfg.tracking.plots:
    examples = example_trajectories(heldout or train, cfg.prm.plot_examples)
    examples_progress = estimate_progress(state, examples, **forward)  # collectives: every process runs it
  if cfg.tracking.plots and distributed.is_main_process():
    tracking.plot_metrics(ws.metrics_path("prm"), ws.plot_path("prm"), title="Progress estimator")
    plot_progress(examples, examples_progress, ws.plot_path(PROGRESS_PLOT),
                  title="held-out" if heldout else "train (no held-out tasks)")
    outputs += [str(ws.plot_path("prm")), str(ws.plot_path(PROGRESS_PLOT))]
  baseline_r2 = counting_baseline_r2(train + validation, heldout)
  warn_if_uninformative(fit["heldout"] if heldout else fit["train"], "held-out" if heldout else "train", baseline_r2)
  return {"steps": len(plan), "resumed": resumed, "train_trajectories": len(train),
          "validation_trajectories": len(validation), "kept_epoch": cfg.prm.epochs if best is None else best["epoch"],
          **probe, "heldout_baseline_r2": _json_number(baseline_r2),
          "heldout_r2_ci95": [_json_number(x) for x in r2_interval(heldout, progress["heldout"], seed=cfg.seed)],
          "heldout_trajectories": len(heldout), "dropped": dropped, **spread,
          **{f"{name}_{key}": _json_number(value) for name, part in fit.items() for key, value in part.items()},
          "outputs": outputs}


def _keep_if_best(ws: Workspace, state: TrainState, model_cfg, epoch: int, fit: dict, best: dict | None) -> dict:
  """`best` ({"epoch", "fit"}: the exported estimator's epoch and validation fit), replaced by this
  epoch's when its validation MSE is lower; the estimator is exported then (every process calls)."""
  if best is not None and not fit["mse"] < best["fit"]["mse"]:
    return best
  save_estimator(ws, state.model(), model_cfg)
  return {"epoch": epoch, "fit": {key: _json_number(value) for key, value in fit.items()}}


def _json_number(value):
  return None if isinstance(value, float) and math.isnan(value) else value


# ----------------------------------------------------------------------------- plots


def example_trajectories(sequences: list[TrajectorySequence], count: int) -> list[TrajectorySequence]:
  """Up to `count` multi-step trajectories spread over the range of final rewards."""
  pool = sorted([s for s in sequences if s.num_steps > 1] or sequences, key=lambda s: (s.final_reward, s.key))
  if len(pool) <= count:
    return pool
  return [pool[i] for i in np.linspace(0, len(pool) - 1, count).round().astype(int)]


def plot_progress(sequences: list[TrajectorySequence], progress: dict[str, np.ndarray], out_png,
                  title: str) -> None:
  """One panel per trajectory: bars of c_t per step labelled with the action (red: not grounded)."""
  fig, axes = plt.subplots(len(sequences), 1, figsize=(9, 2.6 * len(sequences)), squeeze=False)
  for ax, sequence in zip(axes[:, 0], sequences):
    values = progress[sequence.key]
    colors = ["tab:blue" if g else "tab:red" for g in sequence.grounding]
    ax.bar(np.arange(len(values)), values, color=colors)
    ax.axhline(0.0, color="black", linewidth=0.6)
    labels = [(a or "(no action)")[:28] for a in sequence.actions]
    ax.set_xticks(np.arange(len(values)), labels, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("c_t")
    ax.set_title(f"task {sequence.task_id} rollout {sequence.rollout}: R = {sequence.final_reward:.2f}, "
                 f"sum c_t = {values.sum():.2f}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
  fig.suptitle(f"Per-step progress on {title} trajectories (red: action not grounded)")
  fig.tight_layout()
  fig.savefig(out_png, dpi=100)
  plt.close(fig)
