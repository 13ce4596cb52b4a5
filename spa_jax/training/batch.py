"""The trajectory batch layout shared by the SFT, progress-estimator and PPO steps.

One token sequence per trajectory (instruction, observations and actions of one episode),
right-padded to a length bucket T; S = the step capacity (>= the longest episode's action count).
Every per-token array is **token-aligned**: index t describes token t.

| key                 | dtype   | shape  | meaning                                                         |
|---------------------|---------|--------|-----------------------------------------------------------------|
| `tokens_bt`         | int32   | [B, T] | token ids; padding after the sequence end (any id)              |
| `positions_bt`      | int32   | [B, T] | 0, 1, ... along the sequence (padding: continues counting)      |
| `loss_mask_bt`      | float32 | [B, T] | 1 on the agent's action tokens of environment steps (each action |
|                     |         |        | turn incl. its end-of-turn token) that the policy produced; 0 on |
|                     |         |        | forced tokens (below), instruction, "OK", demonstration,         |
|                     |         |        | observations, chat headers and padding                           |
| `step_id_bt`        | int32   | [B, T] | step index s of each action token the policy produced, -1        |
|                     |         |        | elsewhere (forced tokens included)                               |
| `step_start_idx_bs` | int32   | [B, S] | index of the last token BEFORE action s (end of its prompt: the |
|                     |         |        | state the critic values); -1 for padding steps                  |
| `step_end_idx_bs`   | int32   | [B, S] | index of the last token of action s (where the progress         |
|                     |         |        | estimator reads c_s and step rewards land); -1 for padding      |
| `step_mask_bs`      | float32 | [B, S] | 1 for the episode's real steps (a prefix: steps 0..n-1)         |
| `final_reward_b`    | float32 | [B]    | the episode's outcome R (WebShop reward in [0, 1])              |

Steps are environment actions only: a trajectory with one action has one step; invalid actions
are steps like any other (their grounding signal is 0). A step's span is its run of action-mask
ones; a **forced** token inside it (the end-of-turn token the episode loop appends after a stop
string ended the action: the policy did not sample it) still delimits the step (it can be the
step's last token, where `step_end_idx_bs` points), but it is no action token of the policy: it
has `loss_mask_bt` 0 and `step_id_bt` -1, so it enters no log-ratio, KL, advantage or loss. The log-probability of token t comes from
the logits at t-1 (`token_logprobs`), so action tokens never sit at t = 0.
"""

import collections
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

TOKEN_KEYS = ("tokens_bt", "positions_bt", "loss_mask_bt", "step_id_bt")
STEP_KEYS = ("step_start_idx_bs", "step_end_idx_bs", "step_mask_bs")


def check_has_agent_tokens(loss_mask_bt, *, where: str = "batch", per_row: bool = False) -> None:
  """Raises ValueError when `loss_mask_bt` marks no agent (action) token, which would silently
  give a zero loss; with `per_row`, every row (sample) must have agent tokens."""
  mask_bt = np.asarray(loss_mask_bt) > 0
  fix = ("Check that the chat template's assistant mask covers the action turns and that the "
         "sequences were not truncated before the first action.")
  if not mask_bt.any():
    raise ValueError(f"{where} has no agent (action) tokens: loss_mask_bt is all zero, so the "
                     f"loss would be 0. {fix}")
  empty_rows = np.flatnonzero(~mask_bt.reshape(mask_bt.shape[0], -1).any(axis=1))
  if per_row and empty_rows.size:
    raise ValueError(f"{where}: rows {empty_rows[:10].tolist()} ({empty_rows.size} in all) have no "
                     f"agent (action) tokens. {fix}")


def steps_from_action_mask(action_mask_t: Sequence[int], *, max_steps: int):
  """Step layout of one sequence from its 0/1 action mask: each contiguous run of 1s is one step.

  Returns numpy `(step_id_t [T], step_start_idx_s [max_steps], step_end_idx_s [max_steps])`.
  """
  mask_t = np.asarray(action_mask_t, dtype=np.int32)
  if mask_t.ndim != 1:
    raise ValueError(f"action mask must be 1-D, got shape {mask_t.shape}")
  if mask_t.size and mask_t[0]:
    raise ValueError("an action cannot start at token 0: it needs a prompt before it")
  edges = np.diff(np.concatenate([[0], mask_t, [0]]))
  starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
  if len(starts) > max_steps:
    raise ValueError(f"sequence has {len(starts)} action turns but max_steps={max_steps}; "
                     "raise max_steps (the step capacity S) or cut the episode")
  step_id_t = np.cumsum(edges[:-1] == 1) - 1
  step_id_t = np.where(mask_t > 0, step_id_t, -1).astype(np.int32)
  start_s = np.full(max_steps, -1, np.int32)
  end_s = np.full(max_steps, -1, np.int32)
  start_s[:len(starts)] = starts - 1
  end_s[:len(ends)] = ends
  return step_id_t, start_s, end_s


def make_trajectory_batch(token_rows: Sequence[Sequence[int]],
                          action_mask_rows: Sequence[Sequence[int]],
                          final_rewards: Sequence[float] | None = None, *,
                          seq_len: int, max_steps: int, pad_id: int = 0,
                          forced_mask_rows: Sequence[Sequence[int]] | None = None) -> dict[str, np.ndarray]:
  """Host-side numpy batch in the layout above from per-trajectory token ids and action masks
  (and, optionally, masks of the forced tokens inside the actions)."""
  if len(token_rows) != len(action_mask_rows):
    raise ValueError(f"{len(token_rows)} token rows but {len(action_mask_rows)} action masks")
  if forced_mask_rows is None:
    forced_mask_rows = [[0] * len(mask) for mask in action_mask_rows]
  if len(forced_mask_rows) != len(action_mask_rows):
    raise ValueError(f"{len(forced_mask_rows)} forced-token masks for {len(action_mask_rows)} rows")
  num_rows = len(token_rows)
  batch = {
      "tokens_bt": np.full((num_rows, seq_len), pad_id, np.int32),
      "positions_bt": np.tile(np.arange(seq_len, dtype=np.int32), (num_rows, 1)),
      "loss_mask_bt": np.zeros((num_rows, seq_len), np.float32),
      "step_id_bt": np.full((num_rows, seq_len), -1, np.int32),
      "step_start_idx_bs": np.full((num_rows, max_steps), -1, np.int32),
      "step_end_idx_bs": np.full((num_rows, max_steps), -1, np.int32),
      "final_reward_b": np.zeros((num_rows,), np.float32),
  }
  for row, (tokens, mask, forced) in enumerate(zip(token_rows, action_mask_rows, forced_mask_rows)):
    if not len(tokens) == len(mask) == len(forced):
      raise ValueError(f"row {row}: {len(tokens)} tokens but {len(mask)} action-mask and {len(forced)} "
                       "forced-mask entries")
    produced_t = (np.asarray(mask) > 0) & ~(np.asarray(forced, bool))
    if np.any(np.asarray(forced, bool) & ~(np.asarray(mask) > 0)):
      raise ValueError(f"row {row}: a forced token outside every action (forced tokens close an action)")
    if len(tokens) > seq_len:
      raise ValueError(f"row {row} has {len(tokens)} tokens > seq_len={seq_len}; "
                       "use a larger length bucket")
    step_id_t, start_s, end_s = steps_from_action_mask(mask, max_steps=max_steps)
    batch["tokens_bt"][row, :len(tokens)] = tokens
    batch["loss_mask_bt"][row, :len(mask)] = produced_t
    batch["step_id_bt"][row, :len(mask)] = np.where(produced_t, step_id_t, -1)
    batch["step_start_idx_bs"][row] = start_s
    batch["step_end_idx_bs"][row] = end_s
  batch["step_mask_bs"] = (batch["step_end_idx_bs"] >= 0).astype(np.float32)
  if final_rewards is not None:
    batch["final_reward_b"][:] = np.asarray(final_rewards, np.float32)
  return batch


def bucketed_length(length: int, length_bucket: int, max_len: int) -> int:
  """`length` rounded up to a multiple of `length_bucket` (one compiled shape per multiple), at most
  `max_len`: the padded length of every batch the training stages build."""
  return min(max_len, -(-length // length_bucket) * length_bucket)


def fit_padded_lengths(lengths: Sequence[int], max_count: int, multiple: int, max_len: int) -> list[int]:
  """At most `max_count` padded lengths (multiples of `multiple`, at most `max_len`, ascending) that
  pad `lengths` least when each is padded to the smallest one that holds it: one compiled step per
  padded length, so fewer lengths compile faster and pad more. Exact (dynamic programming over the
  distinct rounded lengths); the longest one always holds the longest sequence."""
  if max_count < 1 or not lengths:
    raise ValueError(f"need at least one padded length and one sequence (max_count={max_count}, "
                     f"{len(lengths)} sequences)")
  rounded = collections.Counter(bucketed_length(n, multiple, max_len) for n in lengths)
  values, counts = sorted(rounded), [rounded[v] for v in sorted(rounded)]
  below = np.concatenate([[0], np.cumsum(counts)])  # below[j]: sequences rounded to values[:j]
  # cost[k][j]: fewest padded tokens for values[:j + 1] with k + 1 lengths, the largest values[j]
  cost = [[values[j] * below[j + 1] for j in range(len(values))]]
  choice = [[-1] * len(values)]
  for _ in range(1, min(max_count, len(values))):
    row, picks = [], []
    for j in range(len(values)):
      options = [(cost[-1][i] + values[j] * (below[j + 1] - below[i + 1]), i) for i in range(j)]
      best = min(options, default=(cost[-1][j], choice[-1][j]))
      row.append(best[0])
      picks.append(best[1])
    cost.append(row)
    choice.append(picks)
  k, j, chosen = len(cost) - 1, len(values) - 1, []
  while j >= 0 and k >= 0:
    chosen.append(values[j])
    j, k = choice[k][j], k - 1
  return sorted(chosen)


def trim_to_steps(batch: dict[str, np.ndarray], length_bucket: int) -> dict[str, np.ndarray]:
  """`batch` with its per-token (`*_bt`) arrays cut after the last token any step reaches (the
  largest `step_end_idx_bs`, at or after every action token and step start), rounded up to a
  multiple of `length_bucket`. A causal model's losses at the steps never see the cut tokens
  (padding, a final observation), so an update on the trimmed batch is the same update, on fewer
  tokens: a mini-batch of short episodes need not pay for the longest one of the iteration."""
  seq_len = batch["tokens_bt"].shape[1]
  last = int(np.max(batch["step_end_idx_bs"], initial=-1))
  length = bucketed_length(max(last + 1, 1), length_bucket, seq_len)
  for key, x in batch.items():
    if key.endswith("_bt") and x.shape[1] != seq_len:
      raise ValueError(f"{key} has {x.shape[1]} tokens per row, tokens_bt {seq_len}")
  return {key: x[:, :length] if key.endswith("_bt") else x for key, x in batch.items()}


def token_logprobs(logits_btv: jax.Array, tokens_bt: jax.Array) -> jax.Array:
  """log pi(token t | tokens < t), token-aligned [B, T] float32; position 0 (no context) is 0."""
  logits_btv = logits_btv[:, :-1].astype(jnp.float32)
  next_tokens_bt = tokens_bt[:, 1:]
  picked_bt = jnp.take_along_axis(logits_btv, next_tokens_bt[..., None], axis=-1)[..., 0]
  logp_bt = picked_bt - jax.nn.logsumexp(logits_btv, axis=-1)
  return jnp.pad(logp_bt, ((0, 0), (1, 0)))


def token_entropy(logits_btv: jax.Array) -> jax.Array:
  """Entropy of the next-token distribution scoring token t, token-aligned [B, T]; 0 at t = 0."""
  logp_btv = jax.nn.log_softmax(logits_btv[:, :-1].astype(jnp.float32), axis=-1)
  entropy_bt = -jnp.sum(jnp.exp(logp_btv) * logp_btv, axis=-1)
  return jnp.pad(entropy_bt, ((0, 0), (1, 0)))


def gather_steps(x_bt: jax.Array, idx_bs: jax.Array) -> jax.Array:
  """x at the per-step token indices: [B, T, ...] -> [B, S, ...]; padding steps (-1) read index 0."""
  idx_bs = jnp.maximum(idx_bs, 0)
  return jax.vmap(lambda x_t, idx_s: x_t[idx_s])(x_bt, idx_bs)


def sum_tokens_per_step(x_bt: jax.Array, step_id_bt: jax.Array, num_steps: int) -> jax.Array:
  """Sum of a per-token quantity over each step's action tokens: [B, T] -> [B, S]."""
  onehot_bts = jax.nn.one_hot(step_id_bt, num_steps, dtype=jnp.float32)  # all-zero rows for -1
  return jnp.einsum("bt,bts->bs", x_bt.astype(jnp.float32), onehot_bts)


def steps_to_tokens(x_bs: jax.Array, step_id_bt: jax.Array) -> jax.Array:
  """Broadcast a per-step quantity to its action tokens: [B, S] -> [B, T], 0 off the actions."""
  picked_bt = jnp.take_along_axis(x_bs, jnp.maximum(step_id_bt, 0), axis=1)
  return jnp.where(step_id_bt >= 0, picked_bt, 0).astype(x_bs.dtype)
