"""The Python API (rltrain/api.py): ``rltrain.train`` runs what ``rltrain`` runs, ``rltrain.load_policy`` acts on
one observation or a batch (Dict and recurrent included) like ``rltrain-eval``'s policy; the documented example runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import compose_cfg, run_cli

REPO = Path(__file__).resolve().parents[1]
TINY = ["total_env_steps=512", "env.num_envs=2", "eval.every_env_steps=0", "eval.episodes=2", "logger=quiet",
        "logger.progress=off"]
# minibatches of 16 rows: PPO's default 32 would split each 32-row batch into single rows (5,120 gradient steps)
DICT = ["algo=ppo", "algo.rollout_len=16", "algo.num_minibatches=2", "model.hidden_sizes=[16]", "model.cnn_features=16",
        "env.id=tests.helpers.obs_envs:DictEnv", "+env.kwargs.image_shape=[10,10,3]", "+env.kwargs.nested=true"]
RECURRENT = ["algo=ppo", "env=cartpole_novel", "model.core=lstm", "model.core_size=16", "algo.rollout_len=16"]


def test_import_rltrain_is_cheap_and_exports_the_api():
    code = ("import sys, rltrain; "
            "heavy = [m for m in ('torch', 'hydra', 'omegaconf', 'gymnasium') if m in sys.modules]; "
            "assert not heavy, heavy; assert callable(rltrain.train) and callable(rltrain.load_policy); "
            "assert callable(rltrain.evaluate); "
            "assert 'torch' in sys.modules")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr


def test_train_runs_what_the_cli_runs_and_returns_the_policy(tmp_path, monkeypatch):
    """Same overrides, same seed: the API's run and the CLI's run write the same config and the same final
    evaluation; the returned policy acts like the checkpoint's network on one observation and on a batch."""
    import rltrain

    monkeypatch.chdir(tmp_path)  # both launched from the same directory (recorded as env.search_path)

    overrides = ["algo=ppo", "seed=3", *TINY]
    result = rltrain.train([*overrides, f"hydra.run.dir={tmp_path / 'api'}"])
    cli = run_cli([*overrides, f"hydra.run.dir={tmp_path / 'cli'}"], cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert result.run_dir == tmp_path / "api"
    assert result.summary == json.loads((tmp_path / "api" / "summary.json").read_text())
    cli_summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert result.summary["final_eval_return"] == cli_summary["final_eval_return"]
    assert (tmp_path / "api" / "config.yaml").read_text() == (tmp_path / "cli" / "config.yaml").read_text()

    policy = result.policy
    assert policy is not None and policy.checkpoint == tmp_path / "api" / "checkpoints" / "final.pt"
    assert not any(isinstance(v, torch.optim.Optimizer) for v in vars(policy).values())
    obs = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    batch, state = policy.act(obs)
    assert state is None and batch.shape == (16,) and batch.dtype == np.int64
    assert [int(policy.act(o)[0]) for o in obs] == batch.tolist()  # one observation: no batch axis in or out
    with torch.no_grad():
        want = policy.module.act(torch.as_tensor(obs), deterministic=True).action.numpy()
    assert np.array_equal(batch, want)


def test_train_takes_a_composed_dictconfig(tmp_path):
    import rltrain

    result = rltrain.train(compose_cfg(["algo=ppo", *TINY]), run_dir=tmp_path / "run")
    assert result.summary["status"] == "completed" and (tmp_path / "run" / "summary.json").exists()


def test_the_callers_torch_and_numpy_threads_are_left_as_they_were(tmp_path, monkeypatch):
    """A run sets its process's torch threads (``torch_threads``, default 1) and numpy's OpenBLAS to one: through
    the API that process is the caller's (a notebook's kernel), whose own torch / numpy work then ran on one core
    after ``train``, ``load_policy`` or ``evaluate``. Each puts back what the caller had."""
    import rltrain
    from rltrain.models.numpy_mlp import blas_threads, set_blas_threads

    threads, blas = torch.get_num_threads(), blas_threads()
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    try:
        torch.set_num_threads(2)
        set_blas_threads(2)
        result = rltrain.train(["algo=ppo", *TINY], run_dir=tmp_path / "run")  # PPO's numpy update: OpenBLAS too
        rltrain.load_policy(result.run_dir)
        rltrain.evaluate(result.run_dir, episodes=1)
        assert torch.get_num_threads() == 2 and "OPENBLAS_NUM_THREADS" not in os.environ
        assert blas is None or blas_threads() == 2
    finally:
        torch.set_num_threads(threads)
        if blas is not None:
            set_blas_threads(blas)


def test_bad_input_raises_the_clis_one_line(tmp_path):
    import rltrain
    from rltrain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^unknown option algo=nope \(valid: .*ppo"):
        rltrain.train(["algo=nope", f"hydra.run.dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^total_env_steps=-5 must be a positive integer$"):
        rltrain.train(["total_env_steps=-5", f"hydra.run.dir={tmp_path}"])
    with pytest.raises(ConfigError, match="no such file|not a checkpoint|cannot"):
        rltrain.load_policy(tmp_path / "missing.pt")


BOX = {"ppo": ["algo=ppo", "algo.init_log_std=1.0"],
       # deterministic actors: stochastic acting gives mu(s) too (the exploration noise is the collector's)
       "td3": ["algo=td3", "experiment=none", "algo.learning_starts=256", "model.hidden_sizes=[16,16]"]}


@pytest.mark.parametrize("algo", list(BOX))
def test_box_actions_are_clipped_like_eval(tmp_path, algo):
    import rltrain

    result = rltrain.train([*BOX[algo], "env=pendulum", *TINY, f"hydra.run.dir={tmp_path}"])
    policy = rltrain.load_policy(tmp_path)
    obs = np.random.default_rng(1).standard_normal((32, 3)).astype(np.float32) * 5
    actions, _ = policy.act(obs, deterministic=False)
    if algo == "td3":
        assert np.array_equal(actions, policy.act(obs, deterministic=True)[0])
    assert actions.shape == (32, 1) and actions.dtype == np.float32
    assert actions.min() >= -2.0 and actions.max() <= 2.0
    one, _ = policy.act(obs[0])
    assert one.shape == (1,)
    assert result.summary["status"] == "completed"


def test_dict_and_recurrent_policies_act_on_one_observation_or_a_batch(tmp_path):
    """A nested Dict observation (image + vector keys), one or a batch; an LSTM policy carries its state:
    stepping one env at a time gives the batch's actions, and the state changes them."""
    import rltrain

    rltrain.train([*DICT, *TINY, f"hydra.run.dir={tmp_path / 'dict'}"])
    policy = rltrain.load_policy(tmp_path / "dict")  # from the recorded spaces: the env's module is not needed
    from tests.helpers.obs_envs import DictEnv

    env = DictEnv(image_shape=(10, 10, 3), nested=True)
    obs = [env.reset(seed=s)[0] for s in range(6)]
    stacked = {k: (np.stack([o[k] for o in obs]) if not isinstance(v, dict) else
                   {kk: np.stack([o[k][kk] for o in obs]) for kk in v}) for k, v in obs[0].items()}
    batch, _ = policy.act(stacked)
    assert batch.shape == (6,) and [int(policy.act(o)[0]) for o in obs] == batch.tolist()

    rltrain.train([*RECURRENT, *TINY, f"hydra.run.dir={tmp_path / 'lstm'}"])
    policy = rltrain.load_policy(tmp_path / "lstm")
    assert policy.recurrent
    seq = (np.random.default_rng(0).standard_normal((20, 3, 4)) * [1.0, 0.0, 0.2, 0.0]).astype(np.float32)
    state, batched = None, []
    singles = [[] for _ in range(3)]
    single_states = [None] * 3
    for t in range(len(seq)):
        action, state = policy.act(seq[t], state)
        batched.append(action)
        for i in range(3):
            a, single_states[i] = policy.act(seq[t, i], single_states[i])
            singles[i].append(int(a))
    assert np.array_equal(np.stack(batched).T, np.array(singles))
    stateless = np.stack([policy.act(seq[t])[0] for t in range(len(seq))])
    assert not np.array_equal(np.stack(batched), stateless)  # the state matters, so it was carried


def test_a_tuple_observation_is_read_as_training_read_it(tmp_path):
    """Blackjack-v1's Tuple observation, as the env returns it (one, or a vector env's tuple of batched arrays),
    acts as the Dict the policy was trained on (TupleAsDict's keys "0", "1", "2")."""
    import gymnasium as gym

    import rltrain

    rltrain.train(["env.id=Blackjack-v1", "algo.rollout_len=64", *TINY, f"hydra.run.dir={tmp_path}"])
    policy = rltrain.load_policy(tmp_path)
    env = gym.make("Blackjack-v1")
    obs = [env.reset(seed=s)[0] for s in range(8)]
    as_dicts = [{str(i): x for i, x in enumerate(o)} for o in obs]
    assert [int(policy.act(o)[0]) for o in obs] == [int(policy.act(d)[0]) for d in as_dicts]
    batch = tuple(np.array(column) for column in zip(*obs, strict=True))
    actions, _ = policy.act(batch)
    assert actions.tolist() == [int(policy.act(o)[0]) for o in obs]
    with pytest.raises(ValueError, match="a tuple of 2 elements where the space has 3"):
        policy.act(obs[0][:2])


def test_a_nested_tuple_observation_is_converted_at_every_depth():
    """Tuple(Dict, Tuple): the env's own observation (tuples, a dict inside, at any depth) acts like the Dict
    that TupleAsDict hands the policy in training: the same conversion, on the policy's template."""
    import gymnasium as gym
    from gymnasium import spaces

    from rltrain.api import LoadedPolicy
    from rltrain.envs.make import env_spec
    from rltrain.envs.spaces import TupleAsDict
    from rltrain.models.factory import ModelSettings, build

    space = spaces.Tuple((spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "flag": spaces.Discrete(2)}),
                          spaces.Tuple((spaces.MultiBinary(3), spaces.Discrete(4)))))

    class Env(gym.Env):
        observation_space, action_space = space, gym.spaces.Discrete(5)

    wrapped = TupleAsDict(Env())
    spec = env_spec(wrapped, "nested")
    torch.manual_seed(0)
    module = build(spec, ModelSettings(), "actor_critic")

    def policy() -> LoadedPolicy:  # a fresh sampling generator each: same draws for the same distributions
        return LoadedPolicy(module, spec=spec, config={}, checkpoint=Path("nested.pt"))

    space.seed(0)
    raw = [space.sample() for _ in range(16)]
    trained_on = [wrapped.observation(o) for o in raw]  # what the policy saw in training
    assert set(trained_on[0]) == {"0", "1"} and set(trained_on[0]["1"]) == {"0", "1"}
    for deterministic in (True, False):
        mine, theirs = policy(), policy()
        assert [int(mine.act(o, deterministic=deterministic)[0]) for o in raw] == \
            [int(theirs.act(d, deterministic=deterministic)[0]) for d in trained_on]
    as_lists = [[o[0], list(o[1])] for o in raw]  # lists read as tuples, at every depth
    assert [int(policy().act(o)[0]) for o in as_lists] == [int(policy().act(d)[0]) for d in trained_on]
    batch = ({"pos": np.stack([o[0]["pos"] for o in raw]), "flag": np.array([o[0]["flag"] for o in raw])},
             (np.stack([o[1][0] for o in raw]), np.array([o[1][1] for o in raw])))
    assert policy().act(batch)[0].tolist() == [int(policy().act(o)[0]) for o in raw]
    with pytest.raises(ValueError, match="no key 'flag'"):
        policy().act(({"pos": raw[0][0]["pos"]}, raw[0][1]))


def test_the_documented_python_api_example_runs(tmp_path):
    """The block as the page shows it (tests/test_docs.py only parses it: this test runs it and checks its run)."""
    page = (REPO / "docs" / "guide" / "checkpoints.md").read_text()
    section = page.split("## Python API", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "runs" / "api" / "checkpoints" / "final.pt").exists()
    assert "completed" in res.stdout


def test_evaluate_runs_in_this_process_on_an_env_registered_here(tmp_path, monkeypatch):
    """An env id a notebook registers is known in its process only: ``rltrain.evaluate`` finds it and repeats
    the run's own final evaluation exactly (same seeds, same mode); ``rltrain-eval``, a new process, names
    ``rltrain.evaluate`` in its one line."""
    import gymnasium as gym

    import rltrain

    monkeypatch.chdir(tmp_path)
    env_id = "NotebookPole-v0"
    gym.register(env_id, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=200)
    try:
        result = rltrain.train(["algo=ppo", f"env.id={env_id}", "algo.rollout_len=64", *TINY],
                               run_dir=tmp_path / "nb")
        assert result.summary["status"] == "completed"
        ev = rltrain.evaluate(result.run_dir, episodes=2)  # TINY's eval.episodes, from the run's eval seed
        assert ev.returns.shape == (2,) and ev.agents is None and ev.success_rate is None and ev.deterministic
        assert ev.checkpoint == tmp_path / "nb" / "checkpoints" / "final.pt"
        assert ev.mean == pytest.approx(result.summary["final_eval_return"])
        assert ev.std == pytest.approx(result.summary["final_eval_return_std"])
        other = rltrain.evaluate(result.run_dir, episodes=1, seed=ev.seed + 1)  # episode j from seed + j
        assert other.seed == ev.seed + 1 and other.returns.tolist() == ev.returns[1:].tolist()
    finally:
        gym.registry.pop(env_id, None)
    res = subprocess.run([sys.executable, "-m", "rltrain.cli.evaluate", str(tmp_path / "nb")], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 2 and f"unknown Gymnasium env {env_id!r}" in res.stderr, res.stderr
    assert "evaluate there with rltrain.evaluate(path)" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    with pytest.raises(rltrain.errors.ConfigError, match="unknown Gymnasium env"):
        rltrain.evaluate(tmp_path / "nb", episodes=1)  # unregistered now: the same one line, raised


def test_an_observation_of_another_shape_is_one_line_naming_the_space(tmp_path):
    """A (3, 2) Box: a (2, 3) array is not read as one observation with its values misplaced, and (6,) or (4, 6)
    are not torch's matrix-product error; each is a ValueError naming the shapes the space takes, as SB3 says it.
    The (2, 2) Box action comes back in the env's shape: (2, 2), or [N, 2, 2] for a batch."""
    import rltrain

    policy = rltrain.train(["algo=ppo", "env.id=tests.helpers.shaped_envs:MatrixEnv", "total_env_steps=64",
                            "env.num_envs=2", "algo.rollout_len=32", "eval.every_env_steps=0", "eval.episodes=1",
                            "logger=quiet", "logger.progress=off"], run_dir=tmp_path).policy
    assert policy.act(np.zeros((3, 2)))[0].shape == (2, 2) and policy.act(np.zeros((4, 3, 2)))[0].shape == (4, 2, 2)
    for shape in [(2, 3), (6,), (4, 6), (4, 2, 3)]:
        with pytest.raises(ValueError, match=rf"^Unexpected observation shape {re.escape(str(shape))} for "
                                             r"Box\(-1\.0, 1\.0, \(3, 2\), float32\), please use \(3, 2\) or "
                                             r"\(n_env, 3, 2\)$"):
            policy.act(np.zeros(shape))


def test_a_dict_tuple_or_index_observation_that_does_not_fit_names_the_key_and_the_space():
    """Every key of a Dict (nested, a Tuple inside) is checked against its own space: its shape, one observation
    or a batch as the first key is, and an index inside its Discrete / MultiDiscrete / MultiBinary space, where
    torch would fail on a matrix product or a one-hot class, or read it wrongly."""
    import gymnasium as gym
    from gymnasium import spaces

    from rltrain.api import LoadedPolicy
    from rltrain.envs.make import env_spec
    from rltrain.envs.spaces import TupleAsDict
    from rltrain.models.factory import ModelSettings, build

    def loaded(space: gym.Space) -> LoadedPolicy:
        class Env(gym.Env):
            observation_space, action_space = space, spaces.Discrete(3)

        spec = env_spec(TupleAsDict(Env()) if isinstance(space, (spaces.Dict, spaces.Tuple)) else Env(), "t")
        return LoadedPolicy(build(spec, ModelSettings(), "actor_critic"), spec=spec, config={}, checkpoint=Path("t"))

    policy = loaded(spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "inner": spaces.Dict({
        "d": spaces.Discrete(3, start=5), "md": spaces.MultiDiscrete([2, 5, 3]), "bits": spaces.MultiBinary(2)}),
        "tup": spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (1,), np.float32)))}))
    good = {"pos": np.zeros(2, np.float32), "inner": {"d": 7, "md": np.array([1, 4, 2]), "bits": np.array([0, 1])},
            "tup": (1, np.array([0.5], np.float32))}
    assert policy.act(good)[0].shape == ()
    cases = [
        ({"pos": np.zeros(3)}, r"Unexpected observation\['pos'\] shape \(3,\) for Box\(-1\.0, 1\.0, \(2,\), float32\), "
                               r"please use \(2,\) or \(n_env, 2\)"),
        ({"pos": np.zeros((4, 2))}, r"observation\['pos'\] shape \(4, 2\).* \(as observation\['inner'\]\['bits'\] is "
                                    r"one observation, \(2,\)\)"),
        ({"inner": {**good["inner"], "d": 8}}, r"observation\['inner'\]\['d'\] value 8 is outside Discrete\(3, "
                                               r"start=5\) \(values 5 to 7\)"),
        ({"inner": {**good["inner"], "md": np.array([1, 5, 2])}}, r"observation\['inner'\]\['md'\] value 5 is "
                                                                  r"outside MultiDiscrete"),
        ({"inner": {**good["inner"], "bits": np.array([0, 2])}}, r"observation\['inner'\]\['bits'\] value 2 is "
                                                                 r"outside MultiBinary\(2\) \(values 0 to 1\)"),
        ({"tup": (1, np.zeros(2, np.float32))}, r"Unexpected observation\['tup'\]\[1\] shape \(2,\)"),
        ({"tup": (2, np.zeros(1, np.float32))}, r"observation\['tup'\]\[0\] value 2 is outside Discrete\(2\)"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            policy.act({**good, **change})
    with pytest.raises(ValueError, match="no key 'pos'"):  # the message for a missing key stays
        policy.act({k: v for k, v in good.items() if k != "pos"})

    index = loaded(spaces.Discrete(4, start=-2))
    assert index.act(1)[0].shape == () and index.act(np.array([-2, 1]))[0].shape == (2,)
    for bad in (5, np.array([0, -3])):
        with pytest.raises(ValueError, match=r"value (5|-3) is outside Discrete\(4, start=-2\) \(values -2 to 1\)"):
            index.act(bad)


def test_make_env_builds_the_env_the_policy_was_trained_on(tmp_path, monkeypatch):
    """A run with env.kwargs and env.wrappers (a 3-frame stack, a 40-step limit): ``make_env`` builds that env, so
    a notebook's loop steps it with ``act`` and gets the run's observations ([3, 4]) and episode length; an env
    named by module is built only with the opt-in, as ``rltrain.evaluate`` steps it."""
    import rltrain

    monkeypatch.chdir(tmp_path)
    result = rltrain.train(["algo=ppo", "env=cartpole", "algo.rollout_len=64", "env.max_episode_steps=40",
                            "env.wrappers=[{FrameStackObservation: {stack_size: 3}}]", *TINY], run_dir=tmp_path / "fs")
    policy = rltrain.load_policy(result.run_dir)
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 4) == policy.spec.observation.shape
    steps, done = 0, False
    while not done:
        obs, _, term, trunc, _ = env.step(int(policy.act(obs)[0]))
        steps, done = steps + 1, term or trunc
    assert steps <= 40 and (steps == 40) == trunc  # the run's time limit
    env.close()
    from rltrain.cli.export import export  # the exported file's description names the same build

    record = json.loads(export(result.run_dir, fmt="onnx", out=tmp_path / "p.onnx").with_suffix(".json").read_text())
    assert record["env"]["wrappers"] == [{"FrameStackObservation": {"stack_size": 3}}]
    assert record["env"]["max_episode_steps"] == 40
    shown = policy.make_env(render_mode="rgb_array")
    shown.reset(seed=0)
    assert shown.render().ndim == 3
    shown.close()
    moduled = rltrain.train(["algo=ppo", "env.id=tests.helpers.obs_envs:DictEnv", "algo.rollout_len=16",
                             "algo.num_minibatches=2", *TINY], run_dir=tmp_path / "mod")
    with pytest.raises(rltrain.errors.ConfigError, match="allow_import=True"):
        rltrain.load_policy(moduled.run_dir).make_env()
    assert rltrain.load_policy(moduled.run_dir).make_env(allow_import=True).reset(seed=0)[0] is not None


SCRIPT = """
import rltrain
{indent_open}result = rltrain.train(["algo=impala", "trainer=subprocess_actors", "trainer.num_actors=1", "debug=smoke",
{indent}                        "total_env_steps=1024", "logger=quiet", "hydra.run.dir=runs/actors"])
{indent}print("STATUS", result.summary["status"])
"""


@pytest.mark.parametrize("guarded", [False, True], ids=["top_level", "guarded"])
def test_a_script_s_unguarded_train_call_is_named_in_the_workers_it_would_rerun(tmp_path, guarded):
    """A script calling rltrain.train at its top level, with a trainer whose workers Python starts by importing
    the script again (spawn / forkserver): each worker refuses to start a second run in one line naming the
    ``if __name__ == "__main__":`` guard, and the run ends failed, where each worker used to start the run again
    (a locked run dir, a traceback per restart, nothing naming the cause). Guarded, the same script trains."""
    head = 'if __name__ == "__main__":\n    ' if guarded else ""
    (tmp_path / "train_script.py").write_text(SCRIPT.format(indent_open=head, indent="    " if guarded else ""))
    res = subprocess.run([sys.executable, "train_script.py"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    guard = 'put the call under `if __name__ == "__main__":`'
    if guarded:
        assert res.returncode == 0 and "STATUS completed" in res.stdout, res.stderr[-3000:]
        assert guard not in res.stderr
    else:
        assert guard in res.stderr, res.stderr[-3000:]
        assert "STATUS failed" in res.stdout, res.stdout[-2000:]
