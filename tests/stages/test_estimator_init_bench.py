"""bench/estimator_init_bench.py on the stage tests' workspace: each variant is the prm stage on its own
linked copy, and the probed head beats the zero head on the held-out tasks."""

import pathlib
import sys

from spa_workspace import make_config, workspace_copy

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))
import estimator_init_bench  # noqa: E402


def test_variants_run_the_prm_stage_on_linked_copies(tmp_path_factory, tmp_path):
  workdir = workspace_copy(tmp_path_factory, tmp_path)
  rows = [estimator_init_bench.run_variant(workdir, make_config(workdir), tmp_path / "out", head_init, 1e-4, 2)
          for head_init in ("zero", "probe")]
  zero, probe = rows
  assert zero["probe_heldout_r2"] is None and probe["probe_heldout_r2"] is not None
  assert probe["heldout_r2"] > zero["heldout_r2"] + 0.3
  assert zero["heldout_baseline_r2"] == probe["heldout_baseline_r2"]  # the same held-out tasks
  copy = tmp_path / "out" / "probe_lr0.0001_ep2"
  assert (copy / "prm" / "estimator").is_dir() and not (copy / "label").exists()
  explored = sorted((workdir / "trajectories").glob("explore.p*.jsonl"))
  assert explored and all((copy / "trajectories" / f.name).samefile(f) for f in explored)  # hard links
  table = estimator_init_bench.markdown(workdir, rows)
  assert table.count("\n| zero |") == 1 and table.count("\n| probe |") == 1
  assert estimator_init_bench.parse_variants("probe:2e-5:3,zero:1e-3:1") == [("probe", 2e-5, 3), ("zero", 1e-3, 1)]
