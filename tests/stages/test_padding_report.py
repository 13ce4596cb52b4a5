"""bench/padding_report.py: the targets phase's token counts, padded batch against cut length-sorted chunks."""

import json
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))
import padding_report  # noqa: E402


def _record(length: int, last_action: int) -> dict:
  return {"tokens": [0] * length, "action_mask": [int(i == last_action) for i in range(length)]}


def test_chunks_sort_by_the_last_action_and_are_cut_there():
  # lengths 300, 900, 120, 500 with their last actions at 250, 700, 100, 480; bucket 256
  records = [_record(300, 250), _record(900, 700), _record(120, 100), _record(500, 480)]
  counts = padding_report.iteration_tokens(records, chunk_rows=2, bucket=256, max_len=4096)
  assert counts["real"] == 300 + 900 + 120 + 500
  assert counts["padded"] == 4 * 1024  # every row at the longest (900) rounded up to 1,024
  # sorted by last action: (100, 250) -> cut at 251 -> 256 each; (480, 700) -> cut at 701 -> 768 each
  assert counts["chunked"] == 2 * 256 + 2 * 768


def test_an_update_epoch_pads_each_mini_batch_to_its_longest_and_micro_batches_to_their_own():
  # last actions at 250, 700, 100, 480 (cuts 256, 768, 256, 512 at bucket 256); mini-batches of 2 drawn by
  # the seeded permutation, micro-batches of 1 each cut to its own row
  records = [_record(300, 250), _record(900, 700), _record(120, 100), _record(500, 480)]
  counts = padding_report.iteration_tokens(records, chunk_rows=2, bucket=256, max_len=4096, mini_batch_rows=2,
                                           micro_rows=1, seed=0)
  order = np.random.default_rng(0).permutation(4)
  cuts = np.array([256, 768, 256, 512])
  assert counts["update_padded"] == sum(2 * cuts[order[at:at + 2]].max() for at in (0, 2))
  assert counts["update_micro"] == cuts.sum() < counts["update_padded"]
  whole = padding_report.iteration_tokens(records, chunk_rows=2, bucket=256, max_len=4096, mini_batch_rows=4,
                                          micro_rows=4, seed=0)
  assert whole["update_padded"] == whole["update_micro"] == 4 * 768  # one micro-batch per mini-batch: no saving
  # grouped by length (ppo.group_by_length): the two 256-token rows share a mini-batch, the 512 and 768 ones
  assert counts["update_grouped"] == 2 * 256 + 2 * 768 <= counts["update_padded"]


def test_recorded_update_tokens_are_divided_by_the_run_epochs(tmp_path):
  (tmp_path / "metrics").mkdir()
  (tmp_path / "metrics" / "ppo_sparse.jsonl").write_text('{"update_tokens": 800}\n{"update_tokens": 1200}\n')
  (tmp_path / "config.json").write_text(json.dumps({"ppo": {"ppo_epochs": 4}}))
  assert padding_report.recorded_update_tokens_per_epoch(tmp_path, "sparse") == 500
  assert padding_report.recorded_update_tokens_per_epoch(tmp_path, "spa") is None
