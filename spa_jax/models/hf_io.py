"""Read and write Hugging Face Llama checkpoints (`config.json` + safetensors) directly.

Our module tree uses HF's names, so a parameter path maps to its HF key mechanically; kernels are
`[in, out]`, the transpose of PyTorch's `Linear.weight` `[out, in]`. RoPE is half-split on both
sides, so q/k need no permutation.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for safetensors)
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from spa_jax.models.config import LlamaConfig
from spa_jax.errors import InputFileError
from spa_jax.models.llama import Linear, Llama
from spa_jax.models.lora import FROZEN_BASE_FILTER, merged_kernel
from spa_jax.sharding import state_shardings

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_IGNORED_KEY_SUFFIXES = ("rotary_emb.inv_freq",)
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30

StatePath = tuple[str | int, ...]


def hf_key(path: StatePath) -> tuple[str, bool]:
  """(HF tensor name, whether it is stored transposed) for a Llama parameter path."""
  match path:
    case ("embed",):
      return "model.embed_tokens.weight", False
    case ("norm", "scale"):
      return "model.norm.weight", False
    case ("lm_head", "kernel"):
      return "lm_head.weight", True
    case ("layers", int(i), block, proj, "kernel"):
      return f"model.layers.{i}.{block}.{proj}.weight", True
    case ("layers", int(i), norm, "scale"):
      return f"model.layers.{i}.{norm}.weight", False
  raise ValueError(f"Parameter {path} has no Hugging Face Llama counterpart.")


def _damaged(path: Path, error: Exception) -> InputFileError:
  return InputFileError(f"{path} is not a readable safetensors file ({error}): it is truncated or damaged; "
                        "rerun the stage that wrote it (--config.run.force=<stage>) or copy it again.")


def _read_json_file(path: Path) -> dict:
  try:
    return json.loads(path.read_text())
  except ValueError as error:
    raise InputFileError(f"{path} is not valid JSON ({error}): it is truncated or damaged; rerun the stage "
                         "that wrote it (--config.run.force=<stage>) or copy it again.") from None


class _CheckpointReader:
  """Tensor-by-tensor access to a (possibly sharded) safetensors checkpoint."""

  def __init__(self, directory: Path):
    index_path, single_path = directory / INDEX_FILE, directory / SINGLE_FILE
    if index_path.exists():
      weight_map = _read_json_file(index_path)["weight_map"]
      self.files = {key: directory / name for key, name in weight_map.items()}
    elif single_path.exists():
      try:
        with safe_open(single_path, framework="numpy") as f:
          self.files = {key: single_path for key in f.keys()}
      except SafetensorError as error:
        raise _damaged(single_path, error) from None
    else:
      raise FileNotFoundError(f"No {SINGLE_FILE} or {INDEX_FILE} in {directory}.")
    self.directory = directory

  def read(self, key: str, expected_shape: tuple[int, ...]) -> np.ndarray:
    if key not in self.files:
      raise KeyError(f"Checkpoint {self.directory} lacks tensor {key!r} (expected shape {expected_shape}).")
    try:
      with safe_open(self.files[key], framework="numpy") as f:  # unmapped again after each tensor
        return f.get_tensor(key)
    except (SafetensorError, FileNotFoundError) as error:
      raise _damaged(self.files[key], error) from None


def _to_device(host: np.ndarray, sharding: NamedSharding | None) -> jax.Array:
  if sharding is None:
    return jax.device_put(host)
  # Each device receives only its slice (valid with several processes, each holding `host`).
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def load_hf(
    path: str | os.PathLike, cfg: LlamaConfig | None = None, mesh: Mesh | None = None, **overrides,
) -> tuple[LlamaConfig, Llama]:
  """Load a HF Llama directory into a `Llama`, sharded over `mesh` by the rules table.

  The model is built abstractly (no random init); tensors then stream one at a time from the
  safetensors files to their NamedShardings, so host RAM never holds two copies of the weights
  (peak: the already-loaded device arrays plus about one tensor). `overrides` replace LlamaConfig
  fields that are run settings, not architecture (param_dtype: the stored dtype, dtype: compute,
  remat_policy, scan_layers, decode_attention); None values are ignored.
  """
  directory = Path(path)
  if cfg is None:
    config_path = directory / CONFIG_FILE
    if not config_path.exists():
      raise FileNotFoundError(f"No {CONFIG_FILE} in {directory}; pass cfg= or export one with save_hf.")
    cfg = LlamaConfig.from_hf_dict(_read_json_file(config_path))
  cfg = cfg.replace(**{k: v for k, v in overrides.items() if v is not None})

  graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0))))
  shardings = (
      dict(nnx.to_flat_state(state_shardings(abstract_state, mesh))) if mesh is not None else {}
  )
  reader = _CheckpointReader(directory)
  loaded_keys, flat = set(), []
  for state_path, variable in nnx.to_flat_state(abstract_state):
    key, transposed = hf_key(state_path)
    abstract = variable.get_value()
    stored_shape = tuple(reversed(abstract.shape)) if transposed else tuple(abstract.shape)
    host = reader.read(key, stored_shape)
    if host.shape != stored_shape:
      raise ValueError(
          f"Tensor {key!r} in {directory} has shape {host.shape}, expected {stored_shape} for {cfg}."
      )
    host = (host.T if transposed else host).astype(abstract.dtype, copy=False)
    sharding = shardings[state_path].get_value() if mesh is not None else None
    flat.append((state_path, variable.replace(_to_device(host, sharding))))
    loaded_keys.add(key)
  unexpected = sorted(
      k for k in reader.files
      if k not in loaded_keys and not k.endswith(_IGNORED_KEY_SUFFIXES)
      and not (cfg.tie_embeddings and k == "lm_head.weight")
  )
  if unexpected:
    raise ValueError(
        f"Checkpoint {directory} has tensors this config does not use: {unexpected[:5]}"
        f"{' ...' if len(unexpected) > 5 else ''}; check num_layers / tie_embeddings in config.json."
    )
  return cfg, nnx.merge(graphdef, nnx.from_flat_state(flat))


def _module_at(model: nnx.Module, path: StatePath) -> nnx.Module:
  return functools.reduce(lambda m, k: m[k] if isinstance(k, int) else getattr(m, k), path, model)


def _export_tensors(model: Llama) -> Iterator[tuple[str, StatePath, tuple[int, ...]]]:
  """(HF key, parameter path, HF shape) for every base parameter, LoRA excluded."""
  for state_path, variable in nnx.to_flat_state(nnx.state(model, FROZEN_BASE_FILTER)):
    key, transposed = hf_key(state_path)
    shape = tuple(variable.get_value().shape)
    yield key, state_path, tuple(reversed(shape)) if transposed else shape


def _host_tensor(model: Llama, state_path: StatePath, out_dtype: np.dtype) -> np.ndarray:
  """The parameter as a HF-layout numpy array (LoRA merged), gathered from all processes."""
  module = _module_at(model, state_path[:-1]) if len(state_path) > 1 else None
  if isinstance(module, Linear):
    array, transposed = merged_kernel(module), True
  else:
    array, transposed = _module_at(model, state_path)[...], False
  if not array.is_fully_addressable:
    array = multihost_utils.process_allgather(array, tiled=True)
  host = np.asarray(jax.device_get(array))
  host = host.T if transposed else host
  return np.ascontiguousarray(host.astype(out_dtype, copy=False))


def _plan_shards(
    entries: list[tuple[str, StatePath, tuple[int, ...]]], itemsize: int, max_shard_bytes: int
) -> list[list[tuple[str, StatePath, tuple[int, ...]]]]:
  shards, current, current_bytes = [], [], 0
  for entry in entries:
    size = int(np.prod(entry[2])) * itemsize
    if current and current_bytes + size > max_shard_bytes:
      shards.append(current)
      current, current_bytes = [], 0
    current.append(entry)
    current_bytes += size
  return shards + [current]


def _save_tensors(tensors: dict[str, np.ndarray], file: Path) -> None:
  """`safetensors` writes a temporary file (mode 0600) and renames it into place; the file then gets the
  mode of any new file, 0666 less the umask, so the exported model is as readable as the rest."""
  save_file(tensors, file, metadata={"format": "pt"})
  umask = os.umask(0)
  os.umask(umask)
  file.chmod(0o666 & ~umask)


def save_hf(
    model: Llama, cfg: LlamaConfig, path: str | os.PathLike, *, tokenizer=None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
  """Write `model` as a HF Llama directory (LoRA adapters merged; the model is not modified).

  Tensors are stored in `cfg.param_dtype`; files above `max_shard_bytes` are split into
  `model-0000i-of-0000n.safetensors` with a `model.safetensors.index.json`. Host RAM holds one
  shard at a time. Every process must call this (arrays are gathered); process 0 writes.
  `tokenizer`, if given, must have `save_pretrained(path)`.
  """
  if not isinstance(model, Llama):
    raise TypeError(f"save_hf expects a spa_jax Llama, got {type(model).__name__}.")
  out_dir = Path(path)
  writer = jax.process_index() == 0
  out_dtype = np.dtype(cfg.param_dtype)
  entries = list(_export_tensors(model))
  shards = _plan_shards(entries, out_dtype.itemsize, max_shard_bytes)
  names = (
      [SINGLE_FILE] if len(shards) == 1
      else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  )
  if writer:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_hf_dict(), indent=2))
  weight_map, total_bytes = {}, 0
  for name, shard in zip(names, shards):
    tensors = {key: _host_tensor(model, state_path, out_dtype) for key, state_path, _ in shard}
    if writer:
      _save_tensors(tensors, out_dir / name)
    weight_map.update({key: name for key in tensors})
    total_bytes += sum(t.nbytes for t in tensors.values())
  if writer and len(shards) > 1:
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2))
  if writer and tokenizer is not None:
    if not hasattr(tokenizer, "save_pretrained"):
      raise TypeError(f"tokenizer {type(tokenizer).__name__} has no save_pretrained(path) method.")
    tokenizer.save_pretrained(out_dir)
  return out_dir
