"""Content digests (SHA-256) of the files stages read and write, cached per file stat.

A file's digest is the SHA-256 of its bytes (what `sha256sum` prints); a directory's is the SHA-256
of the sorted lines `<relative path> <file digest>` of every file under it whose path has no part
starting with ".". Hashing runs at about 0.7 GB/s on a loaded 2-core machine, so digests are cached
in `digests.json` under the user cache (`$SPA_JAX_CACHE`, default `~/.cache/spa_jax`), keyed on the file's
absolute path and its (size, mtime_ns, ctime_ns, inode): a file is hashed again only after one of
these changes (any write, truncation or replacement changes them; copying a workspace elsewhere
rehashes it once). The cache is JSON: reading it can never run code.
"""

import hashlib
import json
import os
import pathlib

from spa_jax.user_cache import cache_root
from spa_jax.workspace import write_json_atomic

CACHE_FILE = "digests.json"


def default_cache_path() -> pathlib.Path:
  """`digests.json` in the user cache (`spa_jax.user_cache.cache_root`)."""
  return cache_root() / CACHE_FILE


def _stat_key(path: pathlib.Path) -> list[int]:
  stat = path.stat()
  return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


class DigestCache:
  """`digest(path)` of files and directories; `save()` keeps what was hashed for the next process."""

  def __init__(self, path: pathlib.Path | None = None):
    self.path = path or default_cache_path()
    try:
      self._entries: dict[str, dict] = json.loads(self.path.read_text())
    except (OSError, ValueError):  # no cache yet, or an unreadable one: start afresh
      self._entries = {}
    self._dirty = False

  def digest(self, path: str | os.PathLike) -> str:
    """The file's or directory's content digest (raises FileNotFoundError when it does not exist)."""
    path = pathlib.Path(path).expanduser().resolve()
    if path.is_dir():
      files = sorted(p for p in path.rglob("*") if p.is_file()
                     and not any(part.startswith(".") for part in p.relative_to(path).parts))
      lines = "".join(f"{p.relative_to(path)} {self._file_digest(p)}\n" for p in files)
      return hashlib.sha256(lines.encode()).hexdigest()
    return self._file_digest(path)

  def _file_digest(self, path: pathlib.Path) -> str:
    key, stat = str(path), _stat_key(path)
    entry = self._entries.get(key)
    if entry is None or entry["stat"] != stat:
      with open(path, "rb") as f:
        entry = {"stat": stat, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}
      self._entries[key], self._dirty = entry, True
    return entry["sha256"]

  def save(self) -> None:
    """Writes the cache if anything was hashed, dropping entries of files that no longer exist."""
    if self._dirty:
      write_json_atomic(self.path, {k: v for k, v in self._entries.items() if os.path.exists(k)})
      self._dirty = False
