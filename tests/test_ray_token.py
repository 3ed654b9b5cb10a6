"""trainer.backend=ray against a cluster that requires token authentication, as ``ray start --head`` starts one
(Ray 2.60 with ``RAY_AUTH_MODE=token``; never turned off here nor by rltrain): a missing or wrong token is
refused in one line naming the fix, a non-zero exit within 60 s and no run directory.

The head is this module's own ``ray start --head --block`` process on free ports; SIGTERM to it stops every Ray
process it started (nothing else on the machine is touched: no ``ray stop``).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")
pytestmark = pytest.mark.ray

RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.pop("HYDRA_FULL_ERROR", None)
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture(scope="module")
def token_head(tmp_path_factory):
    home = tmp_path_factory.mktemp("head")
    token = home / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    port = _free_port()
    # a short drain on SIGTERM (30 s by default, for Ray Serve): nothing runs on it when the module ends
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token), HOME=str(home),
               RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="2")
    cmd = [RAY, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
           "--disable-usage-stats", f"--ray-client-server-port={_free_port()}",
           f"--dashboard-agent-listen-port={_free_port()}", "--block"]
    head = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # up once the GCS port accepts connections
            assert head.poll() is None, head.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the token head did not come up"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    break
            except OSError:
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops what it started
        try:
            head.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


FAST = ["trainer=subprocess_actors", "algo=impala", "debug=smoke", "env.num_envs=2", "eval.every_env_steps=0",
        "checkpoint.every_env_steps=0", "logger.progress=plain", "trainer.backend=ray", "hydra.run.dir=run"]


def _refused(tmp_path: Path, address: str, env: dict) -> str:
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "rltrain", *FAST, f"trainer.ray.address={address}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=90, env=env)
    assert time.monotonic() - started < 60
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("rltrain: error:")]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-3000:]
    assert not (tmp_path / "run").exists(), sorted((tmp_path / "run").rglob("*"))
    return lines[0]


def test_wrong_token_is_refused_in_one_line(token_head, tmp_path):
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), HOME=str(tmp_path))
    line = _refused(tmp_path, token_head, env)
    assert "authentication token from RAY_AUTH_TOKEN is not this cluster's" in line, line
    assert "ray get-auth-token" in line


def test_no_token_is_refused_in_one_line(token_head, tmp_path):
    line = _refused(tmp_path, token_head, _env(HOME=str(tmp_path)))  # no RAY_AUTH_MODE, no token anywhere
    assert "RAY_AUTH_MODE=token" in line and "RAY_AUTH_TOKEN" in line and "ray get-auth-token" in line, line
