"""Write audit for multi-process tests: Python imports this at startup when its folder is on
PYTHONPATH. When SPA_TEST_WRITE_LOG names a file, every file this process (or a Python child that
inherits the variable) opens for writing, renames into place or removes is appended to it, one
absolute path per line. Native writers (safetensors, tensorstore) are not seen."""

import os
import sys

_LOG = os.environ.get("SPA_TEST_WRITE_LOG")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _written_path(event: str, args: tuple):
  """The path an audit event writes to, else None."""
  if event == "open":
    path, mode, flags = args
    writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & _WRITE_FLAGS)
    return path if writes else None
  if event == "os.rename":  # os.rename and os.replace
    return args[1]
  if event in ("os.remove", "shutil.rmtree"):
    return args[0]
  return None


if _LOG:
  _FD = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # before the hook: os.write is not audited

  def _audit(event: str, args: tuple) -> None:
    path = _written_path(event, args)
    if isinstance(path, (str, bytes, os.PathLike)):
      os.write(_FD, (os.path.abspath(os.fsdecode(path)) + "\n").encode())

  sys.addaudithook(_audit)
