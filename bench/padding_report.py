"""Tokens the PPO targets phase reads per iteration, from recorded rollouts: padded to the iteration's
longest trajectory (before 3f37db9) against length-sorted chunks each cut after its own last action
(`spa_jax.stages.ppo.score_rows`).

    .venv/bin/python bench/padding_report.py --root /tmp/spa --chunk-rows 4 --bucket 1024

For every PPO run under --root (trajectories/ppo_<mode>_it*.jsonl with exact token ids, as online PPO
records them; runs found as bench/failure_modes.py finds them): per iteration, the real tokens (the
trajectories' lengths), the tokens of the one padded batch (every row at the longest row's length,
rounded up to --bucket), and the tokens of chunks of --chunk-rows rows sorted by where their last
action ends, each cut there and rounded up to --bucket (`ppo.length_chunks`, `trim_to_steps`). The
cut is after the last action token, not the last step's observation, so a chunk's tokens can be
fewer than its rows' lengths. Token counts only: what the change saves in time is a GPU measurement.
Appends a section to bench/RESULTS.md (unless --no-results) and ends with ONE JSON line on stdout.
"""

import argparse
import collections
import pathlib

import numpy as np

import failure_modes
import results_log
from spa_jax.stages.ppo import length_chunks
from spa_jax.training.batch import bucketed_length


def iteration_tokens(records: list[dict], chunk_rows: int, bucket: int, max_len: int) -> dict[str, int]:
  """Real, padded-batch and chunked token counts of one iteration's trajectories."""
  lengths = np.array([len(r["tokens"]) for r in records])
  last_action = np.array([max((i for i, m in enumerate(r["action_mask"]) if m), default=-1) for r in records])
  padded = len(records) * bucketed_length(int(lengths.max()), bucket, max_len)
  chunked = sum(len(index) * bucketed_length(int(last_action[index].max()) + 1, bucket, max_len)
                for index in length_chunks({"step_end_idx_bs": last_action[:, None]}, chunk_rows))
  return {"real": int(lengths.sum()), "padded": int(padded), "chunked": int(chunked)}


def collect(root: pathlib.Path, chunk_rows: int, bucket: int, max_len: int) -> dict[str, dict[str, float]]:
  """{arm: {iterations, real, padded, chunked, padded_ratio, chunked_ratio}} summed over its runs."""
  totals = collections.defaultdict(collections.Counter)
  for workspace in sorted({p.parent.parent for p in root.glob("**/trajectories/ppo_*_it*.jsonl")}):
    for mode, files in failure_modes.run_files(workspace).items():
      arm = failure_modes.arm_of(workspace, mode)
      for _, path in files["it"]:
        records = failure_modes.read_records([path])
        if not records or records[0].get("tokens") is None:
          raise SystemExit(f"{path} holds no token ids (offline PPO or an older record): nothing to count")
        totals[arm].update(iteration_tokens(records, chunk_rows, bucket, max_len) | {"iterations": 1})
  if not totals:
    raise SystemExit(f"no trajectories/ppo_*_it*.jsonl under {root}: point --root at a workspace or spa_bench's root")
  return {arm: dict(t) | {"padded_ratio": t["padded"] / t["real"], "chunked_ratio": t["chunked"] / t["real"]}
          for arm, t in totals.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--root", required=True, type=pathlib.Path)
  parser.add_argument("--chunk-rows", type=int, default=4, help="rows per chunk (rollouts per iteration / ppo.grad_accum)")
  parser.add_argument("--bucket", type=int, default=1024, help="ppo.length_bucket")
  parser.add_argument("--max-len", type=int, default=4096, help="ppo.max_len")
  parser.add_argument("--title", default="")
  parser.add_argument("--no-results", action="store_true")
  args = parser.parse_args()
  report = collect(args.root, args.chunk_rows, args.bucket, args.max_len)
  body = "\n".join(["| arm | iterations | real tokens | padded to the iteration's longest | length-sorted chunks, cut |",
                    "|---|---|---|---|---|"] + [
      f"| {arm} | {r['iterations']} | {r['real']:,} | {r['padded']:,} ({r['padded_ratio']:.2f}x) | "
      f"{r['chunked']:,} ({r['chunked_ratio']:.2f}x) |" for arm, r in report.items()])
  results_log.publish(f"padding_report{': ' + args.title if args.title else ''}", body, report,
                      results=not args.no_results)


if __name__ == "__main__":
  main()
