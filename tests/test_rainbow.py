"""DQN's Rainbow options, each against a reference computation written plainly here: the n-step target
(walking each stream's episode list by hand), prioritised replay's sum-tree sampling proportions and
importance weights, the C51 projection on hand-made atoms, the quantile Huber loss, the dueling combination,
noisy layers; then a TD step with every option, and bitwise resume, evaluation, export and ``load_policy``
through the CLI with each option on."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import rltrain
from rltrain.algos.distributional import c51_projection, quantile_huber_loss
from rltrain.algos.dqn import DQN, DQNSettings, Rainbow, RainbowSettings
from rltrain.cli.build import run
from rltrain.data.nstep import nstep_targets
from rltrain.data.prioritized import PrioritizedReplayBuffer, SumTree
from rltrain.data.replay import ReplayBuffer
from rltrain.data.structs import EnvSpec, ObsSpace, Rollout
from rltrain.errors import ConfigError
from rltrain.models.encoders import to_float
from rltrain.models.numpy_mlp import flat_float32
from rltrain.models.q_heads import NoisyLinear, QHeadOptions
from rltrain.models.q_networks import QPolicy
from rltrain.models.settings import ModelSettings
from rltrain.run.checkpoint import load_checkpoint
from rltrain.run.metrics import WALL_CLOCK_PREFIX, read_metrics
from tests.conftest import compose_cfg

CPU = torch.device("cpu")
CARTPOLE = EnvSpec("CartPole-v1", (4,), "discrete", (), n_actions=2)


class Streams:
    """N streams of scalar observations, each a unique id; random rewards, terminations and truncations. The
    reference keeps every stream's transitions in order as (obs id, reward, terminated, truncated, next id)."""

    def __init__(self, n: int, seed: int):
        self.rng = np.random.default_rng(seed)
        self.next_id = 0
        self.obs = [self._new() for _ in range(n)]
        self.transitions: list[list[tuple[int, float, bool, bool, int]]] = [[] for _ in range(n)]

    def _new(self) -> int:
        self.next_id += 1
        return self.next_id

    def rollout(self, T: int) -> Rollout:
        N = len(self.obs)
        obs, next_obs = np.zeros((T, N, 1), np.float32), np.zeros((T, N, 1), np.float32)
        rewards = self.rng.normal(size=(T, N)).astype(np.float32)
        term, trunc = self.rng.random((T, N)) < 0.08, self.rng.random((T, N)) < 0.05
        trunc &= ~term
        for t in range(T):
            for n in range(N):
                nxt = self._new()
                obs[t, n, 0], next_obs[t, n, 0] = self.obs[n], nxt
                self.transitions[n].append((self.obs[n], float(rewards[t, n]), bool(term[t, n]),
                                            bool(trunc[t, n]), nxt))
                self.obs[n] = self._new() if term[t, n] or trunc[t, n] else nxt
        return Rollout(obs=obs, actions=np.zeros((T, N), np.int64), log_probs=np.zeros((T, N), np.float32),
                       rewards=rewards, terminated=term, truncated=trunc, next_obs=next_obs,
                       policy_version=np.zeros(T, np.int64))

    def nstep(self, obs_id: int, n: int, gamma: float) -> tuple[float, int, bool, float]:
        """(return, bootstrap obs id, terminated, gamma^k) by walking the stream by hand."""
        for stream in self.transitions:
            index = {o: i for i, (o, *_rest) in enumerate(stream)}
            if obs_id in index:
                break
        i = index[obs_id]
        ret, k = 0.0, 0
        while True:
            _, r, te, tr, nxt = stream[i]
            ret += gamma ** k * r
            k += 1
            if te or tr or k == n:
                return ret, nxt, te, gamma ** k
            # the next transition counts only once its own successor has arrived: it is not the stream's newest
            # (whose next step has not been taken yet) unless it ended its episode
            last = i + 1 == len(stream) - 1 and not (stream[i + 1][2] or stream[i + 1][3])
            if last:
                return ret, nxt, te, gamma ** k
            i += 1


@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_targets_match_walking_each_episode_by_hand(n):
    streams, gamma = Streams(3, seed=n), 0.9
    buffer = ReplayBuffer(10_000, (1,), (), np.dtype(np.int64), device=CPU)
    for T in (5, 1, 7, 4, 9):
        buffer.add_rollout(streams.rollout(T))
    rows = min(buffer.written, buffer.capacity)
    slots = np.flatnonzero(buffer.sampleable(np.arange(rows)))
    assert len(slots) > 60
    ret, boot, term, discount = nstep_targets(buffer, slots, n=n, gamma=gamma)
    for j, slot in enumerate(slots):
        want = streams.nstep(int(buffer.obs[slot, 0]), n, gamma)
        assert ret[j] == pytest.approx(want[0], rel=1e-5, abs=1e-5)
        assert int(buffer.obs[boot[j] % buffer.capacity, 0]) == want[1]
        assert bool(term[j]) == want[2] and discount[j] == pytest.approx(want[3], rel=1e-6)
    if n > 1:  # the walk really went further than one step somewhere, and stopped short somewhere
        assert (discount > 1.01 * gamma ** n).any() and np.isclose(discount, gamma ** n).any()


def test_sum_tree_finds_each_leaf_by_its_share_of_the_total():
    tree = SumTree(6)
    p = np.array([0.5, 0.0, 2.0, 1.0, 0.25, 3.0])
    tree.update(np.arange(6), p)
    assert tree.total == pytest.approx(p.sum())
    cumulative = np.concatenate([[0.0], np.cumsum(p)])
    prefixes = np.linspace(0, p.sum(), 1000, endpoint=False)
    want = np.searchsorted(cumulative, prefixes, side="right") - 1  # the leaf whose range holds the prefix
    assert np.array_equal(tree.find(prefixes), want)
    tree.update(np.array([2, 2]), np.array([9.0, 4.0]))  # a repeated index keeps its last value
    assert tree.total == pytest.approx(p.sum() - 2.0 + 4.0)


def test_prioritized_draws_proportionally_and_weights_by_the_max():
    streams = Streams(2, seed=0)
    buffer = PrioritizedReplayBuffer(1000, (1,), (), np.dtype(np.int64), device=CPU, alpha=0.6)
    buffer.add_rollout(streams.rollout(30))
    rows = np.arange(min(buffer.written, buffer.capacity))
    ok = rows[buffer.sampleable(rows)]
    # new transitions enter at the largest priority (1 at the start); the rest carry none
    assert np.all(buffer.tree.leaves(ok) == 1.0) and np.all(buffer.tree.leaves(rows[~buffer.sampleable(rows)]) == 0)
    td = np.random.default_rng(1).uniform(0, 3, len(ok))
    buffer.update_priorities(ok, td)
    want_p = (np.abs(td) + 1e-6) ** 0.6
    want_share = want_p / want_p.sum()
    np.random.seed(3)
    counts = np.zeros(rows.size)
    draws = 400
    for _ in range(draws):
        slots, weights = buffer.draw(32, beta=0.4)
        assert buffer.sampleable(slots).all()
        p = (np.abs(td) + 1e-6)[np.searchsorted(ok, slots)] ** 0.6
        w = (len(ok) * p / want_p.sum()) ** -0.4
        np.testing.assert_allclose(weights, w / w.max(), rtol=1e-5)
        np.add.at(counts, slots, 1)
    share = counts[ok] / counts.sum()
    assert np.abs(share - want_share).max() < 0.01  # 12800 stratified draws
    assert buffer.max_priority == pytest.approx(td.max() + 1e-6)
    buffer.add_rollout(streams.rollout(1))  # newcomers: the largest priority seen so far
    assert buffer.tree.leaves(np.array([buffer.written - 1]))[0] in (0.0, pytest.approx(buffer.max_priority ** 0.6))


def test_c51_projection_on_hand_made_atoms():
    support = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0])
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.25, 0.15], [0.0, 0.5, 0.0, 0.5, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])
    rewards = torch.tensor([0.5, 3.0, -0.25])
    discounts = torch.tensor([0.5, 0.9, 0.0])
    got = c51_projection(probs, rewards, discounts, support)

    def reference(p, r, d):
        out = [0.0] * 5
        for j in range(5):
            tz = min(max(r + d * (j - 2.0), -2.0), 2.0)
            b = tz + 2.0  # (tz - v_min) / dz with dz = 1
            lo, hi = math.floor(b), math.ceil(b)
            if lo == hi:
                out[lo] += p[j]
            else:
                out[lo] += p[j] * (hi - b)
                out[hi] += p[j] * (b - lo)
        return out

    for i in range(3):
        want = reference(probs[i].tolist(), float(rewards[i]), float(discounts[i]))
        np.testing.assert_allclose(got[i].numpy(), want, atol=1e-6)
    np.testing.assert_allclose(got.sum(1).numpy(), 1.0, atol=1e-6)
    # a terminal transition puts all the mass at r: -0.25 splits 1/4 to z=-1, 3/4 to z=0
    np.testing.assert_allclose(got[2].numpy(), [0, 0.25, 0.75, 0, 0], atol=1e-6)


def test_quantile_huber_loss_against_the_double_sum():
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(3, 4, generator=gen) * 2
    target = torch.randn(3, 6, generator=gen) * 2
    for kappa in (1.0, 0.5):
        got = quantile_huber_loss(theta, target, kappa=kappa)
        for b in range(3):
            total = 0.0
            for i in range(4):
                tau = (2 * i + 1) / 8
                for j in range(6):
                    u = float(target[b, j] - theta[b, i])
                    huber = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
                    total += abs(tau - (1.0 if u < 0 else 0.0)) * huber / kappa / 6
            assert float(got[b]) == pytest.approx(total, rel=1e-5)


def test_dueling_noisy_and_distributional_heads():
    settings = ModelSettings(hidden_sizes=(8,), activation="relu")
    x = torch.randn(5, 4)
    dueling = QPolicy(CARTPOLE, settings, QHeadOptions(dueling=True))
    h = dueling.q.encoder(x)
    v, a = dueling.q.head.value(h), dueling.q.head.advantage(h)
    torch.testing.assert_close(dueling(x), v + a - a.mean(1, keepdim=True))  # Wang et al. 2016, eq. 9
    c51 = QPolicy(CARTPOLE, settings, QHeadOptions(distributional="c51", atoms=5, v_min=-2, v_max=2))
    raw = c51.q.raw(x)
    assert raw.shape == (5, 2, 5)
    torch.testing.assert_close(c51(x), (raw.softmax(-1) * torch.linspace(-2, 2, 5)).sum(-1))
    qr = QPolicy(CARTPOLE, settings, QHeadOptions(distributional="qr", atoms=7))
    torch.testing.assert_close(qr(x), qr.q.raw(x).mean(-1))
    noisy = NoisyLinear(4, 3, sigma0=0.5)
    torch.manual_seed(0)
    assert not torch.equal(noisy(x), noisy(x))  # fresh factorised noise per forward while training
    noisy.eval()
    torch.testing.assert_close(noisy(x), x @ noisy.weight_mu.T + noisy.bias_mu)  # the mean weights in eval
    # dueling acts and learns through torch; QR-DQN's one-Linear head acts through the numpy actor (the mean
    # quantile) and learns through numpy (mlp_layers: the numpy TD step's), C51's learns there and acts in torch
    assert dueling.mlp_layers == [] and dueling.numpy_actor() is None and len(qr.mlp_layers) == 2
    assert len(c51.mlp_layers) == 2 and c51.numpy_actor() is None
    np.testing.assert_allclose(qr.numpy_actor().forward(x.numpy()), qr(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def vector_rollout(streams: Streams, T: int) -> Rollout:
    """T steps of ``streams`` with distinct 4-d observations (CartPole's shape) made from the ids and the action
    each id's parity."""
    r = streams.rollout(T)
    r.actions = (r.obs[..., 0] % 2).astype(np.int64)
    features = np.array([1.0, 2.1, 3.3, 4.7], np.float32)
    r.obs, r.next_obs = np.sin(r.obs * features), np.sin(r.next_obs * features)
    return r


@pytest.mark.parametrize("options", [dict(n_step=3), dict(prioritized=True), dict(dueling=True),
                                     dict(distributional="c51", n_atoms=11, v_min=-5.0, v_max=5.0, gamma=0.1),
                                     dict(distributional="qr", n_quantiles=16), dict(noisy=True)],
                         ids=["nstep", "per", "dueling", "c51", "qr", "noisy"])
def test_each_option_lowers_its_loss(options):
    """Repeated TD steps on one fixed batch fit it: the option's loss falls (a broken target or sign would not).
    Dueling and noisy heads take the torch path, the rest numpy's (checked against autograd below)."""
    torch.manual_seed(0)
    np.random.seed(0)
    settings = DQNSettings(learning_starts=0, batch_size=32, buffer_size=1000, lr=3e-3, **options)
    dqn = DQN(CARTPOLE, settings, num_envs=2, device=CPU, model=ModelSettings(hidden_sizes=(32,)))
    assert (dqn.numpy_step is None) == (settings.dueling or settings.noisy)
    dqn.buffer.add_rollout(vector_rollout(Streams(2, seed=1), 60))
    batch = dqn.sample(0.5)
    if settings.prioritized:
        assert batch.weights is not None and float(batch.weights.max()) == 1.0 and dqn.beta == pytest.approx(0.7)
    losses = [float(dqn.update(batch)[0]) for _ in range(120)]
    # (C51's cross-entropy cannot fall below the target distribution's entropy: a small gamma keeps it low)
    assert losses[-1] < 0.5 * losses[0]


PLANES = EnvSpec("Planes", (4, 4, 3), "discrete", (), n_actions=2, obs_dtype="bool")  # MinAtar's kind, smaller
BYTES = EnvSpec("Bytes", (3, 5), "discrete", (), n_actions=2, obs_dtype="uint8")  # FlatInput divides by 255


def box_rollout(streams: Streams, T: int, spec: EnvSpec) -> Rollout:
    """``vector_rollout``'s transitions with each id drawn as a ``spec``-shaped observation in its dtype (bool
    planes or bytes from a seeded table: one random, hence distinct, pattern per id)."""
    r = streams.rollout(T)
    r.actions = (r.obs[..., 0] % 2).astype(np.int64)
    shape = (streams.next_id + 1, *spec.obs_shape)
    rng = np.random.default_rng(7)
    table = rng.random(shape) < 0.5 if spec.obs_dtype == "bool" else rng.integers(0, 256, shape, np.uint8)
    r.obs, r.next_obs = table[r.obs[..., 0].astype(np.int64)], table[r.next_obs[..., 0].astype(np.int64)]
    return r


NUMPY_CASES = {
    "qr": dict(distributional="qr", n_quantiles=7),
    "qr_double_nstep_per": dict(distributional="qr", n_quantiles=7, double_dqn=True, n_step=3, prioritized=True),
    "qr_nstep": dict(distributional="qr", n_quantiles=5, n_step=2, max_grad_norm=None, model_activation="tanh"),
    "c51": dict(distributional="c51", n_atoms=11, v_min=-4.0, v_max=4.0),
    "c51_double_nstep_per": dict(distributional="c51", n_atoms=11, v_min=-4.0, v_max=4.0, double_dqn=True,
                                 n_step=3, prioritized=True, adam_eps=1.5e-4),
    "huber_nstep_per": dict(n_step=3, prioritized=True, double_dqn=True),
    # observations the MLP encoder flattens and casts (bool planes, uint8 scaled to [0, 1]) take the numpy step too
    "planes_huber": dict(spec=PLANES),
    "planes_qr_double_per": dict(spec=PLANES, distributional="qr", n_quantiles=7, double_dqn=True, prioritized=True),
    "planes_c51_nstep": dict(spec=PLANES, distributional="c51", n_atoms=11, v_min=-4.0, v_max=4.0, n_step=3),
    "bytes_qr": dict(spec=BYTES, distributional="qr", n_quantiles=5),
    "bytes_mse": dict(spec=BYTES, loss="mse"),
}


@pytest.mark.parametrize("case", NUMPY_CASES)
def test_numpy_td_step_is_autograds_with_each_option(case):
    """The numpy TD step (algos/td_numpy.py) against autograd's (numpy_update=false) on the same replay and the
    same batches, with QR-DQN's and C51's heads, n-step returns, prioritised replay and Double DQN: the same loss
    and mean Q, the same new priorities, then the same weights and Adam moments after several steps."""
    options = dict(NUMPY_CASES[case])
    activation, max_grad_norm = options.pop("model_activation", "relu"), options.pop("max_grad_norm", 0.5)
    spec = options.pop("spec", CARTPOLE)

    def make(numpy_update: bool) -> DQN:
        torch.manual_seed(0)
        settings = DQNSettings(numpy_update=numpy_update, learning_starts=0, batch_size=32, buffer_size=1000,
                               lr=3e-3, max_grad_norm=max_grad_norm, **options)
        dqn = DQN(spec, settings, num_envs=2, device=CPU,
                  model=ModelSettings(hidden_sizes=(16, 8), activation=activation, encoder="mlp"))
        streams = Streams(2, seed=1)
        rollout = vector_rollout(streams, 80) if spec is CARTPOLE else box_rollout(streams, 80, spec)
        rollout.rewards *= 3
        dqn.buffer.add_rollout(rollout)
        return dqn

    fast, slow = make(True), make(False)
    assert fast.numpy_step is not None and slow.numpy_step is None
    np.random.seed(0)
    for i in range(6):
        batch = fast.sample(0.1 * i)
        assert batch.obs.dtype == getattr(torch, spec.obs_dtype)  # stored as the env's: the step converts
        torch.testing.assert_close(fast.update(batch), slow.update(batch), rtol=1e-5, atol=1e-6)
        if batch.slots is not None:
            leaves = [dqn.buffer.tree.leaves(batch.slots) for dqn in (fast, slow)]
            np.testing.assert_allclose(*leaves, rtol=1e-5)
    for p, q in zip(fast.policy.parameters(), slow.policy.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    ours, theirs = fast.optimizer.state_dict()["state"], slow.optimizer.state_dict()["state"]
    assert ours.keys() == theirs.keys()
    for i in ours:
        for moment in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(ours[i][moment], theirs[i][moment], rtol=1e-4, atol=1e-8)


def test_numpy_td_step_takes_only_one_mlp():
    """Dueling streams, noisy layers, an image encoder or an action mask keep the autograd TD step."""
    for options in (dict(dueling=True), dict(noisy=True), dict(distributional="qr", dueling=True),
                    dict(distributional="c51", noisy=True)):
        assert DQN(CARTPOLE, DQNSettings(**options), num_envs=1, device=CPU).numpy_step is None, options
    pixels = EnvSpec("Pixels", (4, 84, 84), "discrete", (), n_actions=3, obs_dtype="uint8")
    assert DQN(pixels, DQNSettings(distributional="qr", buffer_size=100), num_envs=1, device=CPU).numpy_step is None
    assert DQN(CARTPOLE, DQNSettings(distributional="qr", numpy_update=False), num_envs=1,
               device=CPU).numpy_step is None


def test_numpy_path_takes_every_box_the_mlp_encoder_flattens():
    """The numpy TD step and epsilon-greedy actor take any Box or MultiBinary observation the MLP encoder
    flattens and casts (bool planes, uint8 bytes divided by 255, ints, a 3-D float box), with the torch policy's
    Q-values; one-hot inputs (Discrete) and a CNN over the same planes keep torch."""
    mlp = ModelSettings(hidden_sizes=(16,), encoder="mlp")
    bits = ObsSpace("multi_binary", (6,), "int8")
    specs = [PLANES, BYTES, EnvSpec("Ints", (2, 3), "discrete", (), n_actions=3, obs_dtype="int64"),
             EnvSpec("Floats", (2, 3, 4), "discrete", (), n_actions=3),
             EnvSpec("Bits", (6,), "discrete", (), n_actions=2, obs_dtype="int8", obs_space=bits)]
    rng = np.random.default_rng(0)
    for spec in specs:
        shape, dtype = (50, *spec.obs_shape), spec.obs_dtype
        obs = rng.random(shape) < 0.5 if dtype == "bool" else rng.normal(size=shape).astype(dtype) \
            if dtype == "float32" else rng.integers(0, 2 if dtype == "int8" else 256, shape).astype(dtype)
        for head in ("none", "qr", "c51"):
            torch.manual_seed(0)
            dqn = DQN(spec, DQNSettings(distributional=head, n_quantiles=7, buffer_size=100), num_envs=1,
                      device=CPU, model=mlp)
            assert dqn.numpy_step is not None, (spec.env_id, head)
            np.testing.assert_array_equal(flat_float32(obs), to_float(torch.from_numpy(obs).flatten(1)).numpy())
            if head == "c51":  # C51's Q is an expectation over atoms: it learns in numpy and acts in torch
                assert dqn.policy.numpy_actor() is None
                continue
            dqn.policy.epsilon.fill_(0.0)
            with torch.no_grad():
                q = dqn.policy(torch.from_numpy(obs)).numpy()
            # float32 sums of products in another order (numpy's and torch's BLAS calls): the round-off scales with
            # the largest terms (int inputs up to 255 give Q-values near 100), not with each entry
            np.testing.assert_allclose(dqn.policy.numpy_actor().forward(obs), q, rtol=1e-5,
                                       atol=1e-6 * max(1.0, float(np.abs(q).max())))
    every_byte = np.arange(256, dtype=np.uint8).reshape(2, 8, 16)
    assert np.array_equal(flat_float32(every_byte), to_float(torch.from_numpy(every_byte)).flatten(1).numpy())
    cnn = DQN(PLANES, DQNSettings(distributional="qr", buffer_size=100), num_envs=1, device=CPU)  # auto: MinAtar's
    assert cnn.numpy_step is None and cnn.policy.numpy_actor() is None
    cells = EnvSpec("Cells", (), "discrete", (), n_actions=2, obs_dtype="int64",
                    obs_space=ObsSpace("discrete", (), "int64", n=5))
    assert DQN(cells, DQNSettings(buffer_size=100), num_envs=1, device=CPU, model=mlp).numpy_step is None


def test_rainbow_defaults_are_hessel_et_al_and_options_are_checked():
    s = RainbowSettings()
    assert (s.n_step, s.prioritized, s.priority_alpha, s.dueling, s.distributional, s.n_atoms, s.noisy,
            s.double_dqn, s.lr, s.adam_eps) == (3, True, 0.5, True, "c51", 51, True, True, 6.25e-5, 1.5e-4)
    assert Rainbow.name == "rainbow"
    with pytest.raises(ConfigError, match="algo.distributional=quantile"):
        DQNSettings(distributional="quantile")
    with pytest.raises(ConfigError, match="v_min"):
        DQNSettings(distributional="c51", v_min=1.0, v_max=1.0)
    with pytest.raises(ConfigError, match="algo.n_step"):
        DQNSettings(n_step=0)


BASE = ["debug=smoke", "logger=quiet", "experiment=none", "eval.every_env_steps=1024", "algo.learning_starts=256",
        "algo.buffer_size=4000", "algo.target_network_frequency=256", "checkpoint.replay_buffer=true"]
# beta's annealing reads the budget, which the halves below change (as the existing resume test pins PPO's LR
# annealing): held at its end value 1 here
RESUME = {"nstep_per": ["algo=dqn", "algo.n_step=3", "algo.prioritized=true", "algo.priority_beta0=1.0"],
          "dueling_qr": ["algo=dqn", "algo.dueling=true", "algo.distributional=qr", "algo.n_quantiles=8"],
          "rainbow": ["algo=rainbow", "algo.v_min=0", "algo.v_max=100", "algo.priority_beta0=1.0"]}


@pytest.mark.parametrize("case", RESUME)
def test_resume_is_bitwise_identical_with_each_option(tmp_path, case):
    """Replay (PER's tree included; n-step needs nothing pending: it reads the buffer), noise, counters: a run
    stopped halfway and resumed ends with the uninterrupted run's weights, metrics and evaluation; its
    checkpoint loads as a greedy policy (load_policy) acting on the mean Q."""
    extra, n = BASE + RESUME[case], 1024
    run(compose_cfg(extra + [f"total_env_steps={2 * n}"]), tmp_path / "once")
    run(compose_cfg(extra + [f"total_env_steps={n}"]), tmp_path / "twice")
    run(compose_cfg(extra + [f"total_env_steps={2 * n}", "resume=auto"]), tmp_path / "twice")
    once, _ = load_checkpoint(tmp_path / "once" / "checkpoints" / "final.pt")
    twice, _ = load_checkpoint(tmp_path / "twice" / "checkpoints" / "final.pt")
    for part in ("policy", "target", "optimizer"):
        a, b = once["algo"][part], twice["algo"][part]
        flat_a = [v for v in torch.utils._pytree.tree_leaves(a) if isinstance(v, torch.Tensor)]
        flat_b = [v for v in torch.utils._pytree.tree_leaves(b) if isinstance(v, torch.Tensor)]
        assert len(flat_a) == len(flat_b) and all(torch.equal(x, y) for x, y in zip(flat_a, flat_b, strict=True)), part
    if "priorities" in once["algo"]["replay_buffer"]:
        assert torch.equal(once["algo"]["replay_buffer"]["priorities"], twice["algo"]["replay_buffer"]["priorities"])
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(WALL_CLOCK_PREFIX)} for r in rows]  # noqa: E731
    a, b = (strip(read_metrics(tmp_path / d / "metrics.csv")) for d in ("once", "twice"))
    assert a[-2] == b[-2] and "loss/q" in a[-2]
    policy = rltrain.load_policy(tmp_path / "once")
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    actions, _ = policy.act(obs, deterministic=True)
    net = policy.module.q if hasattr(policy.module, "q") else None
    if net is not None:
        with torch.no_grad():
            assert np.array_equal(actions, net(torch.from_numpy(obs)).argmax(-1).numpy())


# Rainbow (n-step, PER, dueling, noisy, C51 at once) on its CartPole preset and QR-DQN on dqn_cartpole's schedule
# (25 quantiles: sb3-contrib's 200 cost 8x the loss for the same test), cut short: the mean of the last 20
# training episodes reaches 200 (random: ~22) and the greedy policy on the mean Q holds it.
LEARNS = [("rainbow", ["experiment=rainbow_cartpole"], 25_000),
          ("qrdqn", ["experiment=dqn_cartpole", "algo.distributional=qr", "algo.n_quantiles=25"], 35_000)]


@pytest.mark.learning
@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "budget"), [case[1:] for case in LEARNS], ids=[case[0] for case in LEARNS])
def test_rainbow_and_qrdqn_learn_cartpole(tmp_path, overrides, budget):
    summary = run(compose_cfg([*overrides, "logger=quiet", "seed=1", f"total_env_steps={budget}", "target_return=200",
                               "eval.every_env_steps=0", "checkpoint.every_env_steps=0"]), tmp_path)
    assert summary["status"] == "completed" and summary["solved_at_env_steps"] is not None, summary
    assert summary["final_eval_return"] > 100, summary


def test_c51_says_once_when_its_values_are_pinned_at_an_end_of_its_support(tmp_path, caplog):
    """CartPole pays 1 a step: with the support cut to [-1, 1] the values pile at v_max within the first
    updates, and the run says so once, naming the keys and this task's bound (1 / (1 - 0.99) = 100); with room
    ([-1, 200]) it says nothing."""
    base = ["algo=dqn", "env=cartpole", "algo.distributional=c51", "total_env_steps=3000", "algo.learning_starts=500",
            "eval.every_env_steps=0", "eval.episodes=1", "checkpoint.every_env_steps=0", "logger=quiet",
            "model.hidden_sizes=[16]"]
    with caplog.at_level("WARNING", logger="rltrain.algos.dqn"):
        run(compose_cfg([*base, "algo.v_min=-1", "algo.v_max=1"]), tmp_path / "pinned")
    said = [r.getMessage() for r in caplog.records if "support's end" in r.getMessage()]
    assert len(said) == 1 and "algo.v_max=1" in said[0] and "+-100 here" in said[0], said
    caplog.clear()
    with caplog.at_level("WARNING", logger="rltrain.algos.dqn"):
        run(compose_cfg([*base, "algo.v_min=-1", "algo.v_max=200"]), tmp_path / "room")
    assert not [r for r in caplog.records if "support's end" in r.getMessage()]
