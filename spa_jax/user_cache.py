"""The user cache every spa_jax cache lives under: imported GGUF checkpoints, file content digests and
XLA's compiled programs. `$SPA_JAX_CACHE`, else `$XDG_CACHE_HOME/spa_jax`, else `~/.cache/spa_jax`."""

import os
from pathlib import Path

XLA_SUBDIR = "xla"  # jax's persistent compilation cache (`enable_compilation_cache`)


def cache_root() -> Path:
  """$SPA_JAX_CACHE, else $XDG_CACHE_HOME/spa_jax, else ~/.cache/spa_jax."""
  if os.environ.get("SPA_JAX_CACHE"):
    return Path(os.environ["SPA_JAX_CACHE"]).expanduser()
  xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
  return Path(xdg).expanduser() / "spa_jax"


def enable_compilation_cache() -> Path:
  """Keeps every program XLA compiles for longer than a second in <cache>/xla (jax's persistent
  compilation cache), so a resumed or repeated run, or another seed, skips the compilations: on a
  busy GPU those took 1-3 minutes per program shape (bench/RESULTS.md). Call before the first
  computation; returns the directory."""
  import jax

  directory = cache_root() / XLA_SUBDIR
  jax.config.update("jax_compilation_cache_dir", str(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  return directory
