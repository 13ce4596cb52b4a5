"""bench/sft_peer_bench.py's reading of the two SFT runs: the peer's JSON lines and our stage's files."""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))
import sft_peer_bench  # noqa: E402

# The peer's stdout as ../shared/bench/smol_peer.py prints it (a warning line among the JSON ones).
PEER_STDOUT = """{"loaded_s": 22.5, "im_start": 1, "im_end": 2}
{"demos": 1000, "demo_s": 5.8, "mean_len": 1385.0, "max_len": 1695}
{"step": 0, "loss": 1.5913, "s": 2.3}
{"step": 50, "loss": 0.0088, "s": 15.6}
{"step": 100, "loss": 0.0024, "s": 27.6}
[transformers] Ignoring clean_up_tokenization_spaces=True for BPE tokenizer
{"step": 124, "loss": 0.0038, "s": 33.9}
{"peer": "torch", "demos": 1000, "epochs": 2.0, "sft_steps": 125, "sft_s": 33.9, "eval_goals": 8, "score": 89.0, "success_rate": 62.5}
"""


def _stage(root: pathlib.Path, seconds: float, step_times: dict[int, float]) -> pathlib.Path:
  (root / "sft").mkdir(parents=True)
  (root / "metrics").mkdir()
  summary = {"seconds": seconds, "steps": max(step_times), "final_loss": 0.005, "padded_lengths": [1536, 2048],
             "time_data_s": 13.0, "time_init_s": 1.7, "time_train_s": seconds - 14.7}
  (root / "sft" / "DONE.json").write_text(json.dumps({"summary": summary}))
  (root / "metrics" / "sft.jsonl").write_text(
      "".join(json.dumps({"step": step, "time": t, "sft_loss": 0.1}) + "\n" for step, t in step_times.items()))
  return root


def test_the_peer_job_is_load_demonstrations_and_steps_and_its_step_time_starts_at_step_50():
  peer = sft_peer_bench.peer_summary(sft_peer_bench.json_lines(PEER_STDOUT))
  assert peer["job_s"] == pytest.approx(22.5 + 5.8 + 33.9)
  assert peer["step_s"] == pytest.approx((33.9 - 15.6) / (124 - 50))
  assert peer["steps"] == 125 and peer["final_loss"] == 0.0038


def test_ratios_are_peer_time_over_ours_from_our_stage_files(tmp_path):
  peer = sft_peer_bench.peer_summary(sft_peer_bench.json_lines(PEER_STDOUT))
  # steps 10 -> 126 in 20 s: 0.172 s per step; the step-1 row (compilation inside) is not counted
  ours = sft_peer_bench.ours_summary(_stage(tmp_path, 84.8, {1: 100.0, 10: 1000.0, 126: 1020.0}), process_s=95.0)
  assert ours["step_s"] == pytest.approx(20.0 / 116)
  rows = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in sft_peer_bench.table(peer, ours).splitlines()[2:]}
  assert rows["per optimizer step, steady state"] == f"**{peer['step_s'] / (20.0 / 116):.2f}x**"  # > 1: ours faster
  assert rows["the SFT job"] == f"**{62.2 / 84.8:.2f}x**"
  assert rows["the SFT job, our whole process"] == f"{62.2 / 95.0:.2f}x"


def test_a_failed_or_short_run_is_named_not_misread():
  with pytest.raises(ValueError, match=r"lacks \['sft_s', 'sft_steps'\]"):
    sft_peer_bench.peer_summary(sft_peer_bench.json_lines(PEER_STDOUT.split("[transformers]")[0]))
  with pytest.raises(ValueError, match="need two logged steps at or after step 50"):
    sft_peer_bench.steady_seconds_per_step([(0, 2.3), (50, 15.6)], 50)
