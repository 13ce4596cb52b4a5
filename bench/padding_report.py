"""Tokens the PPO targets phase reads per iteration, from recorded rollouts: padded to the iteration's
longest trajectory (before 3f37db9) against length-sorted chunks each cut after its own last action
(`spa_jax.stages.ppo.score_rows`); and the tokens one epoch of the update reads: shuffled mini-batches
of --mini-batch-rows trajectories, each padded to its longest row (`ppo.update` today) against every
micro-batch of --micro-rows cut to its own longest (what the update would read if its micro-batches
were trimmed one by one), and mini-batches grouped by length (`ppo.group_by_length`) each padded to
its longest.

    .venv/bin/python bench/padding_report.py --root /tmp/spa --chunk-rows 4 --bucket 1024

For every PPO run under --root (trajectories/ppo_<mode>_it*.jsonl with exact token ids, as online PPO
records them; runs found as bench/failure_modes.py finds them): per iteration, the real tokens (the
trajectories' lengths), the tokens of the one padded batch (every row at the longest row's length,
rounded up to --bucket), and the tokens of chunks of --chunk-rows rows sorted by where their last
action ends, each cut there and rounded up to --bucket (`ppo.length_chunks`, `trim_to_steps`). The
cut is after the last action token, not the last step's observation, so a chunk's tokens can be
fewer than its rows' lengths. The update's mini-batches are random, as `ppo.update` draws them (a seeded permutation per
iteration, not the run's own), so that column estimates the recorded `update_tokens` per epoch,
printed beside it where the run's metrics hold them. Token counts only: what a change saves in time is a GPU measurement.
Appends a section to bench/RESULTS.md (unless --no-results) and ends with ONE JSON line on stdout.
"""

import argparse
import collections
import json
import pathlib

import numpy as np

import failure_modes
import results_log
from spa_jax.stages.ppo import epoch_mini_batches, length_chunks
from spa_jax.training.batch import bucketed_length


def iteration_tokens(records: list[dict], chunk_rows: int, bucket: int, max_len: int, mini_batch_rows: int = 8,
                     micro_rows: int = 1, seed: int = 0) -> dict[str, int]:
  """Real, padded-batch and chunked token counts of one iteration's trajectories, and one update epoch's
  tokens with mini-batches padded to their longest row (uniform, or grouped by length) against
  micro-batches each cut to their own."""
  lengths = np.array([len(r["tokens"]) for r in records])
  last_action = np.array([max((i for i, m in enumerate(r["action_mask"]) if m), default=-1) for r in records])
  padded = len(records) * bucketed_length(int(lengths.max()), bucket, max_len)
  chunked = sum(len(index) * bucketed_length(int(last_action[index].max()) + 1, bucket, max_len)
                for index in length_chunks({"step_end_idx_bs": last_action[:, None]}, chunk_rows))
  cut = lambda rows: len(rows) * bucketed_length(int(last_action[rows].max()) + 1, bucket, max_len)
  minis = epoch_mini_batches(last_action, mini_batch_rows, np.random.default_rng(seed), bucket)
  grouped = epoch_mini_batches(last_action, mini_batch_rows, np.random.default_rng(seed), bucket, group_by_length=True)
  update_padded, update_grouped = sum(cut(mini) for mini in minis), sum(cut(mini) for mini in grouped)
  update_micro = sum(cut(mini[rows]) for mini in minis  # each mini-batch's rows length-sorted into micro-batches
                     for rows in length_chunks({"step_end_idx_bs": last_action[mini][:, None]}, micro_rows))
  return {"real": int(lengths.sum()), "padded": int(padded), "chunked": int(chunked),
          "update_padded": int(update_padded), "update_micro": int(update_micro), "update_grouped": int(update_grouped)}


def recorded_update_tokens_per_epoch(workspace: pathlib.Path, mode: str) -> float | None:
  """The run's logged `update_tokens` summed over its iterations, divided by its ppo.ppo_epochs."""
  metrics, config = workspace / "metrics" / f"ppo_{mode}.jsonl", workspace / "config.json"
  if not metrics.exists() or not config.exists():
    return None
  epochs = json.loads(config.read_text())["ppo"]["ppo_epochs"]
  rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
  return sum(row.get("update_tokens", 0) for row in rows) / epochs


def collect(root: pathlib.Path, chunk_rows: int, bucket: int, max_len: int, mini_batch_rows: int = 8,
            micro_rows: int = 1) -> dict[str, dict[str, float]]:
  """{arm: {iterations, real, padded, chunked, update_padded, update_micro, update_grouped, their ratios to real, and
  recorded_update_per_epoch where the runs logged it}} summed over its runs."""
  totals = collections.defaultdict(collections.Counter)
  for workspace in sorted({p.parent.parent for p in root.glob("**/trajectories/ppo_*_it*.jsonl")}):
    for mode, files in failure_modes.run_files(workspace).items():
      arm = failure_modes.arm_of(workspace, mode)
      for index, path in files["it"]:
        records = failure_modes.read_records([path])
        if not records or records[0].get("tokens") is None:
          raise SystemExit(f"{path} holds no token ids (offline PPO or an older record): nothing to count")
        totals[arm].update(iteration_tokens(records, chunk_rows, bucket, max_len, mini_batch_rows, micro_rows,
                                            seed=index) | {"iterations": 1})
      recorded = recorded_update_tokens_per_epoch(workspace, mode)
      if recorded is not None:
        totals[arm]["recorded_update_per_epoch"] += recorded
  if not totals:
    raise SystemExit(f"no trajectories/ppo_*_it*.jsonl under {root}: point --root at a workspace or spa_bench's root")
  return {arm: dict(t) | {f"{key}_ratio": t[key] / t["real"] for key in
                          ("padded", "chunked", "update_padded", "update_micro", "update_grouped",
                           "recorded_update_per_epoch")}
          for arm, t in totals.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--root", required=True, type=pathlib.Path)
  parser.add_argument("--chunk-rows", type=int, default=4, help="rows per chunk (rollouts per iteration / ppo.grad_accum)")
  parser.add_argument("--bucket", type=int, default=1024, help="ppo.length_bucket")
  parser.add_argument("--max-len", type=int, default=4096, help="ppo.max_len")
  parser.add_argument("--mini-batch-rows", type=int, default=8, help="ppo.mini_batch_size * ppo.grad_accum")
  parser.add_argument("--micro-rows", type=int, default=1, help="ppo.mini_batch_size")
  parser.add_argument("--title", default="")
  parser.add_argument("--no-results", action="store_true")
  args = parser.parse_args()
  report = collect(args.root, args.chunk_rows, args.bucket, args.max_len, args.mini_batch_rows, args.micro_rows)
  tokens = lambda r, key: f"{r[key]:,.0f} ({r[key + '_ratio']:.2f}x)" if r.get(key) else "-"
  body = "\n".join(["| arm | iterations | real tokens | targets: padded to the iteration's longest | targets: "
                    "length-sorted chunks, cut | update epoch: mini-batches padded to their longest | update epoch: "
                    "micro-batches cut one by one | update epoch: mini-batches grouped by length, padded to their longest | "
                    "update epoch: recorded `update_tokens` / epochs |",
                    "|---|---|---|---|---|---|---|---|---|"] + [
      f"| {arm} | {r['iterations']} | {r['real']:,} | {tokens(r, 'padded')} | {tokens(r, 'chunked')} | "
      f"{tokens(r, 'update_padded')} | {tokens(r, 'update_micro')} | {tokens(r, 'update_grouped')} | "
      f"{tokens(r, 'recorded_update_per_epoch')} |"
      for arm, r in report.items()])
  results_log.publish(f"padding_report{': ' + args.title if args.title else ''}", body, report,
                      results=not args.no_results)


if __name__ == "__main__":
  main()
