"""Trajectory batch layout: step detection from action masks and the token <-> step helpers."""

import numpy as np
import jax.numpy as jnp
import pytest

from spa_jax.sharding import make_mesh
from spa_jax.training import batch as tb
from spa_jax.training.global_batch import to_global_batch
from spa_jax.training.kl import step_kl


def test_steps_from_action_mask_two_steps():
  # tokens: 0 1 | 2 3 (action 0) | 4 5 (observation) | 6 (action 1) | 7 (padding-like tail)
  step_id_t, start_s, end_s = tb.steps_from_action_mask([0, 0, 1, 1, 0, 0, 1, 0], max_steps=3)
  np.testing.assert_array_equal(step_id_t, [-1, -1, 0, 0, -1, -1, 1, -1])
  np.testing.assert_array_equal(start_s, [1, 5, -1])  # last prompt token before each action
  np.testing.assert_array_equal(end_s, [3, 6, -1])  # last token of each action


def test_steps_from_action_mask_one_step_at_end():
  step_id_t, start_s, end_s = tb.steps_from_action_mask([0, 0, 0, 1, 1], max_steps=2)
  np.testing.assert_array_equal(step_id_t, [-1, -1, -1, 0, 0])
  np.testing.assert_array_equal(start_s, [2, -1])
  np.testing.assert_array_equal(end_s, [4, -1])


def test_steps_from_action_mask_rejects_bad_input():
  with pytest.raises(ValueError, match="max_steps"):
    tb.steps_from_action_mask([0, 1, 0, 1, 0, 1], max_steps=2)
  with pytest.raises(ValueError, match="token 0"):
    tb.steps_from_action_mask([1, 1, 0], max_steps=2)


def test_make_trajectory_batch_pads_and_marks_steps():
  batch = tb.make_trajectory_batch([[5, 6, 7, 8, 9], [5, 6, 7]], [[0, 1, 0, 0, 1], [0, 0, 1]],
                                   [0.5, 1.0], seq_len=6, max_steps=3, pad_id=0)
  np.testing.assert_array_equal(batch["tokens_bt"], [[5, 6, 7, 8, 9, 0], [5, 6, 7, 0, 0, 0]])
  np.testing.assert_array_equal(batch["loss_mask_bt"], [[0, 1, 0, 0, 1, 0], [0, 0, 1, 0, 0, 0]])
  np.testing.assert_array_equal(batch["step_id_bt"],
                                [[-1, 0, -1, -1, 1, -1], [-1, -1, 0, -1, -1, -1]])
  np.testing.assert_array_equal(batch["step_start_idx_bs"], [[0, 3, -1], [1, -1, -1]])
  np.testing.assert_array_equal(batch["step_end_idx_bs"], [[1, 4, -1], [2, -1, -1]])
  np.testing.assert_array_equal(batch["step_mask_bs"], [[1, 1, 0], [1, 0, 0]])
  np.testing.assert_array_equal(batch["final_reward_b"], [0.5, 1.0])
  with pytest.raises(ValueError, match="seq_len"):
    tb.make_trajectory_batch([[1, 2, 3]], [[0, 1, 1]], seq_len=2, max_steps=1)


def test_forced_tokens_delimit_their_step_but_are_not_trained_on():
  # step 0 = tokens 1-3, its last token (3) forced; step 1 = tokens 5-6, sampled to its end
  batch = tb.make_trajectory_batch([[5, 6, 7, 2, 8, 9, 2]], [[0, 1, 1, 1, 0, 1, 1]], seq_len=8, max_steps=2,
                                   forced_mask_rows=[[0, 0, 0, 1, 0, 0, 0]])
  np.testing.assert_array_equal(batch["loss_mask_bt"], [[0, 1, 1, 0, 0, 1, 1, 0]])
  np.testing.assert_array_equal(batch["step_id_bt"], [[-1, 0, 0, -1, -1, 1, 1, -1]])
  np.testing.assert_array_equal(batch["step_start_idx_bs"], [[0, 4]])
  np.testing.assert_array_equal(batch["step_end_idx_bs"], [[3, 6]])  # the forced token still ends step 0
  kl_bs = step_kl(jnp.ones((1, 8)), jnp.zeros((1, 8)), jnp.asarray(batch["step_id_bt"]), 2)
  np.testing.assert_array_equal(kl_bs, [[2.0, 2.0]])  # the forced token is in no step's KL
  with pytest.raises(ValueError, match="outside every action"):
    tb.make_trajectory_batch([[5, 6]], [[0, 1]], seq_len=2, max_steps=1, forced_mask_rows=[[1, 0]])


def test_check_has_agent_tokens():
  tb.check_has_agent_tokens(np.array([[0, 1]]))
  with pytest.raises(ValueError, match="no agent"):
    tb.check_has_agent_tokens(np.zeros((2, 3)), where="SFT dataset")
  tb.check_has_agent_tokens(np.array([[0, 1], [0, 0]]))  # a padding row is fine batch-wide
  with pytest.raises(ValueError, match=r"rows \[1\]"):
    tb.check_has_agent_tokens(np.array([[0, 1], [0, 0]]), per_row=True)


def test_token_logprobs_are_shifted_by_one():
  # V = 2. logits[0] = [0, 0] scores token 1 (id 1): log 1/2.  logits[1] = [ln 3, 0] scores
  # token 2 (id 0): log 3/4.  Position 0 has no context: 0.
  logits_btv = jnp.array([[[0.0, 0.0], [np.log(3.0), 0.0], [7.0, -7.0]]])
  logp_bt = tb.token_logprobs(logits_btv, jnp.array([[0, 1, 0]]))
  np.testing.assert_allclose(logp_bt, [[0.0, np.log(0.5), np.log(0.75)]], rtol=1e-6)


def test_token_entropy():
  # uniform over 2 -> ln 2; logits [ln 3, 0] -> p = (3/4, 1/4) -> -(3/4 ln 3/4 + 1/4 ln 1/4)
  logits_btv = jnp.array([[[0.0, 0.0], [np.log(3.0), 0.0], [0.0, 0.0]]])
  expected = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
  np.testing.assert_allclose(tb.token_entropy(logits_btv), [[0.0, np.log(2.0), expected]],
                             rtol=1e-6)


def test_step_token_helpers():
  step_id_bt = jnp.array([[-1, 0, 0, -1, 1, -1]])
  x_bt = jnp.array([[10.0, 1.0, 2.0, 20.0, 4.0, 30.0]])
  np.testing.assert_allclose(tb.sum_tokens_per_step(x_bt, step_id_bt, 3), [[3.0, 4.0, 0.0]])
  np.testing.assert_allclose(tb.steps_to_tokens(jnp.array([[7.0, 8.0, 9.0]]), step_id_bt),
                             [[0.0, 7.0, 7.0, 0.0, 8.0, 0.0]])
  np.testing.assert_allclose(tb.gather_steps(x_bt, jnp.array([[2, 4, -1]])), [[2.0, 4.0, 10.0]])


def test_to_global_batch_single_process():
  mesh = make_mesh()
  local = tb.make_trajectory_batch([[5, 6, 7]], [[0, 1, 1]], seq_len=4, max_steps=2)
  global_batch = to_global_batch(local, mesh)
  for name, x in local.items():
    np.testing.assert_array_equal(np.asarray(global_batch[name]), x)
  with pytest.raises(ValueError, match="leading"):
    to_global_batch({"a": np.zeros((2, 3)), "b": np.zeros((3,))}, mesh)


def test_trim_to_steps_cuts_after_the_last_step_token_in_bucket_multiples(toy_batch):
  last = int(toy_batch["step_end_idx_bs"].max())  # the toy's longest episode ends with an action
  trimmed = tb.trim_to_steps(toy_batch, length_bucket=8)
  length = trimmed["tokens_bt"].shape[1]
  assert length == -(-(last + 1) // 8) * 8 < toy_batch["tokens_bt"].shape[1]
  for key, x in toy_batch.items():
    if key.endswith("_bt"):
      np.testing.assert_array_equal(trimmed[key], x[:, :length])
    else:
      assert trimmed[key] is x
  assert not toy_batch["loss_mask_bt"][:, length:].any() and (toy_batch["step_id_bt"][:, length:] == -1).all()
  assert tb.trim_to_steps(toy_batch, length_bucket=1000)["tokens_bt"].shape == toy_batch["tokens_bt"].shape
  with pytest.raises(ValueError, match="old_logp_bt has 5 tokens per row"):
    tb.trim_to_steps(toy_batch | {"old_logp_bt": np.zeros((4, 5))}, length_bucket=8)


def _padded_tokens(lengths, padded_lengths):
  return sum(min(p for p in padded_lengths if p >= n) for n in lengths)


def test_fitted_padded_lengths_pad_least_for_their_count():
  # the SFT demonstrations' shape: most 1.1-1.8k tokens, a few short ones
  lengths = [300, 310, 1200, 1250, 1400, 1450, 1500, 1530, 1600, 1700, 1839]
  one = tb.fit_padded_lengths(lengths, 1, 128, 4096)
  assert one == [1920]  # the longest, rounded up to a multiple of 128
  two = tb.fit_padded_lengths(lengths, 2, 128, 4096)
  assert two[-1] == 1920 and len(two) == 2
  # every other choice of a second length pads at least as much (exhaustive over multiples of 128)
  best = min(_padded_tokens(lengths, [b, 1920]) for b in range(128, 1920, 128))
  assert _padded_tokens(lengths, two) == best < _padded_tokens(lengths, one)
  many = tb.fit_padded_lengths(lengths, 50, 128, 4096)  # as many as distinct rounded lengths: no waste
  assert _padded_tokens(lengths, many) == sum(tb.bucketed_length(n, 128, 4096) for n in lengths)
  assert tb.fit_padded_lengths(lengths, 2, 128, 1792)[-1] == 1792  # capped at max_len like bucketed_length
  with pytest.raises(ValueError, match="at least one padded length"):
    tb.fit_padded_lengths(lengths, 0, 128, 4096)
