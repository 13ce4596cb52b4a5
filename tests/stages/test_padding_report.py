"""bench/padding_report.py: the targets phase's token counts, padded batch against cut length-sorted chunks."""

import pathlib
import sys

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
