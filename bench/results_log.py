"""Appending a benchmark's section to bench/RESULTS.md: title with the UTC time, machine, command, commit."""

import datetime
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "RESULTS.md"


def commit() -> str:
  """The checkout's short commit, with "+dirty" when tracked files differ from it."""
  head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
  dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=REPO).returncode != 0
  return (head.stdout.strip() or "unknown") + ("+dirty" if dirty else "")


def machine() -> str:
  gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                       text=True).stdout.strip() if _has("nvidia-smi") else ""
  return (f"{platform.machine()}, {os.cpu_count()} CPU cores{', ' + gpu if gpu else ''}, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end")


def _has(program: str) -> bool:
  return any((pathlib.Path(p) / program).exists() for p in os.environ.get("PATH", "").split(os.pathsep))


def append_section(title: str, command: str, body: str) -> None:
  """## <title> (<UTC time>) with machine, command and commit lines, then `body`."""
  now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  header = [f"\n## {title} ({now})", "", f"- machine: {machine()}", f"- command: `{command}`",
            f"- commit: {commit()}", "", ""]
  with RESULTS.open("a") as f:
    f.write("\n".join(header) + body + "\n")


def publish(title: str, body: str, payload, *, results: bool) -> None:
  """A benchmark's end: `body` (markdown) on stderr; with `results`, appended to RESULTS.md as section
  `title` with the command line that ran; `payload` as ONE JSON line on stdout."""
  print(body, file=sys.stderr)
  if results:
    append_section(title, shlex.join(["python", *sys.argv]), body)
  print(json.dumps(payload))
