"""`python -m spa_jax.main` refuses a held workspace at once, naming the holder, and a mistyped config
field in one line."""

import os
import socket
import subprocess
import sys
import time

import pytest

from spa_jax import configuration
from spa_jax.workspace import Workspace, WorkspaceBusy

REPO = configuration.CONFIGS_DIR.parent
HOLD = "import sys\nfrom spa_jax.workspace import Workspace\nwith Workspace(sys.argv[1]).lock():\n" \
       "  print('held', flush=True)\n  sys.stdin.read()\n"


def test_a_second_run_on_a_held_workspace_fails_at_once_naming_the_holder(tmp_path):
  ws = tmp_path / "ws"
  holder = subprocess.Popen([sys.executable, "-c", HOLD, str(ws)], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(WorkspaceBusy, match=f"in use by pid {holder.pid} on {socket.gethostname()}"):
      with Workspace(ws).lock():
        pass
    started = time.monotonic()
    second = subprocess.run([sys.executable, "-m", "spa_jax.main", "--config=configs/sft.py", f"--workdir={ws}"],
                            cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode != 0
    assert f"Workspace {ws} is in use by pid {holder.pid}" in second.stderr.strip().splitlines()[-1]
    assert not (ws / "config.json").exists(), "the second run started work"
    assert time.monotonic() - started < 120
  finally:
    holder.stdin.close()
    holder.wait(timeout=30)
  with Workspace(ws).lock():  # released when its holder ended
    assert f"pid {os.getpid()}" in (ws / "lock").read_text()
  assert (ws / "lock").read_text() == ""


def test_a_mistyped_config_field_is_one_line_with_the_suggestion():
  run = subprocess.run([sys.executable, "-m", "spa_jax.main", "--config=configs/sft.py", "--config.sft.epoch=3"],
                       cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                       timeout=300)
  assert run.returncode != 0
  assert run.stderr.strip().splitlines() == [
      'FATAL Flags parsing error: \'epoch\' Did you mean "epochs" instead of "epoch"? '
      "(the fields are those of the --config file, configs/<stage>.py)"]


def test_a_truncated_input_file_is_one_line_naming_it(tmp_path):
  data = tmp_path / "webshop_sft.json"
  data.write_text('[{"id": "0", "conversations": [{"from": "human", "val')
  run = subprocess.run([sys.executable, "-m", "spa_jax.main", "--config=configs/sft.py", f"--workdir={tmp_path / 'ws'}",
                        f"--config.sft.data={data}", "--config.tracking.progress=False"],
                       cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                       timeout=300)
  assert run.returncode != 0 and "Traceback" not in run.stderr
  assert run.stderr.strip().splitlines()[-1].startswith(f"FATAL {data} is not valid JSON")
