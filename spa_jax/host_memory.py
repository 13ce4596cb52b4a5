"""Transparent huge pages for host memory, so XLA:CPU steps do not spend their time in page faults.

XLA:CPU takes each execution's temporaries (1.4 GiB for a tiny-model SFT step) from malloc, which
serves blocks that large with a fresh mmap and returns them at the end: every step faults its
temporaries in again, 4 KiB at a time, and on 2 cores a third of the SFT time went to the kernel
(bench/sft_step_bench.py). glibc >= 2.35 backs its mmap'd blocks with transparent huge
pages (2 MiB per fault) when GLIBC_TUNABLES holds `glibc.malloc.hugetlb=1`. glibc reads the tunable
once, at process start, so the entry point re-executes itself with it set.

A GLIBC_TUNABLES that already names `glibc.malloc.hugetlb` is the user's choice and is kept
(`glibc.malloc.hugetlb=0` turns this off).
"""

import os
import sys

TUNABLE = "glibc.malloc.hugetlb"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def glibc_version() -> tuple[int, int] | None:
  """The running glibc's (major, minor), or None on another C library (asked of the C library
  itself: no scan of the Python binary, as platform.libc_ver does)."""
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
  except (AttributeError, ValueError, OSError):
    return None
  major, minor = version.split(".")[:2]
  return (int(major), int(minor)) if name == "glibc" else None


def huge_pages_supported() -> bool:
  """glibc >= 2.35 on a kernel whose transparent huge pages are not disabled."""
  if (glibc_version() or (0, 0)) < (2, 35):
    return False
  try:
    with open(THP_SETTING) as f:
      return "[never]" not in f.read()
  except OSError:
    return False


def with_huge_pages(environ: dict[str, str]) -> dict[str, str] | None:
  """`environ` with the tunable added, or None when it needs no change (already set by anyone)."""
  tunables = environ.get("GLIBC_TUNABLES", "")
  if TUNABLE in tunables:
    return None
  return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, [tunables, f"{TUNABLE}=1"]))}


def reexec_with_huge_pages() -> None:
  """Replaces this process by the same command with the tunable set; returns when nothing to do."""
  environ = with_huge_pages(dict(os.environ))
  if environ is not None and huge_pages_supported():
    os.execve(sys.executable, sys.orig_argv, environ)
