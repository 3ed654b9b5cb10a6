"""rltrain-export: the exported file, run by plain torch / onnxruntime in a process that never imports rltrain,
acts like rltrain-eval's deterministic policy on the same observations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import run_cli

REPO = str(Path(__file__).resolve().parents[1])
BASE = ["debug=smoke", "total_env_steps=512", "env.num_envs=2", "eval.every_env_steps=0", "logger=quiet"]
CASES = {
    "ppo_discrete": ["algo=ppo", "algo.norm_obs=true"],
    "ppo_box": ["algo=ppo", "env=pendulum", "algo.norm_obs=true", "algo.init_log_std=1.0"],
    "dqn": ["algo=dqn", "algo.learning_starts=128", "algo.train_frequency=4", "algo.buffer_size=1000"],
    "sac": ["algo=sac", "env=pendulum", "algo.learning_starts=128", "algo.buffer_size=1000"],
    "ppo_image": ["algo=ppo", "env=minatar", "env.num_envs=2"],
}
RECURRENT = {core: ["algo=ppo", "env=cartpole_novel", f"model.core={core}", "model.core_size=16",
                    "algo.rollout_len=16"] for core in ("lstm", "gru")}

# runs in a fresh interpreter whose path has no rltrain: only torch / onnxruntime / numpy
RUNNER = """
import sys, numpy as np
obs = np.load(sys.argv[3])
if sys.argv[1] == "torchscript":
    import torch
    torch.set_num_threads(1)
    actions = torch.jit.load(sys.argv[2])(torch.from_numpy(obs)).numpy()
else:
    import onnxruntime as ort
    session = ort.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
    actions = session.run(["action"], {"obs": obs})[0]
assert not any(m == "rltrain" or m.startswith("rltrain.") for m in sys.modules), "imported rltrain"
np.save(sys.argv[4], actions)
"""


def _plain_python_actions(fmt: str, model: Path, obs: np.ndarray, tmp: Path) -> np.ndarray:
    np.save(tmp / "obs.npy", obs)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", RUNNER, fmt, str(model), str(tmp / "obs.npy"), str(tmp / "act.npy")],
                         capture_output=True, text=True, cwd=tmp, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    return np.load(tmp / "act.npy")


def _eval_actions(run_dir: Path, obs: np.ndarray) -> np.ndarray:
    """What rltrain-eval does with these observations: the loaded policy's deterministic act, Box clipped."""
    from rltrain.cli.build import env_factory, load_policy

    policy, cfg, _, _ = load_policy(run_dir)
    spec = env_factory(cfg["env"]).spec()
    with torch.no_grad():
        actions = policy.act(torch.as_tensor(obs), deterministic=True).action.numpy()
    if spec.action_kind != "discrete":
        actions = np.clip(actions, np.asarray(spec.action_low), np.asarray(spec.action_high))
    return actions


def _observations(run_dir: Path, n: int = 64) -> np.ndarray:
    """``n`` observations drawn from the env's own observation space (seeded), in its dtype; float ones
    spread wider than the training data so that the normalisation and the action clipping matter."""
    from rltrain.cli.build import env_factory, load_policy

    _, cfg, _, _ = load_policy(run_dir)
    space = env_factory(cfg["env"]).make().observation_space
    space.seed(0)
    obs = np.stack([space.sample() for _ in range(n)])
    if obs.dtype == np.float32:
        obs = obs * np.float32(3.0)
    return obs


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    runs: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in runs:
            if case == "ppo_image":
                pytest.importorskip("minatar")
            root = tmp_path_factory.mktemp(case)
            overrides = CASES[case] if case in CASES else RECURRENT[case]
            res = run_cli([*BASE, *overrides, f"hydra.run.dir={root / 'run'}"], cwd=root, timeout=300)
            assert res.returncode == 0, res.stderr
            runs[case] = root / "run"
        return runs[case]

    return get


SLOW = {"sac", "ppo_image"}  # their training runs take over 20 s on a busy machine


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_exported_policy_acts_like_eval(trained, tmp_path, case, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    from rltrain.cli.export import export

    run_dir = trained(case)
    model = export(run_dir, fmt=fmt, out=tmp_path / "export")
    obs = _observations(run_dir)
    got = _plain_python_actions(fmt, model, obs, tmp_path)
    want = _eval_actions(run_dir, obs)
    assert got.shape == want.shape
    if want.dtype.kind in "iu":
        assert got.dtype == np.int64 and np.array_equal(got, want)
        assert len(np.unique(want)) > 1 or case == "dqn"  # the observations exercise more than one action
    else:
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    record = json.loads((tmp_path / "export" / "policy.json").read_text())
    assert record["files"][fmt] == model.name
    assert record["observation"] == {"shape": list(obs.shape[1:]), "dtype": str(obs.dtype)}


def test_cli_writes_default_dir_and_spaces(trained):
    run_dir = trained("ppo_box")
    res = subprocess.run([sys.executable, "-m", "rltrain.cli.export", str(run_dir), "--format", "torchscript"],
                         capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONPATH": REPO})
    assert res.returncode == 0, res.stderr
    record = json.loads((run_dir / "export" / "policy.json").read_text())
    assert record["action"] == {"kind": "box", "shape": [1], "dtype": "float32", "low": [-2.0], "high": [2.0]}
    assert record["env_id"] == "Pendulum-v1" and record["files"] == {"torchscript": "policy.pt"}


def test_bad_input_is_one_line(trained, tmp_path):
    run_dir = trained("ppo_discrete")
    env = {**os.environ, "PYTHONPATH": REPO}
    for target, args, needle in ((run_dir, ["--format", "tflite"], "--format=tflite: unknown format"),
                                 (tmp_path / "nothing", [], str(tmp_path / "nothing"))):
        res = subprocess.run([sys.executable, "-m", "rltrain.cli.export", str(target), *args], capture_output=True,
                             text=True, timeout=120, env=env)
        assert res.returncode == 2 and res.stderr.startswith("rltrain-export: error:"), res.stderr
        assert res.stderr.count("\n") == 1 and needle in res.stderr


# a recurrent policy: T steps of a batch of envs, the state carried and zeroed where an episode ended
RECURRENT_RUNNER = """
import json, sys, numpy as np
obs, done = np.load(sys.argv[3]), np.load(sys.argv[4])
spec = json.load(open(sys.argv[6]))["state"]
state = [np.zeros((1, obs.shape[1], spec["shape"][2]), np.float32) for _ in spec["names"]]
if sys.argv[1] == "torchscript":
    import torch
    model = torch.jit.load(sys.argv[2])
    step = lambda o, s: [t.numpy() for t in model(torch.from_numpy(o), *map(torch.from_numpy, s))]
else:
    import onnxruntime as ort
    session = ort.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
    outs = ["action", *(n + "_out" for n in spec["names"])]
    step = lambda o, s: session.run(outs, {"obs": o, **dict(zip(spec["names"], s))})
actions = []
for t in range(len(obs)):
    action, *state = step(obs[t], state)
    actions.append(action)
    state = [s * (1.0 - done[t])[None, :, None].astype(np.float32) for s in state]
assert not any(m == "rltrain" or m.startswith("rltrain.") for m in sys.modules), "imported rltrain"
np.save(sys.argv[5], np.stack(actions))
"""


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_recurrent_export_carries_the_state_like_eval(trained, tmp_path, core, fmt):
    """The exported recurrent actor, stepped with its state (zeroed at episode ends), picks the actions the
    loaded policy picks when it acts with its state; the state changes the action (memory is exported)."""
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    from rltrain.cli.build import load_policy
    from rltrain.cli.export import export
    from rltrain.models.cores import reset_state

    run_dir = trained(core)
    model = export(run_dir, fmt=fmt, out=tmp_path / "export")
    record = json.loads((tmp_path / "export" / "policy.json").read_text())
    assert record["state"]["names"] == (["h", "c"] if core == "lstm" else ["h"])
    assert record["state"]["shape"] == [1, "B", 16]

    rng = np.random.default_rng(0)
    T, B = 40, 8
    obs = (rng.standard_normal((T, B, 4)) * [1.0, 0.0, 0.2, 0.0]).astype(np.float32)
    done = rng.random((T, B)) < 0.1
    np.save(tmp_path / "obs.npy", obs)
    np.save(tmp_path / "done.npy", done)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", RECURRENT_RUNNER, fmt, str(model), str(tmp_path / "obs.npy"),
                          str(tmp_path / "done.npy"), str(tmp_path / "act.npy"),
                          str(tmp_path / "export" / "policy.json")],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    got = np.load(tmp_path / "act.npy")

    policy, _, _, _ = load_policy(run_dir)
    want, stateless, state = [], [], policy.initial_state(B)
    with torch.no_grad():
        for t in range(T):
            out = policy.act(torch.as_tensor(obs[t]), state, deterministic=True)
            want.append(out.action.numpy())
            stateless.append(policy.act(torch.as_tensor(obs[t]), None, deterministic=True).action.numpy())
            state = reset_state(out.state, done[t])
    want = np.stack(want)
    assert got.dtype == np.int64 and np.array_equal(got, want)
    assert not np.array_equal(want, np.stack(stateless))  # the state matters, so carrying it was tested
