"""Multi-agent training on PettingZoo envs: the adapter's turns, the collector's slots, the policy groups, IPPO /
MAPPO / self-play from the command line, and every one-line refusal.

Real envs from their packages (``mpe2``'s simple_spread, PettingZoo's classic connect four) and the small envs of
``tests/helpers/agent_envs.py`` (heterogeneous spaces, agents done at different times, turns with an elimination).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from rltrain.algos.ippo import IPPO, IPPOSettings
from rltrain.algos.mappo import MAPPO, MAPPOSettings, ValueNorm
from rltrain.data.agents import AGENT_ID_KEY, STATE_KEY, AgentsSpec
from rltrain.envs.make import EnvFactory, probe_env
from rltrain.envs.multiagent import AgentEnv
from rltrain.errors import ConfigError
from rltrain.trainers.matches import random_action
from rltrain.trainers.multiagent import MultiAgentCollector
from tests.conftest import REPO

torch.set_num_threads(1)
CPU = torch.device("cpu")
SPREAD = "mpe2.simple_spread_v3:parallel_env"
SPREAD_KW = ["+env.kwargs.N=3", "+env.kwargs.max_cycles=25", "+env.kwargs.continuous_actions=false"]
C4 = "pettingzoo.classic.connect_four_v3:env"
UNEVEN = "tests.helpers.agent_envs:uneven"
TURNS = "tests.helpers.agent_envs:turns"
HELPERS = {"PYTHONPATH": str(REPO)}  # tests.helpers.agent_envs, from the checkout
BASE = ["debug=smoke", "logger.progress=off", "env.num_envs=2", "eval.episodes=2"]
SMOKE = [*BASE, "algo.update_epochs=2"]


def _factory(env_id: str, **kwargs) -> EnvFactory:
    return probe_env(EnvFactory(id=env_id, num_envs=2, kwargs=kwargs), "auto").factory


def _collector(env_id: str, algo=IPPO, num_envs: int = 2, seeds=(3, 4), kwargs: dict | None = None, **settings):
    factory = probe_env(EnvFactory(id=env_id, num_envs=num_envs, kwargs=kwargs or {}), "auto").factory
    spec = factory.spec()
    cls = MAPPOSettings if algo is MAPPO else IPPOSettings
    torch.manual_seed(0)
    learner = algo(spec, cls(**settings), num_envs=num_envs, device=CPU)
    return learner, MultiAgentCollector(factory.vector(list(seeds)), learner.policy, spec, device=CPU)


# -- the env adapter ---------------------------------------------------------------------------------------
def test_pettingzoo_envs_are_detected_with_their_agents_spaces_and_state():
    spread = _factory(SPREAD, N=3, max_cycles=25, continuous_actions=False)
    spec = spread.spec()
    assert isinstance(spec, AgentsSpec) and spec.api == "parallel" and spec.agents == ("agent_0", "agent_1", "agent_2")
    assert spec.homogeneous and spec.state.shape == (54,) and spec.specs[0].describe() == "Discrete(5)"
    c4 = _factory(C4)
    spec = c4.spec()
    assert spec.api == "aec" and spec.state is None and spec.joined.shape == (2 * 6 * 7 * 2,)
    assert spec.specs[0].masked and c4.action_mask == "key"
    uneven = _factory(UNEVEN).spec()
    assert not uneven.homogeneous
    assert [s.action_kind for s in uneven.specs] == ["discrete", "box", "multi_discrete"]
    assert not EnvFactory(id="CartPole-v1").multiagent


def test_aec_turns_credit_each_agent_the_rewards_received_until_its_next_turn():
    """Three players; p1 is eliminated halfway (terminated, reward 0); the winner gets +1, the other -1, each
    in the transition that closed at its dead step; every move closes the previous move of the next player."""
    factory = _factory(TURNS, players=3)
    spec = factory.spec()
    env = AgentEnv(factory.make(), spec)
    env.reset(seed=0)
    rng, moves, closed = np.random.default_rng(0), [], []
    while not env.over:
        agent = env.acting[0]
        moves.append(agent)
        closed += env.step({agent: random_action(spec.spec_of(agent), env.obs[agent], rng)})
    assert moves[:3] == ["p0", "p1", "p2"]
    assert sorted(c.agent for c in closed) == sorted(moves)  # every move's transition closed exactly once
    finals = {c.agent: c for c in closed if c.terminated}
    assert set(finals) == {"p0", "p1", "p2"} and finals["p1"].reward == 0.0
    assert sorted([finals["p0"].reward, finals["p2"].reward]) == [-1.0, 1.0]
    assert env.returns == {a: finals[a].reward for a in spec.agents}


# -- the collector's slots ---------------------------------------------------------------------------------
def _check_columns(rollout, *, cut_ok=True):
    """Valid rows form a prefix of each column; inside an episode a row's next observation is the next row's
    observation; padding rows are terminal with reward 0."""
    valid = np.ones(rollout.rewards.shape, bool) if rollout.valid is None else rollout.valid
    obs = rollout.obs if isinstance(rollout.obs, np.ndarray) else next(iter(rollout.obs.values()))
    nxt = rollout.next_obs if isinstance(rollout.next_obs, np.ndarray) else next(iter(rollout.next_obs.values()))
    for s in range(valid.shape[1]):
        n = int(valid[:, s].sum())
        assert valid[:n, s].all() and not valid[n:, s].any()
        assert rollout.terminated[n:, s].all() and (rollout.rewards[n:, s] == 0).all()
        for t in range(n - 1):
            if not (rollout.terminated[t, s] or rollout.truncated[t, s]):
                np.testing.assert_array_equal(nxt[t, s], obs[t + 1, s])
        if 0 < n < valid.shape[0]:
            assert rollout.terminated[n - 1, s] or (cut_ok and rollout.truncated[n - 1, s])


def test_parallel_slots_hold_each_agents_own_transitions_and_pad_the_ones_done_early():
    """Uneven: scout done after 3 steps, pilot after 6, clerk truncated at 9, each with spaces of its own (one
    policy each). Every slot's rows are its agent's transitions; the ones done early are padded (invalid)."""
    learner, col = _collector(UNEVEN, rollout_len=8)
    assert [g.name for g in learner.groups] == ["scout", "pilot", "clerk"]
    first, second = col.collect(8), col.collect(8)
    for multi in (first, second):
        assert set(multi.groups) == {"scout", "pilot", "clerk"}
        for rollout in multi.groups.values():
            assert rollout.rewards.shape == (8, 2)
            _check_columns(rollout)
    scout, clerk = first.groups["scout"], first.groups["clerk"]
    assert scout.valid[:, 0].sum() == 3 and scout.terminated[2].all() and clerk.valid is None
    # scout's reward is 1 exactly when its action is step % 3 (its third observation holds (step % 3) / 2)
    steps = np.rint(scout.obs[:3, :, 2] * 2).astype(int)
    np.testing.assert_array_equal(scout.rewards[:3], (scout.actions[:3] == steps).astype(np.float32))
    assert first.env_steps == 16 and first.groups["pilot"].actions.shape == (8, 2, 2)
    assert first.groups["clerk"].actions.dtype == np.int64 and first.groups["clerk"].actions.shape == (8, 2, 2)
    # the second collection starts with the clerk's truncated step 9, then a new episode for all three
    assert second.groups["clerk"].truncated[0].all() and second.episode_returns and len(second.episode_returns) == 2
    # every action the envs received is one valid row: none is lost, none invented
    counts = {a: sum(1 for e in col.venv.envs for x, _ in e.env.log if x == a) for a in ("scout", "pilot", "clerk")}
    assert counts == {a: sum(_valid_rows(m.groups[a]) for m in (first, second)) for a in counts}


def _valid_rows(rollout) -> int:
    return rollout.rewards.size if rollout.valid is None else int(rollout.valid.sum())


def test_aec_rows_are_the_acting_agents_turns_and_an_open_move_is_carried():
    """Two players sharing one policy (with their one-hot index): a slot's consecutive rows are its own turns,
    so the counter moved by its own move plus the other player's (1 or 2); a move whose outcome is still due
    when the rollout ends starts the next rollout."""
    learner, col = _collector(TURNS, rollout_len=3, kwargs={"target": 9})
    (group,) = learner.groups
    assert group.name == "shared" and group.ids == 2
    previous = None
    for _ in range(6):
        multi = col.collect(3)
        rollout = multi.groups["shared"]
        _check_columns(rollout)
        count = rollout.obs["observation"].argmax(-1)
        ids = rollout.obs[AGENT_ID_KEY].argmax(-1)
        np.testing.assert_array_equal(ids, np.tile([0, 1, 0, 1], (3, 1)))  # slot 2n + j is agent j of env n
        valid = np.ones(count.shape, bool) if rollout.valid is None else rollout.valid
        for s in range(4):
            for t in range(2):
                done = rollout.terminated[t, s] or rollout.truncated[t, s]
                if valid[t + 1, s] and not done:
                    assert count[t + 1, s] - count[t, s] - (rollout.actions[t, s] + 1) in (1, 2)
        if previous is not None:
            last = previous.valid.sum(0) - 1 if previous.valid is not None else np.full(4, 2)
            for s in range(4):
                row = previous
                if not row.terminated[last[s], s]:  # the episode went on: this rollout starts where it stopped
                    np.testing.assert_array_equal(row.next_obs["observation"][last[s], s],
                                                  rollout.obs["observation"][0, s])
        previous = rollout


def test_padding_rows_take_no_part_in_the_update():
    """The same rollout with different contents in its padding rows gives the same weights after learn()."""
    results = []
    for fill in (0.0, 7.0):
        learner, col = _collector(UNEVEN, rollout_len=8, update_epochs=2, num_minibatches=2)
        torch.manual_seed(1)
        multi = col.collect(8)
        scout = multi.groups["scout"]
        pad = ~scout.valid
        scout.obs[pad] = fill
        scout.next_obs[pad] = fill
        scout.actions[pad] = int(fill) % 3
        scout.log_probs[pad] = -fill
        learner.learn(multi, progress=0.0)
        results.append({k: v.clone() for k, v in learner.policy.state_dict().items()})
    for key in results[0]:
        torch.testing.assert_close(results[0][key], results[1][key], rtol=0, atol=0)


def test_normalisation_statistics_leave_the_padding_rows_out():
    """Observation and reward statistics (``algo.norm_obs``, ``algo.norm_reward``) move with the valid rows
    only: a padding row repeats an observation nobody saw again and holds no reward anyone received."""
    from rltrain.algos.groups import GroupPPO
    from rltrain.algos.ppo import PPOSettings
    from rltrain.data.structs import EnvSpec, Rollout

    T, N = 6, 2
    rng = np.random.default_rng(0)
    valid = np.ones((T, N), bool)
    valid[3:, 1] = False  # slot 1's agent was done after 3 rows
    obs = rng.normal(size=(T, N, 3)).astype(np.float32)
    obs[~valid] = 1000.0  # what the padding repeats must not matter
    rewards = rng.normal(size=(T, N)).astype(np.float32) * valid
    terminated = ~valid
    terminated[2, 1] = True
    rollout = Rollout(obs=obs, actions=np.zeros((T, N), np.int64), log_probs=np.full((T, N), -1.1, np.float32),
                      rewards=rewards, terminated=terminated, truncated=np.zeros((T, N), bool), next_obs=obs.copy(),
                      policy_version=np.zeros(T, np.int64), valid=valid)
    settings = PPOSettings(rollout_len=T, num_minibatches=2, update_epochs=1, norm_obs=True, norm_reward=True)
    learner = GroupPPO(EnvSpec("pad", (3,), "discrete", (), n_actions=3), settings, num_envs=N, device=CPU)
    learner.learn(rollout, progress=0.0)
    norm, seen = learner.policy.obs_norm, obs[valid].astype(np.float64)
    assert float(norm.count) == pytest.approx(1e-4 + valid.sum())
    np.testing.assert_allclose(norm.mean.numpy(), seen.sum(0) / (1e-4 + valid.sum()), rtol=1e-6)
    assert float(learner.reward_scaler.norm.count) == pytest.approx(1e-4 + valid.sum())


def test_recurrent_policies_learn_from_padded_columns_and_carry_their_state():
    from rltrain.models.settings import ModelSettings

    factory = _factory(UNEVEN)
    spec = factory.spec()
    torch.manual_seed(0)
    learner = MAPPO(spec, MAPPOSettings(rollout_len=8, update_epochs=1), num_envs=2, device=CPU,
                    model=ModelSettings(core="gru", core_size=16))
    col = MultiAgentCollector(factory.vector([1, 2]), learner.policy, spec, device=CPU)
    col.collect(8)
    multi = col.collect(8)  # starts mid-episode: the state the first collection ended in
    start = multi.groups["clerk"].core_state
    assert len(start) == 2 and start[0].shape == (1, 2, 16)  # the actor's and the critic's GRU
    assert start[0].abs().sum() > 0  # the clerk was mid-episode: its memory carried into this rollout
    metrics = learner.learn(multi, progress=0.0)
    assert np.isfinite(metrics["loss/policy"]) and "loss/policy/scout" in metrics
    for rollout in multi.groups.values():
        assert rollout.obs[STATE_KEY].shape[-1] == 12  # the env's state(), the critic's alone


# -- policy groups and algorithms ------------------------------------------------------------------------
def test_policy_mapping_auto_shared_per_agent_and_a_config_mapping():
    spread = _factory(SPREAD, N=3, max_cycles=25, continuous_actions=False).spec()
    c4 = _factory(C4).spec()
    uneven = _factory(UNEVEN).spec()
    names = lambda spec, **s: [(g.name, g.agents, g.ids) for g in IPPO(spec, IPPOSettings(**s), num_envs=2,  # noqa: E731
                                                                         device=CPU).groups]
    assert names(spread) == [("shared", ("agent_0", "agent_1", "agent_2"), 3)]
    assert names(spread, agent_id=False) == [("shared", ("agent_0", "agent_1", "agent_2"), 0)]
    assert names(spread, policies="per_agent") == [(a, (a,), 0) for a in spread.agents]
    assert names(spread, policies={"agent_0": "lead", "agent_1": "rest", "agent_2": "rest"}) == \
        [("lead", ("agent_0",), 0), ("rest", ("agent_1", "agent_2"), 2)]
    assert names(uneven) == [("scout", ("scout",), 0), ("pilot", ("pilot",), 0), ("clerk", ("clerk",), 0)]
    assert names(c4, self_play=True) == [("main", ("player_0", "player_1"), 2)]
    # the shared MLP group appends the index to a float vector (the numpy fast path stays open)
    (g,) = IPPO(spread, IPPOSettings(), num_envs=2, device=CPU).groups
    assert g.flat and g.spec.obs_shape == (21,)
    mappo = MAPPO(spread, MAPPOSettings(), num_envs=2, device=CPU)
    (g,) = mappo.groups
    assert g.state == "env" and [k for k, _ in g.spec.observation.parts] == ["obs", AGENT_ID_KEY, STATE_KEY]
    assert mappo.policy.groups["shared"].torso.actor_encoder.keys == ("obs", AGENT_ID_KEY)  # never the state
    assert MAPPO(c4, MAPPOSettings(), num_envs=2, device=CPU).groups[0].state == "joined"
    with pytest.raises(ConfigError, match="algo.policies maps no policy to agent 'clerk'"):
        IPPO(uneven, IPPOSettings(policies={"scout": "a", "pilot": "b"}), num_envs=2, device=CPU)
    with pytest.raises(ConfigError, match="share the policy 'shared' but act or observe in different spaces"):
        IPPO(uneven, IPPOSettings(policies="shared"), num_envs=2, device=CPU)
    with pytest.raises(ConfigError, match="'ghost' is not an agent"):
        IPPO(uneven, IPPOSettings(policies={"ghost": "a", "scout": "a", "pilot": "b", "clerk": "c"}), num_envs=2,
             device=CPU)


def test_value_norm_standardises_targets_and_inverts():
    from rltrain.algos.base import Sync

    norm = ValueNorm()
    x = np.random.default_rng(0).normal(5.0, 3.0, 4096)
    norm.update(x, Sync())
    z = norm.normalize(x)
    assert abs(z.mean()) < 1e-3 and abs(z.std() - 1) < 1e-3
    np.testing.assert_allclose(norm.denormalize(z), x, rtol=1e-5, atol=1e-4)


# -- rltrain-check ---------------------------------------------------------------------------------------
def test_rltrain_check_says_the_agents_groups_slots_and_what_a_turn_based_update_costs(tmp_path, monkeypatch):
    """Heterogeneous agents: a group each, their slots and rows; a turn-based game by self-play: one learner seat
    per env, and about two turns per learner row, which the run's own update count then confirms."""
    from rich.console import Console

    from rltrain.cli import build, check, preflight
    from tests.conftest import compose_cfg

    monkeypatch.syspath_prepend(str(REPO))

    built = {}

    def rows(overrides: list[str]) -> dict:
        built["trainer"] = trainer = build.build_trainer(build.prepare(compose_cfg(overrides)),
                                                         tmp_path / "c", check_only=True)
        return dict(check.batch_rows(trainer.settings.config, trainer))

    team = rows([*BASE, f"env.id={UNEVEN}", "algo=mappo", "algo.rollout_len=16", "total_env_steps=512"])
    assert team["agents"] == "3 (scout, pilot, clerk): a parallel env, every live agent acts at each env step"
    assert team["policy groups (algo.policies=auto)"] == ("scout = scout (its critic reads env.state()); pilot = "
                                                          "pilot (its critic reads env.state()); clerk = clerk (its "
                                                          "critic reads env.state())")
    assert team["group clerk per update"].startswith("2 envs x 1 agents = 2 slots x 16 rows (algo.rollout_len: "
                                                     "rows per slot) = 32 rows; 1 minibatch of 32")
    assert team["env steps per update"] == "algo.rollout_len (16) x env.num_envs (2) = 32"
    assert team["updates"] == "512 total_env_steps / 32 = 16, whole: the run ends at 512 env steps"
    # memory: each group's rows at its own row size (its observation plus the global state its critic reads)
    trainer = built["trainer"]
    size, spec = trainer.update_size(), trainer.settings.env_spec
    huge = dataclasses.replace(size, env_steps=size.env_steps * 2**40)  # 2**41 env columns of 16 rows
    with pytest.raises(ConfigError, match=r"^one update's rollout needs [0-9.]+ GiB: algo.rollout_len \(16\) x "
                       r"env.num_envs \(2\) = [0-9]+ env steps; scout: 35184372088832 rows x [0-9]+ bytes \+ pilot: "
                       r"35184372088832 rows x [0-9]+ bytes \+ clerk: 35184372088832 rows x [0-9]+ bytes, but"):
        preflight.check_size(trainer.settings, huge, spec)
    game = [*BASE, f"env.id={C4}", "algo=ippo", "algo.self_play=true", "algo.rollout_len=32", "total_env_steps=1024",
            "algo.update_epochs=1", "eval.every_env_steps=0", "checkpoint.every_env_steps=0"]
    c4 = rows(game)
    assert c4["group main per update"].startswith("2 envs x 1 learner seat = 2 slots x 32 rows")
    assert c4["env steps per update"].startswith("algo.rollout_len (32) x env.num_envs (2) x 2 agents taking turns "
                                                 "(an AEC env step is one agent's turn) = 128 (at most about")
    assert c4["updates"].startswith("1024 total_env_steps / 128 = 8, whole: the run ends after 8 updates, at about "
                                    "1024 env steps or fewer")
    assert "an AEC env step is one agent's turn" in c4["total_env_steps counts"]
    console = Console(record=True, width=300)
    assert check.check(game, console) == 0 and "group main per update" in console.export_text()
    summary = build.run(compose_cfg(game), tmp_path / "run")
    # "about": a game can end on the opponent's turn, so a learner row costs slightly under two turns on average;
    # the run ends after the updates announced
    assert summary["updates"] == 8 and 0.9 * 128 <= summary["total_env_steps"] / summary["updates"] <= 128


# -- from the command line ------------------------------------------------------------------------------
REFUSALS = [
    ([f"env.id={UNEVEN}", "algo=ippo", "algo.policies={scout:a,pilot:b}"],
     "algo.policies maps no policy to agent 'clerk'"),
    ([f"env.id={UNEVEN}", "algo=ippo", "algo.policies=shared"], "share the policy 'shared' but act or observe in"),
    (["env.id=tests.helpers.agent_envs:odd", "algo=ippo"],
     "agent 'a': observation space Text is not supported"),
    (["env.id=tests.helpers.agent_envs:odd", "+env.kwargs.kind=tagged", "algo=mappo"],
     "algo=mappo needs a global state: env.id=tests.helpers.agent_envs:odd has no state()"),
    ([f"env.id={TURNS}", "+env.kwargs.zero_sum=false", "algo=ippo", "algo.self_play=true"],
     "algo.self_play=true needs a two-player zero-sum game; env.id=tests.helpers.agent_envs:turns: its players' "
     "returns do not sum to zero"),
    ([f"env.id={SPREAD}", *SPREAD_KW, "algo=mappo", "algo.self_play=true"], "it has 3 agents"),
    ([f"env.id={SPREAD}", *SPREAD_KW, "algo=dqn"], "algo=dqn trains one agent, but env.id=mpe2.simple_spread_v3"),
    ([f"env.id={SPREAD}", *SPREAD_KW, "algo=sac"], "algo=sac trains one agent"),
    ([f"env.id={SPREAD}", *SPREAD_KW, "algo=a2c"], "algo=a2c trains one agent"),
    (["env=cartpole", "algo=mappo"], "algo=mappo trains the agents of a PettingZoo multi-agent env"),
    ([f"env.id={SPREAD}", *SPREAD_KW, "algo=ippo", "env.wrappers=[ClipReward]"],
     "env.wrappers apply to a Gymnasium env"),
    ([f"env.id={SPREAD}", *SPREAD_KW, "algo=ippo", "env.vectorization=async"],
     "env.vectorization=async: a multi-agent env is stepped in the process that collects"),
    ([f"env.id={SPREAD}", *SPREAD_KW, "algo=ippo", "eval.video=true"], "eval.video=true records a single-agent"),
    ([f"env.id={SPREAD}", *SPREAD_KW, "algo=ippo", "algo.action_mask=on"], "no agent of env.id=mpe2"),
]


@pytest.mark.parametrize(("args", "expected"), REFUSALS, ids=[e[:40] for _, e in REFUSALS])
def test_bad_multiagent_input_is_refused_before_training(tmp_path, args, expected, monkeypatch):
    from rltrain.cli.build import run
    from tests.conftest import compose_cfg

    monkeypatch.syspath_prepend(str(REPO))
    with pytest.raises(ConfigError) as err:
        run(compose_cfg(BASE + args), tmp_path)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("k", [0, 2, 4, 6])  # a mapping, a space, self-play, a one-agent algorithm
def test_bad_multiagent_input_is_one_line_from_the_command_line(cli, k):
    args, expected = REFUSALS[k]
    res = cli(*BASE, *args, timeout=120, env=HELPERS)
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and "Warning" not in ln and "warn" not in ln]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("rltrain: error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in res.stderr


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_ppo_on_mpe_is_ippo_and_mappo_reports_every_agent(cli, tmp_path):
    res = cli(*SMOKE, f"env.id={SPREAD}", *SPREAD_KW, "algo=ppo", f"hydra.run.dir={tmp_path / 'ippo'}")
    assert res.returncode == 0, res.stderr
    assert "algo=ppo trains it as independent PPO" in res.stdout
    ippo = _summary(tmp_path / "ippo")
    res = cli(*SMOKE, f"env.id={SPREAD}", *SPREAD_KW, "algo=mappo", f"hydra.run.dir={tmp_path / 'mappo'}")
    assert res.returncode == 0, res.stderr
    mappo = _summary(tmp_path / "mappo")
    for summary, algo in ((ippo, "ippo"), (mappo, "mappo")):
        assert summary["status"] == "completed" and summary["algo"] == algo
        per_agent = summary["final_eval_return_per_agent"]
        assert set(per_agent) == {"agent_0", "agent_1", "agent_2"}
        assert summary["final_eval_return"] == pytest.approx(np.mean(list(per_agent.values())))
    header = (tmp_path / "mappo" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "eval/return_mean/agent_2" in header and "rollout/episode_return/agent_0" in header


@pytest.mark.slow
def test_self_play_on_connect_four_reports_outcomes_against_random_and_latest(cli, tmp_path):
    res = cli(*SMOKE, f"env.id={C4}", "algo=ippo", "algo.self_play=true", "algo.self_play_pool=3",
              "algo.self_play_every=1", f"hydra.run.dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    summary = _summary(tmp_path)
    for key in ("eval_vs_random", "eval_vs_latest"):
        assert set(summary[key]) == {"win", "draw", "loss"} and sum(summary[key].values()) == pytest.approx(1.0)
    assert set(summary["final_eval_return_per_agent"]) == {"player_0", "player_1"}
    ckpt = torch.load(tmp_path / "checkpoints" / "final.pt", weights_only=True)
    policy = ckpt["algo"]["policy"]
    assert int(policy["pool.count"]) == 3 and policy["pool.versions"].tolist() != [0, 0, 0]
    assert any(k.startswith("groups.main.") for k in policy)


# -- determinism, resume, every trainer -----------------------------------------------------------------
RUN = ["debug=smoke", "logger=quiet", "env.num_envs=2", "algo.update_epochs=2", "eval.episodes=2",
       "eval.every_env_steps=1024", "algo.anneal_lr=false"]
CASES = {
    "mappo-spread": [f"env.id={SPREAD}", *SPREAD_KW, "algo=mappo"],
    "selfplay-c4": [f"env.id={C4}", "algo=ippo", "algo.self_play=true", "algo.self_play_every=1",
                    "algo.self_play_pool=3", "algo.rollout_len=32"],
    "uneven-gru": [f"env.id={UNEVEN}", "algo=ippo", "model.core=gru", "model.core_size=8", "algo.rollout_len=16"],
}


def _policy(run_dir):
    from rltrain.run.checkpoint import load_checkpoint

    state, _ = load_checkpoint(run_dir / "checkpoints" / "final.pt")
    return state


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_resume_is_bitwise_identical_and_the_same_seed_the_same_run(tmp_path, case, monkeypatch):
    """Once through 2n steps, twice through n + n (resumed from the checkpoint at n, the envs mid-episode from
    their sidecar, AEC moves awaiting their outcome included): the same weights, the same metrics."""
    from rltrain.cli.build import run
    from rltrain.run.metrics import WALL_CLOCK_PREFIX, read_metrics
    from tests.conftest import compose_cfg

    monkeypatch.syspath_prepend(str(REPO))
    n = 512
    base = RUN + CASES[case] + ["eval.every_env_steps=256", "log.every_env_steps=128"]
    run(compose_cfg(base + [f"total_env_steps={2 * n}"]), tmp_path / "once")
    run(compose_cfg(base + [f"total_env_steps={n}"]), tmp_path / "twice")
    summary = run(compose_cfg(base + [f"total_env_steps={2 * n}", "resume=auto"]), tmp_path / "twice")
    # the first segment ends after its whole updates: a turn-based game's take up to their rows' turns
    assert summary["status"] == "completed" and summary["resumed_from_env_steps"] >= (0.9 * n if "c4" in case else n)
    once, twice = _policy(tmp_path / "once"), _policy(tmp_path / "twice")
    assert once["counters"] == {**twice["counters"], "wall_time": once["counters"]["wall_time"]}
    p1, p2 = once["algo"]["policy"], twice["algo"]["policy"]
    assert p1.keys() == p2.keys()
    for key in p1:
        assert torch.equal(p1[key], p2[key]), key
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(WALL_CLOCK_PREFIX)} for r in rows]  # noqa: E731
    a, b = (strip(read_metrics(tmp_path / d / "metrics.csv")) for d in ("once", "twice"))
    # a turn-based first segment ends after its updates, short of a log step: its final row is its own
    b = [r for r in b if r["env_steps"] in {x["env_steps"] for x in a} or
         int(r["env_steps"]) != summary["resumed_from_env_steps"]]
    assert [r["env_steps"] for r in a] == [r["env_steps"] for r in b] and a[-2] == b[-2]
    if case == "mappo-spread":  # the same seed again: the same run
        run(compose_cfg(base + [f"total_env_steps={2 * n}"]), tmp_path / "again")
        assert strip(read_metrics(tmp_path / "again" / "metrics.csv")) == a


TRAINERS = {
    "distributed_simulator": ["trainer=distributed_simulator", "trainer.world_size=2"],
    "parallel": ["trainer=parallel", "trainer.num_agents=2"],
    "subprocess_actors": ["trainer=subprocess_actors", "trainer.num_actors=2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_every_multi_process_trainer_trains_a_multi_agent_env(cli, tmp_path, trainer):
    """MAPPO on MPE under each trainer; self-play on connect four under subprocess_actors (its actors play the
    pool the learner publishes with its weights)."""
    case = CASES["selfplay-c4"] if trainer == "subprocess_actors" else CASES["mappo-spread"]
    res = cli(*RUN, *case, *TRAINERS[trainer], f"hydra.run.dir={tmp_path}", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = _summary(tmp_path)
    assert summary["status"] == "completed"
    if trainer == "parallel":  # independent teams, each with its own seed; the parent averages them
        assert set(summary["final_eval_return_per_agent"]) == {"agent_0", "agent_1", "agent_2"}
        for k in range(2):
            agent = _summary(tmp_path / f"agent_{k}")
            assert set(agent["final_eval_return_per_agent"]) == {"agent_0", "agent_1", "agent_2"}
    elif trainer == "subprocess_actors":
        assert set(summary["eval_vs_random"]) == {"win", "draw", "loss"}
    else:
        assert summary["world_size"] == 2 and len(summary["final_eval_return_per_agent"]) == 3


# -- the tools: rltrain-eval, rltrain-export, rltrain.load_policy ----------------------------------------
@pytest.fixture(scope="module")
def spread_run(tmp_path_factory):
    from rltrain.cli.build import run
    from tests.conftest import compose_cfg

    run_dir = tmp_path_factory.mktemp("spread")
    run(compose_cfg(RUN + CASES["mappo-spread"] + ["total_env_steps=512", "algo.rollout_len=32"]), run_dir)
    return run_dir


def test_load_policy_gives_every_agent_a_policy_on_its_own_observation(spread_run, tmp_path, capsys):
    """No opt-in: the checkpoint records the agents' spaces and the policy groups, so nothing is imported to
    build the networks; each exported file computes what its agent's policy does, and rltrain-export names every
    file it writes."""
    import rltrain
    from rltrain.cli.export import main as export

    policies = rltrain.load_policy(spread_run)
    assert set(policies) == {"agent_0", "agent_1", "agent_2"}
    env = _factory(SPREAD, N=3, max_cycles=25, continuous_actions=False).make()
    obs, _ = env.reset(seed=0)
    for agent, policy in policies.items():
        action, state = policy.act(obs[agent])
        assert state is None and env.action_space(agent).contains(int(action))
        batch, _ = policy.act(np.stack([obs[agent]] * 3))
        assert batch.shape == (3,) and (batch == action).all()
    # agents share the weights, not the index: the same observation may be acted on differently per agent
    shared = [p.module.policy for p in policies.values()]
    assert shared[0] is shared[1] is shared[2]
    out = tmp_path / "pi.pt2"
    capsys.readouterr()
    assert export([str(spread_run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {tmp_path / f'pi_{a}.pt2'} and {tmp_path / f'pi_{a}.json'}"
                                                    for a in ("agent_0", "agent_1", "agent_2")]
    batch = torch.randn(4, 18)
    for agent, policy in policies.items():
        program = torch.export.load(tmp_path / f"pi_{agent}.pt2").module()
        expected, _ = policy.act(batch.numpy())
        np.testing.assert_array_equal(program(batch).numpy(), expected)
        assert json.loads((tmp_path / f"pi_{agent}.json").read_text())["inputs"][0]["shape"] == ["B", 18]
    assert export([str(spread_run), "--out", str(out)]) == 2  # exists: refused, one line


@pytest.fixture(scope="module")
def team_run(tmp_path_factory):
    """MAPPO with GRU cores on a team env of the user's own (three agents with spaces of their own: three policy
    groups, the env's global state in their critics), trained beside the user; its module is then deleted, so
    nothing that loads the policies afterwards can import it."""
    from tests.conftest import run_cli

    home = tmp_path_factory.mktemp("team")
    (home / "my_team.py").write_text((REPO / "tests" / "helpers" / "agent_envs.py").read_text())
    res = run_cli(["env.id=my_team:uneven", "algo=mappo", "model.core=gru", "model.core_size=8", *RUN,
                   "total_env_steps=64", "algo.rollout_len=16", "eval.every_env_steps=0", "hydra.run.dir=out"],
                  cwd=home, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (home / "my_team.py").unlink()
    return home / "out"


def test_a_team_whose_env_module_is_gone_loads_acts_and_exports(team_run, tmp_path):
    import sys

    import rltrain
    from rltrain.cli.export import main as export

    policies = rltrain.load_policy(team_run)
    assert "my_team" not in sys.modules and set(policies) == {"scout", "pilot", "clerk"}
    record = torch.load(team_run / "checkpoints" / "final.pt", weights_only=True)["meta"]["spaces"]
    assert [(g["name"], g["agents"], g["state"], g["core_state"]) for g in record["groups"]] == [
        (a, [a], "env", [[1, 1, 8], [1, 1, 8]]) for a in ("scout", "pilot", "clerk")]  # actor and critic cores
    observations = {"scout": np.zeros(3, np.float32), "pilot": np.zeros(4, np.float32),
                    "clerk": {"pos": np.zeros(2, np.float32), "tag": np.ones(3, np.int8)}}
    for agent, policy in policies.items():
        action, state = policy.act(observations[agent])
        assert policy.recurrent and [list(t.shape) for t in state] == [[1, 1, 8], [1, 1, 8]]
        assert policy.spec.describe() == {"scout": "Discrete(3)", "pilot": "Box(shape=(2,))",
                                          "clerk": "MultiDiscrete([2, 3])"}[agent], agent
    assert export([str(team_run), "--out", str(tmp_path / "team.pt2")]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.pt2")) == ["team_clerk.pt2", "team_pilot.pt2", "team_scout.pt2"]
    assert json.loads((tmp_path / "team_clerk.json").read_text())["state"]["names"] == ["h"]


def test_rltrain_eval_shows_a_team_and_steps_its_env_only_when_allowed(team_run, capsys):
    from rltrain.cli.evaluate import main as evaluate

    assert evaluate([str(team_run)]) == 0
    shown = capsys.readouterr().out
    assert "3 agents in 3 policy groups" in shown and "episodes: none run" in shown, shown
    assert "clerk: policy clerk  observation Dict('pos': Box" in shown and "action MultiDiscrete([2, 3])" in shown
    assert evaluate([str(team_run), "--episodes", "2"]) == 2
    asked = capsys.readouterr().err.strip().splitlines()
    assert len(asked) == 1 and "env.id=my_team:uneven" in asked[0] and "pass --allow-import" in asked[0], asked
    assert evaluate([str(team_run), "--episodes", "2", "--allow-import"]) == 2
    assert "cannot import 'my_team'" in capsys.readouterr().err  # only now is the module looked for


@pytest.mark.parametrize(("edit", "message"), [
    (lambda cfg: cfg["model"].update(core="lstm"), "policy group 'scout''s recurrent state is ((1, 1, 8), (1, 1, 8)), "
     "but its settings build a network whose state is ((1, 1, 8), (1, 1, 8), (1, 1, 8), (1, 1, 8))"),
    (lambda cfg: cfg["algo"].update(policies={"scout": "a", "pilot": "b", "clerk": "b"}), "but act or observe in"),
    (lambda cfg: cfg["algo"].update(policies={"scout": "a", "pilot": "b", "clerk": "c"}),
     "its policy groups are {scout: scout; pilot: pilot; clerk: clerk}, but its settings map the agents to "
     "{a: scout; b: pilot; c: clerk}"),
], ids=["core", "spaces", "mapping"])
def test_a_team_checkpoint_whose_settings_build_other_groups_is_one_line(team_run, tmp_path, edit, message):
    import rltrain

    state = torch.load(team_run / "checkpoints" / "final.pt", weights_only=True)
    edit(state["meta"]["config"])
    torch.save(state, tmp_path / "edited.pt")
    with pytest.raises(ConfigError, match="edited.pt") as err:
        rltrain.load_policy(tmp_path / "edited.pt")
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_every_policy_group_survives_a_weights_only_checkpoint(tmp_path):
    """The agents' spaces (masks, a Dict, the global state, heterogeneous actions) and the policy groups read
    back equal; a malformed record is a ValueError naming what."""
    from rltrain.data.agents import AgentsPolicySpaces

    for env_id, algo, kwargs in ((UNEVEN, MAPPO, {}), (C4, IPPO, {"self_play": True}), (TURNS, MAPPO, {})):
        learner, _ = _collector(env_id, algo, **kwargs)
        spaces = learner.policy_spaces("key")
        torch.save({"spaces": spaces.to_record()}, tmp_path / "ckpt.pt")
        record = torch.load(tmp_path / "ckpt.pt", weights_only=True)["spaces"]
        assert AgentsPolicySpaces.from_record(record) == spaces and spaces.difference(spaces) is None
    record["agents"]["api"] = "turnwise"
    with pytest.raises(ValueError, match="api 'turnwise'"):
        AgentsPolicySpaces.from_record(record)


# -- learning (cut down: seconds) ------------------------------------------------------------------------
LEARN = ["logger=quiet", "env.num_envs=4", "eval.every_env_steps=0", "checkpoint.every_env_steps=0",
         "eval.episodes=4", "eval.both_modes=false"]


@pytest.mark.learning
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ippo", "mappo"])
def test_ippo_and_mappo_learn_every_agents_task(tmp_path, algo, monkeypatch):
    """Uneven: a scout with Discrete actions (+1 for action = step % 3, 3 steps), a pilot with Box actions
    (minus its distance to (0.5, -0.5), 6 steps), a clerk with MultiDiscrete actions and a Dict observation (+1
    per component matching a tag, 9 steps). Random play scores about 1, -4 and 7.5; 4096 steps learn all three."""
    from rltrain.cli.build import run
    from tests.conftest import compose_cfg

    monkeypatch.syspath_prepend(str(REPO))
    summary = run(compose_cfg(LEARN + [f"env.id={UNEVEN}", f"algo={algo}", "total_env_steps=4096", "algo.lr=1e-3",
                                       "algo.rollout_len=32", "algo.num_minibatches=4"]), tmp_path)
    per_agent = summary["final_eval_return_per_agent"]
    assert per_agent["scout"] >= 2.5 and per_agent["clerk"] >= 15 and per_agent["pilot"] >= -2.5, per_agent


@pytest.mark.learning
@pytest.mark.slow
def test_self_play_learns_to_beat_random_legal_moves(tmp_path, monkeypatch):
    """Turns (reach 7 first, adding 1 or 2): the first player can always win, the second whenever the first
    slips; self-play from a pool of past versions learns it against random moves in both seats."""
    from rltrain.cli.build import run
    from tests.conftest import compose_cfg

    monkeypatch.syspath_prepend(str(REPO))
    summary = run(compose_cfg(LEARN + [f"env.id={TURNS}", "algo=ippo", "algo.self_play=true", "eval.episodes=20",
                                       "total_env_steps=6000", "algo.rollout_len=64", "algo.num_minibatches=4",
                                       "algo.self_play_every=2", "algo.ent_coef=0.01"]), tmp_path)
    assert summary["eval_vs_random"]["win"] >= 0.75, summary["eval_vs_random"]
