"""Jitted update and forward steps over the trajectory layout of `batch.py`.

Update steps are pure `(state, batch) -> (state, metrics)` with the state donated. The batch is a
dict of global arrays sharded over the "batch" logical axis (`global_batch.to_global_batch`);
parameters keep the shardings they were created with (`spa_jax.sharding` rules table) and the
updated state is constrained back onto them. Call the steps under `with jax.set_mesh(mesh):` so
the model's activation constraints apply.

Micro-batching: a batch of B rows is cut into M strided micro-batches (micro-batch m holds rows
m, m + M, ...: every micro-batch spans all batch shards). Gradients of
(loss sum of the micro-batch) / (count over the whole batch) are summed in a `lax.scan`, so the
result equals the full-batch mean exactly and only one micro-batch's activations are live.
Update steps take no rng: no loss samples (there is no dropout).

The PPO update (`PPOStep`) takes its micro-batches as separate arrays instead, each cut to its own
length, and sums their gradients outside one program (module `PPOStep` doc).

`compile_ahead` compiles an update step for several batch shapes before a training loop, side by side,
so that no shape compiles mid-loop.
"""

import concurrent.futures
import dataclasses
import functools
import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from spa_jax.sharding import constrain
from spa_jax.training.batch import gather_steps, token_entropy, token_logprobs
from spa_jax.training.losses import ppo_policy_loss, progress_loss, sft_loss, value_loss
from spa_jax.training.sum_count import SumCount, masked_sum_count
from spa_jax.training.train_state import TrainState

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


# ----------------------------------------------------------------------------- micro-batching


def split_micro_batches(batch: Batch, num_micro_batches: int) -> Batch:
  """[B, ...] -> [M, B / M, ...] with micro-batch m = rows m, m + M, m + 2M, ..."""
  def split(x):
    rows = x.shape[0]
    if rows % num_micro_batches:
      raise ValueError(f"batch of {rows} rows does not split into {num_micro_batches} "
                       "micro-batches; make the batch size a multiple of the micro-batch count")
    x = x.reshape(rows // num_micro_batches, num_micro_batches, *x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def merge_micro_batches(x_m: jax.Array) -> jax.Array:
  """Inverse of `split_micro_batches` for one array: [M, B / M, ...] -> [B, ...]."""
  x = jnp.swapaxes(x_m, 0, 1)
  return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _constrain_rows(micro: Batch) -> Batch:
  return jax.tree.map(lambda x: constrain(x, ("batch",) + (None,) * (x.ndim - 1)), micro)


def accumulate_gradients(loss_fn: Callable[[Any, Batch], tuple[jax.Array, dict[str, SumCount]]],
                         params: Any, batch: Batch, num_micro_batches: int):
  """Sum over micro-batches of grad(loss_fn) and of its SumCount metrics: (grads, metrics)."""
  grad_fn = jax.grad(loss_fn, has_aux=True)
  micro_batches = split_micro_batches(batch, num_micro_batches)
  first = jax.tree.map(lambda x: x[0], micro_batches)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(grad_fn, params, first))

  def add_micro_batch(totals, micro):
    return jax.tree.map(jnp.add, totals, grad_fn(params, _constrain_rows(micro))), None

  totals, _ = jax.lax.scan(add_micro_batch, zeros, micro_batches)
  return totals


def map_micro_batches(fn: Callable[[Batch], jax.Array], batch: Batch,
                      num_micro_batches: int) -> jax.Array:
  """`fn` applied per micro-batch (sequentially, to bound memory); rows come back in order."""
  outputs_m = jax.lax.map(lambda micro: fn(_constrain_rows(micro)),
                          split_micro_batches(batch, num_micro_batches))
  return merge_micro_batches(outputs_m)


def summarize(metrics: dict[str, SumCount]) -> Metrics:
  """Means of SumCount metrics."""
  return {name: value.mean() for name, value in metrics.items()}


def _constrain_to(tree: Any, shardings: list[Any]) -> Any:
  """Pin a traced tree's leaves onto the (named) shardings the input state's leaves had."""
  def pin(x, sharding):
    if isinstance(sharding, jax.sharding.NamedSharding):
      return jax.lax.with_sharding_constraint(x, sharding)
    return x
  leaves, treedef = jax.tree.flatten(tree)
  return jax.tree.unflatten(treedef, [pin(x, s) for x, s in zip(leaves, shardings, strict=True)])


def _jit_update(step_fn, state_template):
  """jit `step_fn(state, batch, *args)` with the state donated and kept on its input shardings."""
  shardings = [x.sharding for x in jax.tree.leaves(state_template)]

  def pinned(state, batch, *args):
    new_state, metrics = step_fn(state, batch, *args)
    return _constrain_to(new_state, shardings), metrics

  return jax.jit(pinned, donate_argnums=0)


def compile_ahead(step_fn, state: Any, batches: Mapping[Hashable, Batch], mesh: jax.sharding.Mesh
                  ) -> dict[Hashable, jax.stages.Compiled]:
  """The jitted `step_fn(state, batch)` compiled for each of `batches` (abstract arrays, e.g.
  `global_batch_shapes`, or real ones), keyed as they are: call these executables in place of `step_fn`
  (same state donation; a batch of another shape or sharding raises instead of compiling).

  The compilations run in threads: XLA compiles without the GIL, so they overlap (tracing does not)."""
  def compile_one(batch):
    with jax.set_mesh(mesh):  # the mesh context is per thread
      return step_fn.lower(state, batch).compile()

  with concurrent.futures.ThreadPoolExecutor(max(1, len(batches))) as pool:
    return dict(zip(batches, pool.map(compile_one, batches.values())))


# ----------------------------------------------------------------------------- SFT


def _sft_loss_fn(params, micro, *, state: TrainState, num_tokens):
  model = nnx.merge(state.graphdef, params, state.frozen)
  logits_btv, _, _ = model(micro["tokens_bt"], micro["positions_bt"])
  loss = sft_loss(logits_btv, micro["tokens_bt"], micro["loss_mask_bt"])
  return loss.total / num_tokens, {"sft_loss": loss}


def make_sft_step(state_template: TrainState, *, num_micro_batches: int = 1):
  """Jitted `(state, batch) -> (state, metrics)`: one AdamW update on the agent-token NLL.

  Needs `tokens_bt`, `positions_bt`, `loss_mask_bt`. Metrics: sft_loss, num_tokens, grad_norm.
  """
  def step(state, batch):
    num_tokens = jnp.maximum(jnp.sum(batch["loss_mask_bt"]), 1.0)
    loss_fn = functools.partial(_sft_loss_fn, state=state, num_tokens=num_tokens)
    grads, metrics = accumulate_gradients(loss_fn, state.params, batch, num_micro_batches)
    return state.apply_gradients(grads), summarize(metrics) | {
        "num_tokens": jnp.sum(batch["loss_mask_bt"]), "grad_norm": optax.tree.norm(grads)}
  return _jit_update(step, state_template)


# ----------------------------------------------------------------------------- progress estimator


def _progress_loss_fn(params, micro, *, state: TrainState, num_trajectories):
  model = nnx.merge(state.graphdef, params, state.frozen)
  values_bs = gather_steps(model(micro["tokens_bt"], micro["positions_bt"]),
                           micro["step_end_idx_bs"])
  loss = progress_loss(values_bs, micro["step_mask_bs"], micro["final_reward_b"])
  return loss.total / num_trajectories, {"progress_loss": loss}


def make_progress_step(state_template: TrainState, *, num_micro_batches: int = 1):
  """Jitted `(state, batch) -> (state, metrics)` for a `ValueModel` progress estimator.

  Loss: mean over trajectories of (R - sum_s c_s)^2 with c_s read at `step_end_idx_bs`.
  Needs `tokens_bt`, `positions_bt`, `step_end_idx_bs`, `step_mask_bs`, `final_reward_b`.
  """
  def step(state, batch):
    num_trajectories = jnp.maximum(jnp.sum(jnp.any(batch["step_mask_bs"] > 0, axis=-1)), 1)
    loss_fn = functools.partial(_progress_loss_fn, state=state,
                                num_trajectories=num_trajectories.astype(jnp.float32))
    grads, metrics = accumulate_gradients(loss_fn, state.params, batch, num_micro_batches)
    return state.apply_gradients(grads), summarize(metrics) | {
        "grad_norm": optax.tree.norm(grads)}
  return _jit_update(step, state_template)


# ----------------------------------------------------------------------------- PPO


class PPOState(struct.PyTreeNode):
  """Policy and a separate critic (`spa_jax.models.ValueModel`), each with its own optimizer."""

  policy: TrainState
  critic: TrainState


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  """Loss hyper-parameters of one PPO update (static under jit)."""

  clip_eps: float = 0.2
  value_clip_eps: float = 0.2
  vf_coef: float = 0.1
  entropy_coef: float = 0.0
  max_mean_ratio: float = 10.0  # skip the update when the batch's mean ratio exceeds this
  # Leave the policy as it is when the mini-batch's approx KL (mean 0.5 (log r)^2 over its tokens, at
  # the current parameters, before this update) exceeds this; the critic still updates. inf: never.
  max_update_kl: float = math.inf


def _ppo_loss_sums(params, micro, *, state: PPOState, cfg: PPOConfig):
  """(objective, SumCount metrics) of one micro-batch, unnormalised: the sum over its agent tokens of
  the clipped policy loss (less the entropy bonus) plus the sum over its steps of the value loss. The
  two terms touch disjoint parameters (policy, critic), so one gradient holds both sums' gradients,
  each normalised later by the whole mini-batch's count (`PPOStep`)."""
  policy_params, critic_params = params
  policy = nnx.merge(state.policy.graphdef, policy_params, state.policy.frozen)
  logits_btv, _, _ = policy(micro["tokens_bt"], micro["positions_bt"])
  logp_bt = token_logprobs(logits_btv, micro["tokens_bt"])
  metrics = ppo_policy_loss(logp_bt, micro["old_logp_bt"], micro["advantages_bt"],
                            micro["loss_mask_bt"], clip_eps=cfg.clip_eps)
  objective = metrics["policy_loss"].total
  if cfg.entropy_coef:
    metrics["entropy"] = masked_sum_count(token_entropy(logits_btv), micro["loss_mask_bt"])
    objective = objective - cfg.entropy_coef * metrics["entropy"].total

  critic = nnx.merge(state.critic.graphdef, critic_params, state.critic.frozen)
  values_bs = gather_steps(critic(micro["tokens_bt"], micro["positions_bt"]),
                           micro["step_start_idx_bs"])
  metrics |= value_loss(values_bs, micro["old_values_bs"], micro["returns_bs"],
                        micro["step_mask_bs"], clip_eps=cfg.value_clip_eps)
  return objective + metrics["value_loss"].total, metrics


class PPOStep:
  """`step(ppo_state, micro_batches, train_policy=True) -> (ppo_state, metrics)`: one clipped policy +
  clipped value update on a mini-batch given as micro-batches (one `Batch`, or a sequence of them)
  that may each have their own length: each is cut after its own last step (`batch.trim_to_steps`),
  so a mini-batch of short and long trajectories pays for each row's length, not the longest one's.
  Each micro-batch's gradient of the unnormalised loss sums is added up on the device (one program per
  micro-batch shape), then the sums are divided by the mini-batch's token and step counts and applied
  (one program): the same update as the mean losses over the whole mini-batch. With `train_policy`
  False (pass a numpy bool: one compiled program for both) only the critic's (critic warm-up: the
  policy and its optimizer state are returned as they came).

  Needs the layout keys plus `old_logp_bt`, `advantages_bt` (from `ppo_targets`), `returns_bs`
  and `old_values_bs`. If the mini-batch's mean ratio exceeds `cfg.max_mean_ratio`, or its gradients
  are not finite, the state is returned unchanged and metrics["skipped"] is 1. If its approx KL exceeds
  `cfg.max_update_kl`, only the critic updates and metrics["beyond_kl"] is 1; metrics["policy_updated"]
  is 1 when the policy's update was applied.
  """

  def __init__(self, state_template: PPOState, cfg: PPOConfig):
    self.cfg = cfg
    grad_fn = jax.grad(functools.partial(_ppo_loss_sums, cfg=cfg), has_aux=True)

    def gradient_sums(state, micro):
      return grad_fn((state.policy.params, state.critic.params), _constrain_rows(micro), state=state)

    def accumulate(state, micro, totals):
      return jax.tree.map(jnp.add, totals, gradient_sums(state, micro))

    self._gradient_sums = gradient_sums
    self._accumulate = jax.jit(accumulate, donate_argnums=2)
    param_shardings = [x.sharding for x in jax.tree.leaves((state_template.policy.params,
                                                            state_template.critic.params))]
    self._zero_grads = jax.jit(lambda state: _constrain_to(
        jax.tree.map(jnp.zeros_like, (state.policy.params, state.critic.params)), param_shardings))
    self._metric_names = None
    self._apply = _jit_update(self._apply_sums, state_template)

  def _apply_sums(self, state, totals, train_policy):
    (policy_sums, critic_sums), metrics = totals
    num_tokens = jnp.maximum(metrics["policy_loss"].count, 1.0)
    num_steps = jnp.maximum(metrics["value_loss"].count, 1.0)
    policy_grads = jax.tree.map(lambda g: g / num_tokens, policy_sums)
    critic_grads = jax.tree.map(lambda g: g * (self.cfg.vf_coef / num_steps), critic_sums)
    means = summarize(metrics)
    policy_norm, critic_norm = optax.tree.norm(policy_grads), optax.tree.norm(critic_grads)
    skipped = (means["ratio"] > self.cfg.max_mean_ratio) | ~jnp.isfinite(policy_norm + critic_norm)
    beyond_kl = means["approx_kl"] > self.cfg.max_update_kl
    update_policy = jnp.logical_and(train_policy, ~beyond_kl)

    def update(state):
      critic = state.critic.apply_gradients(critic_grads)
      # the critic's update (its global-norm clipping reduces across devices) finishes before the policy's
      # starts: XLA:CPU runs independent collectives of one program concurrently, in different orders on
      # different devices, and on a few cores they deadlock (about 1 update in 10 of tests/training/
      # sharded_equivalence.py on 8 forced host devices without this; none in 90 with it:
      # bench/sharded_stress.sh)
      critic, policy = jax.lax.optimization_barrier((critic, state.policy))
      policy = jax.lax.cond(update_policy, lambda policy: policy.apply_gradients(policy_grads), lambda policy: policy,
                            policy)
      return PPOState(policy=policy, critic=critic)
    new_state = jax.lax.cond(skipped, lambda state: state, update, state)
    return new_state, means | {
        "skipped": skipped.astype(jnp.float32), "beyond_kl": beyond_kl.astype(jnp.float32),
        "policy_updated": jnp.logical_and(update_policy, ~skipped).astype(jnp.float32),
        "policy_grad_norm": policy_norm, "critic_grad_norm": critic_norm}

  def __call__(self, state: PPOState, micro_batches: Batch | list[Batch], train_policy=True):
    micro_batches = [micro_batches] if isinstance(micro_batches, Mapping) else list(micro_batches)
    if not micro_batches:
      raise ValueError("a PPO update needs at least one micro-batch")
    if self._metric_names is None:  # the metrics' names (one abstract trace)
      _, metrics = jax.eval_shape(self._gradient_sums, state, micro_batches[0])
      self._metric_names = tuple(metrics)
    totals = (self._zero_grads(state),  # separate zero buffers: the totals are donated
              {name: SumCount(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32)) for name in self._metric_names})
    for micro in micro_batches:
      totals = self._accumulate(state, micro, totals)
    return self._apply(state, totals, train_policy)


def make_ppo_step(state_template: PPOState, cfg: PPOConfig) -> PPOStep:
  """The PPO update of `PPOStep` for states laid out like `state_template`."""
  return PPOStep(state_template, cfg)


# ----------------------------------------------------------------------------- forward passes


def _merged(graphdef, params, frozen) -> nnx.Module:
  return nnx.merge(graphdef, params, frozen)


@functools.partial(jax.jit, static_argnames=("graphdef", "num_micro_batches"))
def _forward_logprobs(graphdef, params, frozen, inputs, *, num_micro_batches):
  def logprobs(micro):
    logits_btv, _, _ = _merged(graphdef, params, frozen)(micro["tokens_bt"], micro["positions_bt"])
    return token_logprobs(logits_btv, micro["tokens_bt"])
  return map_micro_batches(logprobs, inputs, num_micro_batches)


def forward_logprobs(state: TrainState, batch: Batch, *, num_micro_batches: int = 1) -> jax.Array:
  """Token-aligned log pi(token t | tokens < t) [B, T] of the state's model (old / reference)."""
  inputs = {key: batch[key] for key in ("tokens_bt", "positions_bt")}
  return _forward_logprobs(state.graphdef, state.params, state.frozen, inputs,
                           num_micro_batches=num_micro_batches)


@functools.partial(jax.jit, static_argnames=("graphdef", "idx_key", "num_micro_batches"))
def _forward_step_values(graphdef, params, frozen, inputs, *, idx_key, num_micro_batches):
  def values(micro):
    values_bt = _merged(graphdef, params, frozen)(micro["tokens_bt"], micro["positions_bt"])
    return gather_steps(values_bt, micro[idx_key])
  return map_micro_batches(values, inputs, num_micro_batches)


def forward_step_values(state: TrainState, batch: Batch, *, at: str,
                        num_micro_batches: int = 1) -> jax.Array:
  """A `spa_jax.models.ValueModel`'s outputs per step [B, S] (0 on padding steps).

  at="end": at the last token of each action (progress estimator c_s);
  at="start": at the last token before each action (critic V(state_s)).
  """
  if at not in ("start", "end"):
    raise ValueError(f"at={at!r}; use 'end' (progress estimator) or 'start' (critic)")
  idx_key = f"step_{at}_idx_bs"
  inputs = {key: batch[key] for key in ("tokens_bt", "positions_bt", idx_key)}
  values_bs = _forward_step_values(state.graphdef, state.params, state.frozen, inputs,
                                   idx_key=idx_key, num_micro_batches=num_micro_batches)
  return values_bs * batch["step_mask_bs"]


@functools.partial(jax.jit, static_argnames=("graphdef", "num_micro_batches"))
def _forward_step_features(graphdef, params, frozen, inputs, *, num_micro_batches):
  def features(micro):
    _, hidden_btd, _ = _merged(graphdef, params, frozen).backbone(
        micro["tokens_bt"], micro["positions_bt"], compute_logits=False)
    hidden_bsd = gather_steps(hidden_btd.astype(jnp.float32), micro["step_end_idx_bs"])
    return jnp.einsum("bsd,bs->bd", hidden_bsd, micro["step_mask_bs"].astype(jnp.float32))
  return map_micro_batches(features, inputs, num_micro_batches)


def forward_step_features(state: TrainState, batch: Batch, *, num_micro_batches: int = 1) -> jax.Array:
  """A `ValueModel`'s backbone hidden states (float32) at the end of each action, summed over each
  trajectory's steps [B, D]: its scalar head is linear, so the sum of its per-step outputs is
  `features_bd @ kernel + num_steps_b * bias` (what a linear probe of the estimator fits)."""
  inputs = {key: batch[key] for key in ("tokens_bt", "positions_bt", "step_end_idx_bs", "step_mask_bs")}
  return _forward_step_features(state.graphdef, state.params, state.frozen, inputs,
                                num_micro_batches=num_micro_batches)


def lora_reference(state: TrainState) -> TrainState:
  """The reference policy of a LoRA-only train state: the same model with adapters zeroed."""
  variables = jax.tree.leaves(state.params, is_leaf=lambda x: isinstance(x, nnx.Variable))
  if not all(isinstance(v, nnx.LoRAParam) for v in variables):
    raise ValueError("lora_reference needs a train state created with trainable='lora'; "
                     "for full fine-tuning keep a frozen copy of the SFT model as reference")
  return state.with_params(jax.tree.map(jnp.zeros_like, state.params))
