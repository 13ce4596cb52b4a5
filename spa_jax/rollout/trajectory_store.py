"""Trajectory and SFT datasets on disk: per-process JSONL shards and an optional ArrayRecord copy.

Multi-process rule: process k writes only `trajectories/<name>.p<k>.jsonl` for the tasks it ran;
readers take the union of all shards. The ArrayRecord copy (tensorflow-datasets, read back with
`tfds` data sources, no TensorFlow needed) is written once, by process 0, from all shards; every
process then reads its own slice by index (`process_slice`), without loading the rest.
"""

import json
import pathlib
from typing import Iterable, Iterator, Sequence

import numpy as np

from spa_jax import distributed
from spa_jax.workspace import Workspace


class TrajectoryWriter:
  """Appends records to this process's shard of trajectory set `name` (one JSON object per line)."""

  def __init__(self, ws: Workspace, name: str, shard: int | None = None):
    self.path = ws.trajectories_path(name, distributed.process_index() if shard is None else shard)
    self._file = open(self.path, "w")
    self.count = 0

  def __call__(self, record: dict) -> None:
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    self.count += 1

  def close(self) -> None:
    self._file.close()

  def __enter__(self) -> "TrajectoryWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def read_jsonl(path: str | pathlib.Path) -> Iterator[dict]:
  with open(path) as f:
    for line in f:
      if line.strip():
        yield json.loads(line)


def read_trajectories(ws: Workspace, name: str) -> list[dict]:
  """All shards of trajectory set `name`, ordered by (task_id, rollout) whatever the process count."""
  shards = ws.trajectory_shards(name)
  if not shards:
    raise FileNotFoundError(f"No trajectories named {name!r} in {ws.root / 'trajectories'}; "
                            "run the stage that writes them first.")
  records = [record for path in shards for record in read_jsonl(path)]
  return sorted(records, key=lambda r: (r["task_id"], r["rollout"]))


def process_slice(num_items: int) -> range:
  """Indices of this process's share of an indexed dataset (round robin)."""
  return range(distributed.process_index(), num_items, distributed.process_count())


# --------------------------------------------------------------------------------------------
# ArrayRecord copies through tensorflow-datasets


def _builder_class():
  import tensorflow_datasets as tfds

  class SpaJaxRecords(tfds.core.GeneratorBasedBuilder):
    """One split ("train") of the given examples, in the given order."""
    VERSION = tfds.core.Version("1.0.0")

    # tfds derives this from the package's resources, which on Python 3.11 with an editable install
    # imports the absent backport `importlib_resources`; the builder's own file is what it means.
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
      from etils import epath
      return epath.Path(__file__)

    def __init__(self, *, examples: Iterable[dict], features, **kwargs):
      self._examples, self._features = examples, features
      super().__init__(**kwargs)

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=self._features, disable_shuffling=True)

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for index, example in enumerate(self._examples):
        yield index, example

  return SpaJaxRecords


_BUILDER = None


def _features(kind: str):
  import tensorflow_datasets as tfds
  if kind == "trajectory":
    return tfds.features.FeaturesDict({
        "task_id": np.int64, "rollout": np.int64, "final_reward": np.float32,
        "record": tfds.features.Text()})
  if kind == "sft":
    return tfds.features.FeaturesDict({
        "ids": tfds.features.Sequence(np.int32), "loss_mask": tfds.features.Sequence(np.int32),
        "step_mask": tfds.features.Sequence(np.int32), "step_ends": tfds.features.Sequence(np.int32)})
  raise ValueError(f"Unknown dataset kind {kind!r}; use 'trajectory' or 'sft'.")


def _trajectory_example(record: dict) -> dict:
  return {"task_id": record["task_id"], "rollout": record["rollout"],
          "final_reward": record["final_reward"], "record": json.dumps(record)}


def _sft_example(example) -> dict:
  return {"ids": example.ids, "loss_mask": example.loss_mask, "step_mask": example.step_mask,
          "step_ends": example.step_ends}


def write_array_record(out_dir: str | pathlib.Path, kind: str, items: Sequence) -> pathlib.Path:
  """Writes trajectory records (kind "trajectory") or `SftExample`s ("sft") as an ArrayRecord dataset.

  Returns the dataset directory to pass to `open_array_record`.
  """
  global _BUILDER
  _BUILDER = _BUILDER or _builder_class()
  to_example = _trajectory_example if kind == "trajectory" else _sft_example
  builder = _BUILDER(examples=(to_example(item) for item in items), features=_features(kind),
                     data_dir=str(out_dir), file_format="array_record")
  builder.download_and_prepare()
  return pathlib.Path(builder.data_dir)


def open_array_record(dataset_dir: str | pathlib.Path):
  """A random-access source of the dataset's examples (numpy values; `len()` and `[i]`)."""
  import tensorflow_datasets as tfds
  return tfds.builder_from_directory(str(dataset_dir)).as_data_source()["train"]


def decode_trajectory(example: dict) -> dict:
  """The trajectory record inside an ArrayRecord example."""
  text = example["record"]
  return json.loads(text.decode() if isinstance(text, bytes) else text)
