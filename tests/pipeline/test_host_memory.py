"""The entry point's re-execution with transparent huge pages for malloc (spa_jax.host_memory)."""

import os
import subprocess
import sys

import pytest

from spa_jax import host_memory


def test_tunable_is_added_beside_other_tunables():
  assert host_memory.with_huge_pages({"PATH": "/bin"})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
  environ = host_memory.with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
  assert environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


@pytest.mark.parametrize("tunables", ["glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=2"])
def test_a_users_own_hugetlb_setting_is_kept(tunables):
  assert host_memory.with_huge_pages({"GLIBC_TUNABLES": tunables}) is None


PRINT_AFTER_REEXEC = ("import os; from spa_jax import host_memory; host_memory.reexec_with_huge_pages(); "
                      "print(os.environ.get('GLIBC_TUNABLES'))")


def _tunables_seen_by_the_command(environ: dict[str, str]) -> str:
  out = subprocess.run([sys.executable, "-c", PRINT_AFTER_REEXEC], env=environ, capture_output=True,
                       text=True, check=True)
  return out.stdout.strip()


@pytest.mark.skipif(not host_memory.huge_pages_supported(), reason="needs glibc >= 2.35 and THP not 'never'")
def test_process_reexecutes_itself_once_with_the_tunable():
  environ = {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}
  # the command ran again (once: a loop would never print) with the tunable set
  assert _tunables_seen_by_the_command(environ) == "glibc.malloc.hugetlb=1"
  opted_out = {**environ, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
  assert _tunables_seen_by_the_command(opted_out) == "glibc.malloc.hugetlb=0"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc systems only")
def test_glibc_version_is_the_running_c_library():
  name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
  assert name == "glibc" and host_memory.glibc_version() == tuple(int(x) for x in version.split(".")[:2])
