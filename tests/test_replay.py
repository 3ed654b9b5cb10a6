"""The replay buffer against a slow reference: a dict of full transitions (obs, reward, next_obs, terminated).

Rollouts come from real gymnasium envs (``tests.helpers.tiny_image``, wrapped in ``FrameStackObservation``
for stacks) stepped with same-step autoreset, several streams arriving in varying column orders and
subsets. Every transition's action is a unique id, so each row the buffer holds can be checked field by
field against the reference transition with that id.
"""

from __future__ import annotations

import io
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrain.algos.dqn import DQN, DQNSettings
from rltrain.data.memory import row_bytes
from rltrain.data.replay import ReplayBuffer
from rltrain.data.structs import EnvSpec, Rollout
from rltrain.errors import ConfigError
from rltrain.models.settings import ModelSettings
from tests.helpers.tiny_image import TinyImageEnv

CPU = torch.device("cpu")
FRAME = (3, 4)


class Streams:
    """N env streams and the reference: every transition by its action id, which ones have a successor."""

    def __init__(self, n: int, *, dtype: str, stack: int | None, seed: int, padding: str = "reset"):
        def make(i: int) -> gym.Env:
            env = TinyImageEnv(FRAME, dtype)
            return env if stack is None else gym.wrappers.FrameStackObservation(env, stack, padding_type=padding)

        self.envs = [make(i) for i in range(n)]
        self.obs = [env.reset(seed=seed * 100 + i)[0] for i, env in enumerate(self.envs)]
        self.rng = np.random.default_rng(seed)
        self.reference: dict[int, tuple] = {}
        self.complete: set[int] = set()  # transitions whose successor has been added
        self.pending: dict[int, int] = {}  # stream -> its last transition, still waiting for its successor
        self.adds: list[tuple[int, int]] = []  # (first action id, rows) per add: T*N + episode ends
        self.next_id = 0

    def rollout(self, T: int, ids: list[int], *, id_actions: bool = True) -> Rollout:
        """T steps of streams ``ids`` (columns in that order); actions are the transition ids unless
        ``id_actions=False`` (then the env's actions, id % 3)."""
        N, shape, dtype = len(ids), self.obs[0].shape, self.obs[0].dtype
        obs, next_obs = np.empty((T, N, *shape), dtype), np.empty((T, N, *shape), dtype)
        actions, rewards = np.empty((T, N), np.int64), np.empty((T, N), np.float32)
        term, trunc = np.zeros((T, N), bool), np.zeros((T, N), bool)
        first = self.next_id
        for t in range(T):
            for c, i in enumerate(ids):
                a = self.next_id
                self.next_id += 1
                o2, r, te, tr, _ = self.envs[i].step(a % 3)
                obs[t, c], next_obs[t, c], actions[t, c] = self.obs[i], o2, a if id_actions else a % 3
                rewards[t, c], term[t, c], trunc[t, c] = r + self.rng.normal(), te, tr
                self.reference[a] = (self.obs[i].copy(), rewards[t, c], o2.copy(), te)
                if i in self.pending:
                    self.complete.add(self.pending.pop(i))
                if te or tr:
                    self.complete.add(a)
                    self.obs[i] = self.envs[i].reset()[0]
                else:
                    self.pending[i] = a
                    self.obs[i] = o2
        self.adds.append((first, T * N + int((term | trunc).sum())))
        return Rollout(obs=obs, actions=actions, log_probs=np.zeros((T, N), np.float32), rewards=rewards,
                       terminated=term, truncated=trunc, next_obs=next_obs, policy_version=np.zeros(T, np.int64),
                       env_ids=np.asarray(ids, np.int64))

    def restart(self, i: int) -> None:
        """Stream i's env is reset mid-episode (a restarted actor): its open transition never completes."""
        self.pending.pop(i, None)
        self.obs[i] = self.envs[i].reset(seed=int(self.rng.integers(1 << 30)))[0]

    def window_start(self, capacity: int, history_adds: int) -> int:
        """The first action id from which every complete transition must still be sampleable: the newest
        adds whose rows, with ``history_adds`` adds before them (older stack frames), fit the ring."""
        start, rows = self.next_id, 0
        for k in range(len(self.adds) - 1, -1, -1):
            rows += self.adds[k][1]
            if rows > capacity:
                break
            if k + history_adds < len(self.adds):
                start = self.adds[k + history_adds][0]
        return start


def make_buffer(capacity: int, streams: Streams, stack: int | None) -> ReplayBuffer:
    obs = streams.obs[0]
    return ReplayBuffer(capacity, obs.shape, (), np.dtype(np.int64), device=CPU, obs_dtype=obs.dtype,
                        frame_stack=stack)


def check(buf: ReplayBuffer, streams: Streams, *, from_id: int | None = None) -> int:
    """Every sampleable row equals its reference transition; the sampleable set is the complete set
    (``from_id=None``) or lies in it and covers every complete transition from ``from_id`` on."""
    slots = np.arange(min(buf.written, buf.capacity))
    slots = slots[buf.sampleable(slots)]
    b = buf.batch(slots)
    assert b.obs.dtype == b.next_obs.dtype == torch.from_numpy(streams.obs[0]).dtype
    ids = b.actions.numpy().tolist()
    assert len(set(ids)) == len(ids)
    for k, a in enumerate(ids):
        obs, reward, next_obs, terminated = streams.reference[a]
        assert np.array_equal(b.obs[k].numpy(), obs), a
        assert np.array_equal(b.next_obs[k].numpy(), next_obs), a
        assert b.rewards[k].item() == reward and b.terminated[k].item() == float(terminated), a
    if from_id is None:
        assert set(ids) == streams.complete
    else:
        assert set(ids) <= streams.complete
        assert {a for a in streams.complete if a >= from_id} <= set(ids)
    assert buf.ready >= len(ids)
    return len(ids)


CASES = [("uint8", None), ("uint8", 3), ("bool", None), ("bool", 2), ("float32", None), ("float32", 4)]


@pytest.mark.parametrize(("dtype", "stack"), CASES)
@pytest.mark.parametrize("seed", range(4))
def test_streams_in_any_order_and_subset_match_the_reference(dtype, stack, seed):
    rng = np.random.default_rng(seed)
    streams = Streams(5, dtype=dtype, stack=stack, seed=seed)
    buf = make_buffer(10_000, streams, stack)
    for _ in range(12):
        ids = rng.permutation(5)[: rng.integers(1, 6)].tolist()  # some streams, shuffled columns
        buf.add_rollout(streams.rollout(int(rng.integers(1, 5)), ids))
        check(buf, streams)
    assert len(buf) == streams.next_id
    batch = buf.sample(64)
    assert batch.obs.shape == (64, *streams.obs[0].shape) and batch.obs.dtype == batch.next_obs.dtype


@pytest.mark.parametrize(("dtype", "stack"), CASES)
@pytest.mark.parametrize("seed", range(3))
def test_ring_wraparound_keeps_every_recent_transition_and_nothing_stale(dtype, stack, seed):
    rng = np.random.default_rng(100 + seed)
    streams = Streams(3, dtype=dtype, stack=stack, seed=seed)
    capacity = int(rng.integers(20, 40))
    buf = make_buffer(capacity, streams, stack)
    for _ in range(25):
        T = int(rng.integers(1, 4))
        buf.add_rollout(streams.rollout(T, rng.permutation(3).tolist()))  # every stream, shuffled
        history = 0 if stack is None else math.ceil((stack - 1) / T) + 1
        check(buf, streams, from_id=streams.window_start(capacity, history))
    assert buf.written > 3 * capacity and len(buf) <= capacity


def test_streams_missing_for_a_while_and_restarted_ones():
    rng = np.random.default_rng(7)
    streams = Streams(4, dtype="uint8", stack=3, seed=7)
    buf = make_buffer(50, streams, 3)
    for k in range(30):
        if k % 5 == 4:
            streams.restart(int(rng.integers(4)))  # its next rollout does not continue the open transition
        buf.add_rollout(streams.rollout(int(rng.integers(1, 3)), rng.permutation(4)[: rng.integers(1, 5)].tolist()))
        check(buf, streams, from_id=streams.next_id)  # soundness only: absent streams' history may be gone


def endless(streams: Streams) -> Streams:
    """Streams whose episodes never end (so the rows of a rollout are exactly T*N)."""
    streams.envs = [TinyImageEnv(FRAME, env.dtype.name, p_terminate=0.0, max_steps=10**6) for env in streams.envs]
    return streams


def test_rollout_longer_than_the_ring_keeps_its_newest_rows():
    streams = endless(Streams(2, dtype="float32", stack=None, seed=3))
    buf = make_buffer(7, streams, None)
    buf.add_rollout(streams.rollout(9, [0, 1]))  # ids (= rows) 0..17: the ring keeps 11..17
    assert buf.written == 18 and len(buf) == 7 and sorted(buf.actions.tolist()) == list(range(11, 18))
    buf.add_rollout(streams.rollout(1, [1, 0]))  # rows 18, 19 overwrite 11, 12 and complete 16, 17
    assert check(buf, streams, from_id=13) == 5


def test_nothing_is_sampled_before_a_successor_arrives():
    streams = endless(Streams(2, dtype="uint8", stack=None, seed=0))
    buf = make_buffer(100, streams, None)
    buf.add_rollout(streams.rollout(1, [0, 1]))
    assert buf.ready == 0 and len(buf) == 2
    with pytest.raises(ValueError, match="no transition whose successor has arrived"):
        buf.sample(4)
    buf.add_rollout(streams.rollout(1, [1, 0]))
    assert buf.ready == 2 and check(buf, streams) == 2


def test_frame_stacks_store_one_frame_per_row():
    streams = Streams(1, dtype="uint8", stack=4, seed=0)
    buf = make_buffer(10, streams, 4)
    assert buf.obs.shape == (10, *FRAME) and buf.obs.dtype == np.uint8
    atari = row_bytes((84, 84), np.dtype(np.uint8), (), np.dtype(np.int64), frame_stack=4)
    assert 1_000_000 * atari["obs"] == 7_056_000_000  # the frames
    assert 1_000_000 * sum(atari.values()) < 8e9  # frames + metadata: the standard Atari setting fits 8 GB
    unstacked = row_bytes((4, 84, 84), np.dtype(np.uint8), (), np.dtype(np.int64), frame_stack=None)
    assert unstacked["obs"] == 28224 and sum(unstacked.values()) == 28246


def test_frame_stack_refusals_name_the_fix():
    streams = Streams(2, dtype="uint8", stack=None, seed=0)
    with pytest.raises(ConfigError, match=r"^algo.frame_stack=4: observations of shape \(3, 4\) are not stacks of "
                                          r"4 frames along the first axis \(k >= 2\); set algo.frame_stack=null$"):
        make_buffer(10, streams, 4)
    with pytest.raises(ConfigError, match=r"^algo.frame_stack=3: the observation of env stream \d at rollout step "
                                          r"0 is not a 3-frame stack .*; set algo.frame_stack=null$"):
        make_buffer(10, streams, 3).add_rollout(streams.rollout(2, [0, 1]))  # [3, 4] frames that are no stacks
    stacked = Streams(2, dtype="uint8", stack=3, seed=0)
    ro = stacked.rollout(4, [0, 1])
    ro.obs[2, 1, 0] += 1  # no longer the previous stack moved on by one frame
    with pytest.raises(ConfigError, match=r"^algo.frame_stack=3: the observation of env stream 1 at rollout step "
                                          r"1 is not a 3-frame stack .*; set algo.frame_stack=null$"):
        make_buffer(10, stacked, 3).add_rollout(ro)
    zero = Streams(1, dtype="uint8", stack=3, seed=1, padding="zero")  # episodes start [0, 0, first]
    buf = make_buffer(100, zero, 3)
    with pytest.raises(ConfigError, match=r"set algo.frame_stack=null$"):
        for _ in range(20):
            buf.add_rollout(zero.rollout(3, [0]))


def test_memory_preflight_refuses_with_the_arithmetic():
    pattern = (r"^algo.buffer_size=1000000000000 needs [0-9.]+ GiB \(1000000000000 x \(28224 B obs \+ 8 B action "
               r"\+ 4 B reward \+ 2 B flags \+ 8 B links\) = 1000000000000 x 28246 B\) but [0-9.]+ GiB are "
               r"available; lower algo.buffer_size or store each frame once with algo.frame_stack=4 "
               r"\(6606802.3 GiB\)$")  # 1e12 x (28246 - 28224 + 28224 / 4 + 16 more link bytes)
    with pytest.raises(ConfigError, match=pattern):
        ReplayBuffer(10**12, (4, 84, 84), (), np.dtype(np.int64), device=CPU, obs_dtype=np.dtype(np.uint8))
    spec = EnvSpec("Tiny", (4, 84, 84), "discrete", (), n_actions=3)
    # DQN hands frame_stack to its buffer (one frame per row, + prev/oldest links); float32 obs: this EnvSpec
    # names no obs dtype
    with pytest.raises(ConfigError, match=r"^algo.buffer_size=1000000000000 needs .*\(28224 B obs \+ 8 B action \+ "
                                          r"4 B reward \+ 2 B flags \+ 24 B links\).*; lower algo.buffer_size$"):
        DQN(spec, DQNSettings(buffer_size=10**12, frame_stack=4), num_envs=1, device=CPU)


def _roundtrip(state: dict) -> dict:
    f = io.BytesIO()
    torch.save(state, f)
    f.seek(0)
    return torch.load(f, weights_only=True)


@pytest.mark.parametrize(("dtype", "stack"), CASES)
def test_checkpoint_roundtrip_resumes_sampling_identically(dtype, stack):
    rng = np.random.default_rng(5)
    streams = Streams(3, dtype=dtype, stack=stack, seed=5)
    buf = make_buffer(30, streams, stack)
    for _ in range(15):
        buf.add_rollout(streams.rollout(int(rng.integers(1, 4)), rng.permutation(3).tolist()))
    other = make_buffer(30, streams, stack)
    other.load_state_dict(_roundtrip(buf.state_dict()))
    for k in buf.fields:
        assert np.array_equal(getattr(buf, k), getattr(other, k)), k
    ro = streams.rollout(2, [2, 0, 1])  # resume: the next rollout continues the open transitions
    batches = []
    for b in (buf, other):
        b.add_rollout(ro)
        np.random.seed(11)
        batches.append(b.sample(32))
    for field in ("obs", "actions", "rewards", "next_obs", "terminated"):
        assert torch.equal(getattr(batches[0], field), getattr(batches[1], field)), field
    assert buf.ready == other.ready and buf.tails.keys() == other.tails.keys()
    check(other, streams, from_id=streams.next_id)


def test_checkpoint_into_another_buffer_size():
    streams = Streams(2, dtype="uint8", stack=2, seed=2)
    buf = make_buffer(40, streams, 2)
    buf.add_rollout(streams.rollout(5, [0, 1]))
    bigger = make_buffer(80, streams, 2)
    bigger.load_state_dict(_roundtrip(buf.state_dict()))  # not wrapped yet: slots are the same
    bigger.add_rollout(streams.rollout(3, [1, 0]))
    check(bigger, streams)
    for _ in range(6):
        buf.add_rollout(streams.rollout(5, [0, 1]))
    with pytest.raises(ConfigError, match=r"^algo.buffer_size=80: the checkpoint's replay buffer holds \d+ rows "
                                          r"saved with algo.buffer_size=40; resume with that value or "
                                          r"checkpoint.replay_buffer=false$"):
        make_buffer(80, streams, 2).load_state_dict(_roundtrip(buf.state_dict()))
    with pytest.raises(ConfigError, match=r"algo.frame_stack=None: the checkpoint's replay buffer was saved with "
                                          r"algo.frame_stack=2"):
        ReplayBuffer(40, (2, *FRAME), (), np.dtype(np.int64), device=CPU,
                     obs_dtype=np.dtype(np.uint8)).load_state_dict(_roundtrip(buf.state_dict()))


def test_dqn_learns_from_stacked_uint8_frames():
    streams = Streams(2, dtype="uint8", stack=3, seed=4)
    spec = EnvSpec("Tiny", (3, *FRAME), "discrete", (), n_actions=3)
    torch.manual_seed(0)
    dqn = DQN(spec, DQNSettings(frame_stack=3, learning_starts=0, batch_size=8, train_frequency=1, buffer_size=64,
                                checkpoint_buffer=True), num_envs=2, device=CPU,
              model=ModelSettings(hidden_sizes=(16,)))
    assert dqn.buffer.obs.shape == (64, *FRAME)
    before = [p.detach().clone() for p in dqn.policy.parameters()]
    metrics = {}
    for _ in range(6):
        metrics = dqn.learn(streams.rollout(4, [0, 1], id_actions=False), progress=0.5)
    assert "loss/q" in metrics and math.isfinite(metrics["loss/q"])
    assert any(not torch.equal(p, q) for p, q in zip(before, dqn.policy.parameters(), strict=True))
    assert _roundtrip(dqn.state_dict())["replay_buffer"]["frame_stack"] == 3
    with pytest.raises(ConfigError, match=r"^algo.frame_stack=4: observations of shape \(3, 3, 4\) are not"):
        DQN(spec, DQNSettings(frame_stack=4), num_envs=2, device=CPU)


@pytest.mark.parametrize(("dtype", "stack"), [("uint8", None), ("uint8", 3)])
def test_a_batch_with_two_rollouts_of_one_stream_adds_them_in_order(dtype, stack):
    """subprocess_actors: an actor that delivered twice puts two consecutive rollouts of its streams side by
    side in one learner batch (repeated env_ids); they link exactly as if added one after the other."""
    streams = Streams(3, dtype=dtype, stack=stack, seed=7)
    buf = make_buffer(10_000, streams, stack)
    for _ in range(6):
        first, second = streams.rollout(3, [0, 1]), streams.rollout(3, [0, 1, 2])
        merged = Rollout(**{k: np.concatenate([getattr(first, k), getattr(second, k)], axis=1)
                            for k in ("obs", "actions", "log_probs", "rewards", "terminated", "truncated",
                                      "next_obs")},
                         policy_version=np.zeros(3, np.int64), env_ids=np.array([0, 1, 0, 1, 2]))
        buf.add_rollout(merged)
        check(buf, streams)


@pytest.mark.parametrize(("dtype", "stack"), CASES)
@pytest.mark.parametrize("capacity", [23, 10_000])
def test_batched_writes_fill_the_ring_exactly_as_one_add_per_rollout(dtype, stack, capacity):
    """``add_rollouts`` (what DQN and SAC do with the single steps gathered between two updates) leaves every
    field of every slot, the counters and the streams' open ends as adding the rollouts one by one."""
    rng = np.random.default_rng(capacity)
    one, many = (Streams(3, dtype=dtype, stack=stack, seed=5) for _ in range(2))
    buf_one, buf_many = make_buffer(capacity, one, stack), make_buffer(capacity, many, stack)
    for k in range(40):
        T = int(rng.integers(1, 3))
        cols = [0, 1, 2] if k % 7 else rng.permutation(3).tolist()  # a changed column order ends a run
        group = [(one.rollout(T, cols), many.rollout(T, cols)) for _ in range(int(rng.integers(1, 9)))]
        for r, _ in group:
            buf_one.add_rollout(r)
        buf_many.add_rollouts([r for _, r in group])
        if capacity > 1000:
            check(buf_many, many)
    assert buf_one.written == buf_many.written and buf_one.ready == buf_many.ready
    for name in buf_one.fields:
        assert np.array_equal(getattr(buf_one, name), getattr(buf_many, name)), name
    assert buf_one.tails.keys() == buf_many.tails.keys()
    np.random.seed(3)
    first = buf_one.sample(16)
    np.random.seed(3)
    second = buf_many.sample(16)
    assert torch.equal(first.obs, second.obs) and torch.equal(first.actions, second.actions)
