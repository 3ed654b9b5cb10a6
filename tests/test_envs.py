"""Env ids as researchers write them, the ``env.wrappers`` list, real game scores, Atari/MinAtar presets."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from omegaconf import OmegaConf

from rltrain.envs import plugins as envplugins
from rltrain.envs.make import make_env, make_vector_env
from rltrain.envs.wrappers import FireReset
from rltrain.errors import ConfigError
from tests.conftest import CONF_DIR, REPO, compose_cfg
from tests.helpers import lives_env

HELPER = "tests.helpers.lives_env"


def _chain(env: gym.Env) -> list[str]:
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names[::-1]  # innermost first


def _wrapper_chain(env: gym.Env) -> list[gym.Env]:
    chain = []
    while isinstance(env, gym.Wrapper):
        chain.append(env)
        env = env.env
    return chain


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


# -- env.id forms --------------------------------------------------------------------------------------------
def test_module_env_id_imports_the_module_that_registers_it(monkeypatch):
    monkeypatch.delitem(gym.registry, lives_env.ENV_ID)
    monkeypatch.delitem(sys.modules, HELPER)  # restored afterwards: other tests keep this module's classes
    env = make_env(f"{HELPER}:{lives_env.ENV_ID}", {"lives": 2})
    assert lives_env.ENV_ID in gym.registry
    assert env.unwrapped.n_lives == 2 and env.spec.id == lives_env.ENV_ID


def test_factory_path_and_its_errors():
    env = make_env(f"{HELPER}:make_lives_env", {"lives": 4}, max_episode_steps=5)
    assert env.unwrapped.n_lives == 4 and isinstance(env, gym.wrappers.TimeLimit)
    with pytest.raises(ConfigError) as err:
        make_env(f"{HELPER}:RltrainTest/Livez-v0")
    assert "registers no env 'RltrainTest/Livez-v0'" in _one_line(err) and lives_env.ENV_ID in str(err.value)
    with pytest.raises(ConfigError) as err:
        make_env(f"{HELPER}:make_lives_env", {"colour": 1})
    assert "env.kwargs" in _one_line(err) and "colour" in str(err.value)


def test_known_namespaces_register_in_a_fresh_process():
    code = ("import gymnasium as gym; from rltrain.envs.make import make_env\n"
            "assert 'ALE/Pong-v5' not in gym.registry\n"
            "a = make_env('ALE/Pong-v5'); m = make_env('MinAtar/Breakout-v1')\n"
            "p = make_env('ale_py:ALE/Pong-v5')\n"
            "print(a.observation_space.shape, a.observation_space.dtype, m.observation_space.shape,"
            " m.observation_space.dtype, p.spec.id)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "(210, 160, 3) uint8 (10, 10, 4) bool ALE/Pong-v5" in res.stdout
    # the un-namespaced ids SB3 and CleanRL use are ale-py's too: registered when first asked for
    code = ("import gymnasium as gym; from rltrain.envs.make import make_env\n"
            "assert 'PongNoFrameskip-v4' not in gym.registry\n"
            "e = make_env('PongNoFrameskip-v4'); print(e.spec.id, e.unwrapped._frameskip)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "PongNoFrameskip-v4 1" in res.stdout, res.stderr


def test_minatar_steps_without_importing_its_screen_drawing_libraries():
    """MinAtar's environment module imports pyplot and seaborn (and so scipy.stats) at its top to draw screens:
    1.2 s of every MinAtar process's start. They are imported on first use only; anyone's own ``import seaborn``
    afterwards gets the real module, and MinAtar's drawing code still reaches it."""
    pytest.importorskip("minatar")
    pytest.importorskip("seaborn")
    code = ("import sys; from rltrain.envs.make import make_env\n"
            "m = make_env('MinAtar/Breakout-v1'); m.reset(seed=0); m.step(0)\n"
            "print(sorted(n for n in ('seaborn', 'scipy.stats', 'matplotlib.pyplot') if n in sys.modules))\n"
            "import seaborn, minatar.environment as drawn\n"
            "print(type(seaborn).__name__, callable(seaborn.color_palette), callable(drawn.sns.color_palette))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["[]", "module True True"], res.stdout + res.stderr
    assert "Cannot import" not in res.stderr, res.stderr  # MinAtar's own warning when its imports fail


def test_missing_namespace_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(envplugins.NAMESPACES, "Nope", ("rltrain_absent_pkg.gym", "nope"))
    with pytest.raises(ConfigError) as err:
        make_env("Nope/Game-v0")
    assert "pip install 'rltrain[nope]'" in _one_line(err)
    with pytest.raises(ConfigError) as err:
        make_env("CartPol-v1")
    assert "'CartPole-v1'" in _one_line(err)


def test_dependency_not_installed_from_a_factory_names_the_extra():
    with pytest.raises(ConfigError) as err:
        make_env(f"{HELPER}:needs_mujoco")
    assert "pip install 'rltrain[mujoco]'" in _one_line(err)


# -- env.wrappers --------------------------------------------------------------------------------------------
def test_wrappers_apply_in_order_by_gymnasium_name_our_name_and_import_path():
    env = make_env("CartPole-v1", wrappers=[{"ClipReward": {"min_reward": -0.5, "max_reward": 0.5}},
                                            f"{HELPER}:RewardLog",
                                            {"FrameStackObservation": {"stack_size": 3}}, "SignReward"])
    chain = _chain(env)
    start = chain.index("ScoreRecorder")
    assert chain[start:] == ["ScoreRecorder", "ClipReward", "RewardLog", "FrameStackObservation",
                             "SignReward", "ScoreReport"]
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 4)
    _, reward, *_ = env.step(0)
    assert reward == 1.0  # CartPole's 1 clipped to 0.5 then signed


@pytest.mark.parametrize("override", [
    f"env.wrappers=[{{{HELPER}.RewardLog: {{label: tagged}}}}]",  # the dotted import path, as Hydra's _target_
    f"env.wrappers=[{{{HELPER}\\:RewardLog: {{label: tagged}}}}]",  # the colon form, escaped
], ids=["dotted", "escaped-colon"])
def test_a_wrapper_named_by_import_path_takes_keyword_arguments_on_the_command_line(override):
    """Hydra's override grammar reads a bare ':' inside {key: value} as the separator: a wrapper named by its
    import path gets keyword arguments from the command line in the dotted form or with the colon escaped."""
    wrappers = OmegaConf.to_container(compose_cfg(["experiment=none", override]).env.wrappers)
    env = make_env("CartPole-v1", wrappers=wrappers)
    log = next(e for e in _wrapper_chain(env) if type(e).__name__ == "RewardLog")
    assert log.label == "tagged"
    env.reset(seed=0)
    env.step(0)
    assert log.rewards == [1.0]


@pytest.mark.parametrize("entry, expect", [
    ("FrameStack", "unknown wrapper 'FrameStack'; did you mean 'FrameStackObservation'"),
    ("EpisodicLives", "did you mean 'EpisodicLife'"),
    ({"FrameStackObservation": {"stacksize": 4}}, "FrameStackObservation rejected its arguments"),
    ({"ClipReward": {"min_reward": 2, "max_reward": 1}}, "ClipReward("),
    (f"{HELPER}:NoSuchWrapper", "cannot import"),
    (f"{HELPER}.NoSuchWrapper", "cannot import"),
    ({"A": {}, "B": {}}, "is not a name or {name: {kwargs}}"),
    ("EpisodicLife", "EpisodicLife needs an ALE (Atari) env"),
])
def test_wrapper_errors_are_one_line(entry, expect):
    with pytest.raises(ConfigError) as err:
        make_env("CartPole-v1", wrappers=[entry])
    assert expect in _one_line(err)


def test_fire_reset_presses_fire_only_where_the_game_has_it():
    env = FireReset(lives_env.LivesEnv())
    env.reset(seed=0)
    env.step(1)  # a FIRE by the agent after FireReset's own does not count as the one right after reset
    assert env.unwrapped.fires == 1
    plain = FireReset(lives_env.LivesEnv(with_fire=False))
    plain.reset(seed=0)
    assert plain.fire is None and plain.unwrapped._t == 0


# -- the real game score -------------------------------------------------------------------------------------
def test_real_score_under_episodic_life_and_clipping_equals_raw_game_sum():
    env = make_env(f"{HELPER}:make_lives_env", {"lives": 3, "life_steps": 7},
                   wrappers=["EpisodicLife", "FireReset", "SignReward"])
    assert _chain(env) == ["ScoreRecorder", "EpisodicLife", "FireReset", "SignReward", "ScoreReport"]
    env.reset(seed=1)
    rng = np.random.default_rng(0)
    scores, lengths, learning_ends, seen = [], [], 0, set()
    for _ in range(12 * 16):  # 12 games of 16 agent steps (see below)
        _, reward, term, trunc, info = env.step(int(rng.integers(3)))
        seen.add(reward)
        if "real_score" in info:
            scores.append(info["real_score"])
            lengths.append(info["real_length"])
        if term or trunc:
            learning_ends += 1
            env.reset()
    raw_games = env.unwrapped.games
    assert len(scores) == len(raw_games) - 1 == 12  # every finished game reported once; the 13th just began
    assert scores == [sum(g) for g in raw_games[:-1]]
    assert scores != [float(np.sign(g).sum()) for g in raw_games[:-1]]  # the clipped sum is not the score
    assert seen <= {-1.0, 0.0, 1.0}
    assert learning_ends == 3 * len(scores)  # one learning episode per life
    # a game is 21 env steps; per life FireReset presses once and, after a life loss, EpisodicLife steps a
    # no-op: 1 + 2 + 2 of them are not agent steps, so a game is 16 agent steps
    assert lengths == [16] * len(scores)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_vector_envs_hand_real_scores_to_the_collector(vectorization):
    venv = make_vector_env(f"{HELPER}:make_lives_env", 2, [3, 4], kwargs={"lives": 2, "life_steps": 5},
                           wrappers=["EpisodicLife", "SignReward"], vectorization=vectorization)
    try:
        obs = venv.reset()
        assert obs.dtype == np.uint8
        rewards, done = [], []
        for _ in range(33):
            obs, rew, term, trunc, final = venv.step(np.zeros(2, np.int64))
            rewards.append(rew)
            done.append(term | trunc)
            assert obs.dtype == final.dtype == np.uint8
        real = venv.pop_real_episodes()
        assert venv.pop_real_episodes() == []
        # a game: 5 agent steps, a life loss, EpisodicLife's no-op, 4 agent steps: it ends at steps 9, 18, 27
        assert [i for i, _, _ in real] == [0, 1, 0, 1, 0, 1]  # (step, env) order
        assert all(length == 9 for _, _, length in real)
        assert np.abs(np.array(rewards)).max() <= 1.0 and np.array(done).sum() == 2 * 7
    finally:
        venv.close()
    plain = make_vector_env("CartPole-v1", 1, [0], vectorization=vectorization)
    assert plain.pop_real_episodes() is None and plain.reset().dtype == np.float32
    plain.close()


def test_real_score_with_a_real_atari_game():
    pytest.importorskip("cv2")
    preset = OmegaConf.to_container(compose_cfg(["env=atari", "experiment=none"]).env)
    wrappers = [f"{HELPER}:RewardLog", *preset["wrappers"]]  # RewardLog innermost: sees the raw frame rewards
    env = make_env(preset["id"], preset["kwargs"], wrappers=wrappers)
    log = next(w for w in _walk(env) if isinstance(w, lives_env.RewardLog))
    obs, _ = env.reset(seed=5)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert env.unwrapped._frameskip == 1 and env.unwrapped.ale.getFloat("repeat_action_probability") == 0.25
    rng = np.random.default_rng(5)
    scores, lives_lost, clipped = [], 0, []
    for _ in range(400):
        obs, reward, term, trunc, info = env.step(int(rng.integers(4)))
        clipped.append(reward)
        if "real_score" in info:
            scores.append(info["real_score"])
        if term or trunc:
            lives_lost += 1
            if "real_score" in info:  # game over: the raw log restarts with the next game
                assert scores[-1] == sum(log.rewards) >= 0
                log.rewards.clear()
            env.reset()
    assert scores and lives_lost >= 5 * len(scores)  # Breakout: 5 lives per game
    assert set(clipped) <= {0.0, 1.0}
    with pytest.raises(ConfigError) as err:  # v5 skips 4 frames itself unless told not to
        make_env("ALE/Breakout-v5", wrappers=["AtariPreprocessing"])
    assert "set env.kwargs.frameskip=1" in _one_line(err)


def _walk(env):
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env


# -- presets and the CLI -------------------------------------------------------------------------------------
def test_minatar_preset_envs():
    preset = OmegaConf.to_container(compose_cfg(["env=minatar", "experiment=none"]).env)
    venv = make_vector_env(preset["id"], 2, [0, 1], kwargs=preset["kwargs"], wrappers=preset["wrappers"])
    obs = venv.reset()
    assert obs.shape == (2, 10, 10, 4) and obs.dtype == np.bool_
    obs, *_ = venv.step(np.array([0, 2]))
    assert obs.dtype == np.bool_
    venv.close()


def test_every_env_preset_has_a_wrappers_list():
    for path in sorted((CONF_DIR / "env").glob("*.yaml")):
        env = compose_cfg([f"env={path.stem}", "experiment=none"]).env
        assert OmegaConf.is_list(env.get("wrappers")), path.name


@pytest.mark.slow  # two interpreters importing torch and MinAtar, a short run and an evaluation
def test_cli_minatar_trains_with_a_wrapper_from_the_command_line(cli):
    res = cli("env=minatar", "total_env_steps=512", "algo.rollout_len=64", "env.num_envs=8", "eval.episodes=1",
              "logger.progress=plain", "env.wrappers=[SignReward]", env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[summary]" in res.stdout
    # DQN acts through torch (no numpy actor): bool observations reach the network as they come
    res = cli("env=minatar", "algo=dqn", "algo.learning_starts=128", "total_env_steps=512", "eval.episodes=1",
              "logger.progress=plain", env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]


def test_cli_unknown_wrapper_is_one_line(cli):
    bad = cli("total_env_steps=512", "env.wrappers=[{FrameStack: {stack_size: 2}}]")
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "did you mean 'FrameStackObservation'" in lines[0], bad.stderr


def test_a_closed_vector_env_holds_no_envs():
    """``close`` drops the envs it closed: whatever still holds the vector env (the loop's components reference
    one another, a cycle main() freezes at exit) keeps no simulator alive, which ale-py reports as leaked."""
    import gc
    import weakref

    venv = make_vector_env("CartPole-v1", 2, [0, 1])
    venv.reset()
    envs = [weakref.ref(env) for env in venv.envs]
    venv.close()
    venv.close()  # twice: nothing left to close
    gc.collect()  # a Gymnasium env may sit in a cycle of its own: it is the vector env's reference that matters
    assert venv.envs == [] and all(ref() is None for ref in envs)


def test_rltrains_own_error_in_the_probe_is_not_blamed_on_the_env(monkeypatch):
    """Only the env's reset is reported as the env's fault; a fault in rltrain's code after it is itself."""

    from rltrain.envs import make
    from rltrain.errors import UserCodeError

    def broken(*args, **kwargs):
        raise NameError("name 'discrete_start' is not defined")

    monkeypatch.setattr(make, "env_spec", broken)
    with pytest.raises(NameError, match="discrete_start"):
        make.probe_env(make.EnvFactory(id="CartPole-v1", num_envs=1))
    monkeypatch.undo()
    with pytest.raises(UserCodeError, match=r"^env.id=tests.helpers.bad_envs:RaisingReset: reset\(\) raised"):
        make.probe_env(make.EnvFactory(id="tests.helpers.bad_envs:RaisingReset", num_envs=1))
