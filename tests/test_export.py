"""rltrain-export: the file it writes, run by plain torch / onnxruntime in a process where importing rltrain
fails, acts like the loaded policy's deterministic ``act`` (``rltrain.load_policy``) on the same observations:
Discrete, Box, Dict and image observations, feed-forward and recurrent, in each format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import rltrain
from rltrain.cli.build import run
from tests.conftest import compose_cfg

torch.set_num_threads(1)

REPO = str(Path(__file__).resolve().parents[1])
BASE = ["debug=smoke", "total_env_steps=512", "env.num_envs=2", "eval.every_env_steps=0", "logger=quiet"]
# separate torsos: on this constant-reward env a shared torso's value loss pulls every observation to one action
# within the run, and the comparison needs observations that exercise several
DICT_ENV = ["algo=ppo", "algo.rollout_len=16", "algo.num_minibatches=2", "model.shared=false",
            "model.hidden_sizes=[16]", "model.cnn_features=16",
            "env.id=tests.helpers.obs_envs:DictEnv", "+env.kwargs.image_shape=[10,10,3]", "+env.kwargs.nested=true"]
CASES = {
    "ppo_discrete": ["algo=ppo", "algo.norm_obs=true"],
    "ppo_box": ["algo=ppo", "env=pendulum", "algo.norm_obs=true", "algo.init_log_std=1.0"],
    "ppo_dict": DICT_ENV,
    "dqn": ["algo=dqn", "algo.learning_starts=128", "algo.train_frequency=4", "algo.buffer_size=1000"],
    # the exported policy acts greedily on the mean Q (noise off, C51's expectation / QR-DQN's mean quantile)
    "rainbow": ["algo=rainbow", "algo.learning_starts=128", "algo.buffer_size=1000", "algo.v_min=0", "algo.v_max=50"],
    "qrdqn": ["algo=dqn", "algo.distributional=qr", "algo.dueling=true", "algo.n_quantiles=16",
              "algo.learning_starts=128", "algo.buffer_size=1000"],
    "pqn": ["algo=pqn", "algo.rollout_len=32"],
    "sac": ["algo=sac", "env=pendulum", "algo.learning_starts=128", "algo.buffer_size=1000",
            "model.hidden_sizes=[32,32]"],
    # the actor on the critic's shared encoder (models/sac_networks.py)
    "sac_image": ["algo=sac", "env.id=tests.helpers.obs_envs:ImageEnv", "+env.kwargs.continuous=true",
                  "+env.kwargs.shape=[10,10,3]", "model.encoder=minatar", "model.cnn_features=16",
                  "model.hidden_sizes=[16]", "algo.learning_starts=448", "algo.batch_size=32", "algo.buffer_size=1000"],
    "ppo_image": ["algo=ppo", "env=minatar", "env.num_envs=2"],
    # a Box observation of shape (): batches of [B], one number each
    "ppo_scalar": ["algo=ppo", "env.id=tests.helpers.obs_envs:ScalarEnv", "algo.rollout_len=32"],
    "sac_scalar": ["algo=sac", "env.id=tests.helpers.obs_envs:ScalarEnv", "+env.kwargs.continuous=true",
                   "algo.learning_starts=128", "algo.buffer_size=1000", "model.hidden_sizes=[32,32]"],
    # float64 observations and actions (a custom env's Box(..., np.float64)): the file takes the env's own
    # observation and returns its own action dtype, cast inside the graph
    "ppo_float64": ["algo=ppo", "env.id=tests.helpers.space_envs:StrictDtypeEnv", "algo.init_log_std=1.0"],
    "sac_float64": ["algo=sac", "env.id=tests.helpers.space_envs:StrictDtypeEnv", "algo.learning_starts=128",
                    "algo.buffer_size=1000", "model.hidden_sizes=[32,32]"],
    # a (2, 2) Box action, which the policy acts on as 4 values: the file returns [B, 2, 2] (a float64 one:
    # tests/test_multiagent_games.py)
    "td3_matrix": ["algo=td3", "env.id=tests.helpers.shaped_envs:MatrixEnv", "algo.learning_starts=128",
                   "algo.buffer_size=1000", "model.hidden_sizes=[32,32]"],
    "td3": ["algo=td3", "env=pendulum", "algo.learning_starts=128", "algo.buffer_size=1000",
            "model.hidden_sizes=[32,32]"],
    # the deterministic actor on the critic's shared encoder (models/deterministic_actor.py)
    "ddpg_image": ["algo=ddpg", "env.id=tests.helpers.obs_envs:ImageEnv", "+env.kwargs.continuous=true",
                   "+env.kwargs.shape=[10,10,3]", "model.encoder=minatar", "model.cnn_features=16",
                   "model.hidden_sizes=[16]", "algo.learning_starts=448", "algo.batch_size=32",
                   "algo.buffer_size=1000"],
}
RECURRENT = {core: ["algo=ppo", "env=cartpole_novel", f"model.core={core}", "model.core_size=16",
                    "algo.rollout_len=16"] for core in ("lstm", "gru")}
FORMATS = ["export", "onnx", "torchscript"]
SLOW = {"ppo_image"}  # its training run takes over 20 s on a busy machine

# A fresh interpreter in which `import rltrain` raises, run from an empty directory without PYTHONPATH: only
# torch / onnxruntime / numpy and the files. It steps each exported file T times over a batch of B envs (inputs
# [T, B, ...] in its description's order), carrying a recurrent state and zeroing it where an episode ended.
RUNNER = """
import importlib.abc, sys
class NoRltrain(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "rltrain" or name.startswith("rltrain."):
            raise ImportError("an exported policy must run without rltrain, yet " + name + " was imported")
sys.meta_path.insert(0, NoRltrain())
import json, numpy as np
arrays = np.load(sys.argv[1])
done = arrays["done"]

def stepper(fmt, model):
    if fmt == "onnx":
        import onnxruntime as ort
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        outs = [o.name for o in session.get_outputs()]
        names = [i.name for i in session.get_inputs()]
        return lambda xs: session.run(outs, dict(zip(names, xs)))
    import torch
    torch.set_num_threads(1)
    net = torch.export.load(model).module() if fmt == "export" else torch.jit.load(model)
    def step(xs):
        result = net(*map(torch.from_numpy, xs))
        return [t.numpy() for t in (result if isinstance(result, (tuple, list)) else (result,))]
    return step

results = {}
for fmt, model in zip(sys.argv[3::2], sys.argv[4::2]):
    record = json.load(open(model.rsplit(".", 1)[0] + ".json"))
    state_names = record.get("state", {}).get("names", [])
    obs_names = [i["name"] for i in record["inputs"]][:len(record["inputs"]) - len(state_names)]
    state = [np.zeros((1, done.shape[1], record["state"]["shape"][2]), np.float32) for _ in state_names]
    step, actions = stepper(fmt, model), []
    for t in range(len(done)):
        action, *state = step([arrays[n][t] for n in obs_names] + state)
        actions.append(action)
        state = [s * (1.0 - done[t])[None, :, None].astype(np.float32) for s in state]
    results[fmt] = np.stack(actions)
np.savez(sys.argv[2], **results)
"""


def _standalone_actions(models: dict[str, Path], inputs: dict[str, np.ndarray], done: np.ndarray,
                        tmp: Path) -> dict[str, np.ndarray]:
    """Actions [T, B, ...] of each exported file (format -> file), run as described above."""
    np.savez(tmp / "inputs.npz", done=done, **inputs)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cwd = tmp / "elsewhere"
    cwd.mkdir(exist_ok=True)
    args = [str(a) for fmt, model in models.items() for a in (fmt, model)]
    res = subprocess.run([sys.executable, "-c", RUNNER, str(tmp / "inputs.npz"), str(tmp / "act.npz"), *args],
                         capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    with np.load(tmp / "act.npz") as saved:
        return {fmt: saved[fmt] for fmt in models}


def _stack(samples: list):
    if isinstance(samples[0], dict):
        return {k: _stack([s[k] for s in samples]) for k in samples[0]}
    return np.stack(samples)


def _leaf(tree, name: str) -> np.ndarray:
    for key in name.split(".")[1:]:  # "obs" or "obs.<key>[.<subkey>]"
        tree = tree[key]
    return tree


def _observations(policy, n: int = 64):
    """``n`` observations drawn from the env's own observation space (seeded), in its dtype; float ones spread
    wider than the training data so that the normalisation and the action clipping matter."""
    from rltrain.cli.build import env_factory

    space = env_factory(policy.config["env"]).make().observation_space
    space.seed(0)
    return _widen(_stack([space.sample() for _ in range(n)]))


def _widen(obs):
    if isinstance(obs, dict):
        return {k: _widen(v) for k, v in obs.items()}
    return obs * obs.dtype.type(3.0) if obs.dtype.kind == "f" else obs


def _formats() -> list[str]:
    """The formats this environment can write and run (onnx needs the export extra)."""
    import importlib.util

    onnx = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))
    return [f for f in FORMATS if f != "onnx" or onnx]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    runs: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in runs:
            if case == "ppo_image":
                pytest.importorskip("minatar")
            # trained in this process, as the grid's sequential cases are (tests/test_grid.py): what is tested
            # here is the export of the run dir it leaves, and a fresh interpreter per case only cost its start
            run_dir = tmp_path_factory.mktemp(case) / "run"
            overrides = CASES[case] if case in CASES else RECURRENT[case]
            summary = run(compose_cfg([*BASE, *overrides]), run_dir)
            assert summary["status"] == "completed", summary
            runs[case] = run_dir
        return runs[case]

    return get


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_exported_policy_acts_like_the_loaded_policy_without_rltrain(trained, tmp_path, case):
    from rltrain.cli.export import export

    run_dir = trained(case)
    # any name --out gives: the description goes beside each file as <stem>.json
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        models = {fmt: export(run_dir, fmt=fmt, out=tmp_path / fmt / "policy.file", allow_import=True)
                  for fmt in _formats()}
    # torch's noise on a sound export reaches no user (the encoders' zero-size anchors, a deprecated pytree check)
    assert not [w for w in caught if "No complete tensor" in str(w.message) or "LeafSpec" in str(w.message)]
    record = json.loads((tmp_path / "export" / "policy.json").read_text())
    policy = rltrain.load_policy(run_dir, allow_import=True)
    obs = _observations(policy)
    names = [i["name"] for i in record["inputs"]]
    got = _standalone_actions(models, {n: _leaf(obs, n)[None] for n in names}, np.zeros((1, 64), bool), tmp_path)
    want, _ = policy.act(obs, deterministic=True)
    for fmt, model in models.items():
        assert model == tmp_path / fmt / "policy.file" and model.is_file()
        assert json.loads((tmp_path / fmt / "policy.json").read_text())["files"] == {fmt: "policy.file"}
        actions = got[fmt][0]
        assert actions.shape == want.shape and actions.dtype == want.dtype, fmt
        if want.dtype.kind in "iu":
            assert np.array_equal(actions, want), fmt
        else:
            np.testing.assert_allclose(actions, want, atol=1e-5, rtol=1e-5, err_msg=fmt)
    if want.dtype.kind in "iu":
        # the observations exercise more than one action (a barely trained Q-network may prefer one everywhere)
        assert len(np.unique(want)) > 1 or case in ("dqn", "rainbow", "qrdqn", "pqn")
    assert record["outputs"][0] == {"name": "action", "shape": ["B", *want.shape[1:]], "dtype": str(want.dtype)}
    assert record["inputs"] == [{"name": n, "shape": ["B", *_leaf(obs, n).shape[1:]], "dtype": str(_leaf(obs, n).dtype)}
                                for n in names]
    if case.endswith("_matrix"):  # the env's own shape, its bounds in it
        assert want.shape == (64, 2, 2) and record["action"]["low"] == [[0.0, 1.0], [2.0, 3.0]]
    if case == "ppo_dict":  # one input per stored key, in the space's (sorted) key order
        assert names == ["obs.arm.gripper", "obs.arm.joints", "obs.flags", "obs.mode", "obs.pixels",
                         "obs.state"]


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_recurrent_export_carries_the_state_like_the_loaded_policy(trained, tmp_path, core):
    """The exported recurrent actor, stepped with its state (zeroed at episode ends), picks the actions the
    loaded policy picks when it acts with its state; the state changes the action (memory is exported)."""
    from rltrain.cli.export import export

    run_dir = trained(core)
    models = {fmt: export(run_dir, fmt=fmt, out=tmp_path / f"policy.{fmt}") for fmt in _formats()}
    record = json.loads((tmp_path / "policy.json").read_text())
    names = ["h", "c"] if core == "lstm" else ["h"]
    assert record["state"]["names"] == names and record["state"]["shape"] == [1, "B", 16]
    assert [o["name"] for o in record["outputs"]] == ["action", *(f"{n}_out" for n in names)]
    assert record["files"] == {fmt: f"policy.{fmt}" for fmt in models}  # the formats beside each other

    rng = np.random.default_rng(0)
    T, B = 40, 8
    obs = (rng.standard_normal((T, B, 4)) * [1.0, 0.0, 0.2, 0.0]).astype(np.float32)
    done = rng.random((T, B)) < 0.1
    got = _standalone_actions(models, {"obs": obs}, done, tmp_path)

    policy = rltrain.load_policy(run_dir)
    want, stateless, state = [], [], None
    for t in range(T):
        action, state = policy.act(obs[t], state)
        want.append(action)
        stateless.append(policy.act(obs[t])[0])
        state = policy.reset_state(state, done[t])
    want = np.stack(want)
    for fmt in models:
        assert got[fmt].dtype == np.int64 and np.array_equal(got[fmt], want), fmt
    assert not np.array_equal(want, np.stack(stateless))  # the state matters, so carrying it was tested


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rltrain.cli.export", *args], capture_output=True, text=True,
                          timeout=180, cwd=cwd, env={**os.environ, "PYTHONPATH": REPO})


def test_cli_writes_the_named_file_refuses_to_overwrite_and_replaces_with_force(trained, tmp_path):
    run_dir = trained("ppo_box")
    res = _cli(str(run_dir), cwd=tmp_path)  # default: a torch.export program beside the run
    assert res.returncode == 0, res.stderr
    default = run_dir / "export" / "policy.pt2"
    assert default.is_file() and res.stdout.strip() == f"wrote {default} and {default.with_suffix('.json')}"
    record = json.loads(default.with_suffix(".json").read_text())
    assert record["action"] == {"kind": "box", "shape": [1], "dtype": "float32", "low": [-2.0], "high": [2.0]}
    assert record["env_id"] == "Pendulum-v1" and record["files"] == {"export": "policy.pt2"}
    assert record["observation"] == {"shape": [3], "dtype": "float32"}
    assert record["env"]["id"] == "Pendulum-v1" and {"kwargs", "wrappers", "max_episode_steps"} <= set(record["env"])

    before = default.stat().st_mtime_ns
    again = _cli(str(run_dir), cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert again.stderr.startswith(f"rltrain-export: error: the default output {default}: exists; pass --force")
    assert default.stat().st_mtime_ns == before

    out = tmp_path / "deploy" / "pendulum.pt"  # --out names a file, parents created
    res = _cli(str(run_dir / "checkpoints" / "final.pt"), "--format", "torchscript", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0 and out.is_file() and (tmp_path / "deploy" / "pendulum.json").is_file()
    assert "TorchScript is deprecated" in res.stderr and "--format export" in res.stderr
    refused = _cli(str(run_dir), "--format", "torchscript", "--out", str(out), cwd=tmp_path)
    assert refused.returncode == 2 and f"--out={out}: exists; pass --force" in refused.stderr
    forced = _cli(str(run_dir), "--format", "torchscript", "--out", str(out), "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["pendulum.json", "pendulum.pt"]  # no temp left


def test_bad_input_is_one_line_and_writes_nothing(trained, tmp_path):
    run_dir = trained("ppo_discrete")
    (tmp_path / "a_dir").mkdir()
    for target, args, needle in (
            (run_dir, ["--format", "tflite"], "--format=tflite: unknown format; use export, onnx, torchscript"),
            (run_dir, ["--out", str(tmp_path / "a_dir")], f"--out={tmp_path / 'a_dir'}: is a directory"),
            (run_dir, ["--out", str(tmp_path / "p.json")], "p.json: .json is the name of the description"),
            (tmp_path / "nothing", ["--out", str(tmp_path / "x.pt2")], str(tmp_path / "nothing"))):
        res = _cli(str(target), *args, cwd=tmp_path)
        assert res.returncode == 2 and res.stderr.startswith("rltrain-export: error:"), res.stderr
        assert res.stderr.count("\n") == 1 and needle in res.stderr, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir"] and not any((tmp_path / "a_dir").iterdir())


def test_onnx_falls_back_to_the_torchscript_exporter_out_loud(trained, tmp_path, monkeypatch, capsys):
    """Where torch.export cannot capture a policy, --format onnx says why in one line and the dynamo=False
    exporter writes a file that still acts like the policy; --format export refuses in one line."""
    if "onnx" not in _formats():
        pytest.skip("needs rltrain[export]")
    from rltrain.cli import export as export_cli
    from rltrain.errors import ConfigError

    def refuse(*args, **kwargs):
        raise RuntimeError("no ONNX translation for aten::made_up_op\nsecond line of detail")

    monkeypatch.setattr(export_cli, "exported_program", refuse)
    run_dir = trained("ppo_discrete")
    model = export_cli.export(run_dir, fmt="onnx", out=tmp_path / "policy.onnx")
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rltrain-export:")]
    assert err == ["rltrain-export: warning: the dynamo ONNX exporter failed (RuntimeError: no ONNX translation "
                   "for aten::made_up_op); falling back to torch.onnx.export(dynamo=False)"]
    with pytest.raises(ConfigError, match=r"^--format=export: torch.export cannot capture this policy \(RuntimeError: "
                                          r"no ONNX translation for aten::made_up_op\); --format onnx falls back"):
        export_cli.export(run_dir, out=tmp_path / "policy.pt2")
    assert not (tmp_path / "policy.pt2").exists()
    policy = rltrain.load_policy(run_dir)
    obs = _observations(policy)
    got = _standalone_actions({"onnx": model}, {"obs": obs[None]}, np.zeros((1, 64), bool), tmp_path)["onnx"]
    assert np.array_equal(got[0], policy.act(obs)[0])



@pytest.mark.parametrize("runs", [("agent_0", "agent_1"), ("0", "1", "2", "3")], ids=["parallel", "sweep"])
def test_a_directory_of_runs_names_the_runs_below_it(tmp_path, capsys, runs):
    """A trainer=parallel run (or a sweep dir) has no checkpoint of its own: the one line points one level down,
    in rltrain-export, rltrain.load_policy and rltrain-eval alike (whichever checkpoint --checkpoint asks for)."""
    from rltrain.cli.evaluate import main as evaluate
    from rltrain.cli.export import export
    from rltrain.errors import ConfigError

    top = tmp_path / "run"
    for name in runs:
        (top / name / "checkpoints").mkdir(parents=True)
    named = ", ".join(runs[:3]) + (", ..." if len(runs) > 3 else "")
    hint = f"no checkpoint found in that directory (its runs {named} have theirs: pass one, e.g. {top / runs[0]})"
    with pytest.raises(ConfigError) as err:
        export(top, out=tmp_path / "policy.pt2")
    assert str(err.value) == f"checkpoint={top}: {hint}"
    assert not (tmp_path / "policy.pt2").exists()
    with pytest.raises(ConfigError) as err:
        rltrain.load_policy(top)
    assert str(err.value).endswith(hint)
    for which in ("final", "best", "latest"):
        assert evaluate([str(top), "--checkpoint", which]) == 2
        assert capsys.readouterr().err == f"rltrain-eval: error: {top}: {hint}\n", which


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_description_lists_each_format_of_one_checkpoint_and_refuses_another(trained, tmp_path, capsys):
    """Formats of the same checkpoint (its path and content) exported beside each other share one description
    that lists them all; one of another checkpoint, of the same path since rewritten, or a .json no export wrote
    is refused in one line that writes nothing, and --force writes a fresh description."""
    from rltrain.cli.export import main

    run_dir = trained("ppo_discrete")
    final, best = run_dir / "checkpoints" / "final.pt", run_dir / "checkpoints" / "best.pt"
    out = tmp_path / "cartpole"
    sidecar = out.with_suffix(".json")
    assert main([str(run_dir), "--out", f"{out}.pt2"]) == 0
    assert main([str(final), "--format", "torchscript", "--out", f"{out}.pt"]) == 0
    record = json.loads(sidecar.read_text())
    assert record["files"] == {"export": "cartpole.pt2", "torchscript": "cartpole.pt"}
    assert record["checkpoint"] == str(final.resolve()) and record["checkpoint_sha256"] == _sha256(final)
    capsys.readouterr()

    def refused(args: list[str], why: str) -> None:
        flag = args[args.index("--out") + 1]
        sidecar = Path(flag).with_suffix(".json")
        before = sidecar.read_bytes()
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err == (f"rltrain-export: error: --out={flag}: {sidecar} {why}; pass --force to write a fresh "
                       "description, or another --out\n"), err
        assert sidecar.read_bytes() == before and not Path(flag).exists()

    onnx = ["--format", "onnx", "--out", f"{out}.onnx"] if "onnx" in _formats() else ["--out", f"{out}.file"]
    refused([str(best), *onnx], f"describes an export of another checkpoint ({final.resolve()})")
    copy = tmp_path / "copy.pt"  # the same path, rewritten since (a resumed run's final.pt)
    copy.write_bytes(final.read_bytes())
    assert main([str(copy), "--out", str(tmp_path / "copied.pt2")]) == 0
    capsys.readouterr()
    state = torch.load(copy, weights_only=True)
    state["counters"]["env_steps"] += 1
    torch.save(state, copy)
    refused([str(copy), "--format", "torchscript", "--out", str(tmp_path / "copied.pt")],
            f"describes an export of {copy.resolve()} before it was rewritten (another checkpoint_sha256)")
    (tmp_path / "mine.json").write_text('{"a": "config of the user\'s own"}')
    refused([str(final), "--out", str(tmp_path / "mine.pt2")], "is not the description of an export")
    older = {"files": {"export": "cartpole.pt2"}, "checkpoint": str(final.resolve())}  # before checkpoint_sha256
    (tmp_path / "older.json").write_text(json.dumps(older))
    refused([str(final), "--out", str(tmp_path / "older.pt")],
            f"describes an export of {final.resolve()} that records no checkpoint_sha256 to match")

    assert main([str(best), "--format", "torchscript", "--out", f"{out}.pt", "--force"]) == 0
    record = json.loads(sidecar.read_text())  # a fresh description: the .pt2 of final.pt is no longer credited
    assert record["files"] == {"torchscript": "cartpole.pt"} and record["checkpoint"] == str(best.resolve())
    assert record["checkpoint_sha256"] == _sha256(best)
