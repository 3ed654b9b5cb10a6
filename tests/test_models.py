"""The model family: encoder chosen by observation space, heads, the assembled actor-critic and Q-network.

Real envs throughout (Gymnasium's FrozenLake and CartPole, MinAtar Breakout, and the random-observation
envs of ``tests/helpers/obs_envs.py``), built through ``rltrain.envs.make`` as a run builds them.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import torch

from rltrain.data.structs import EnvSpec
from rltrain.envs.make import env_spec, make_env
from rltrain.errors import ConfigError
from rltrain.models.actor_critic import ActorCritic, EncoderTorso, TwinMLPTorso
from rltrain.models.encoders import (
    FlatInput,
    ImpalaCNN,
    MinAtarCNN,
    MLPEncoder,
    MultiInputEncoder,
    NatureCNN,
    has_image,
)
from rltrain.models.factory import ModelSettings, build
from rltrain.models.q_networks import QNetwork

torch.set_num_threads(1)
HELPERS = "tests.helpers.obs_envs"


def make_actor_critic(spec: EnvSpec, settings: ModelSettings, **options) -> ActorCritic:
    return build(spec, settings, "actor_critic", **options)


def make_q_network(spec: EnvSpec, settings: ModelSettings) -> QNetwork:
    return build(spec, settings, "q").q


def spec_of(env_id: str, **kwargs) -> tuple[EnvSpec, object]:
    env = make_env(env_id, kwargs)
    return env_spec(env, env_id), env


def image_spec(shape=(84, 84, 4), dtype="uint8", continuous=False) -> tuple[EnvSpec, object]:
    return spec_of(f"{HELPERS}:ImageEnv", shape=shape, dtype=dtype, continuous=continuous)


def batch(env, n: int = 5, seed: int = 0):
    """n observations of a real env, stacked in their stored dtype: [n, *shape] or a dict of them."""
    obs, _ = env.reset(seed=seed)
    rows = [obs]
    for _ in range(n - 1):
        obs, *_ = env.step(env.action_space.sample())
        rows.append(obs)
    if isinstance(rows[0], dict):  # a Text entry stays a list of strings (no tensor holds it)
        return {k: [r[k] for r in rows] if isinstance(rows[0][k], str) else
                torch.from_numpy(np.stack([np.asarray(r[k]) for r in rows])) for k in rows[0]}
    return torch.from_numpy(np.stack([np.asarray(r) for r in rows]))


# ---- EnvSpec: the observation space, described and picklable ----

def test_env_spec_describes_discrete_dict_and_image_spaces():
    spec, _ = spec_of("FrozenLake-v1")
    assert (spec.observation.kind, spec.observation.n, spec.obs_shape, spec.obs_dtype) == ("discrete", 16, (), "int64")
    spec, _ = spec_of(f"{HELPERS}:DictEnv", text=True)
    kinds = {k: (p.kind, p.shape, p.dtype) for k, p in spec.observation.parts}
    assert kinds == {"pixels": ("box", (12, 12, 3), "uint8"), "state": ("box", (5,), "float32"),
                     "mode": ("discrete", (), "int64"), "flags": ("multi_binary", (4,), "int8"),
                     "mission": ("unsupported", (), "")}
    assert pickle.loads(pickle.dumps(spec)) == spec  # EnvSpec travels to actor processes
    spec, _ = spec_of("CartPole-v1")
    assert (spec.obs_shape, spec.obs_dtype, spec.observation.kind) == ((4,), "float32", "box")
    # an EnvSpec built without obs_space (older code) still describes a float Box
    assert EnvSpec("x", (3,), "discrete", (), n_actions=2).observation.shape == (3,)


def test_env_spec_refuses_an_unreadable_observation_space_in_one_line():
    with pytest.raises(ConfigError, match=r"observation space Text is not supported") as err:
        spec_of(f"{HELPERS}:TextEnv")
    assert "\n" not in str(err.value)


# ---- encoder selection by observation space ----

@pytest.mark.parametrize(("shape", "dtype", "cls", "hwc"), [
    ((84, 84, 4), "uint8", NatureCNN, True),
    ((4, 84, 84), "uint8", NatureCNN, False),
    ((3, 64, 64), "float32", NatureCNN, False),
    ((10, 10, 4), "bool", MinAtarCNN, True),
    ((6, 20, 20), "uint8", MinAtarCNN, False),
])
def test_auto_picks_a_cnn_by_layout_and_frame_size(shape, dtype, cls, hwc):
    spec, env = image_spec(shape, dtype)
    model = make_actor_critic(spec, ModelSettings())
    assert type(model.torso.actor_encoder) is cls and model.torso.actor_encoder.hwc is hwc
    assert not model.obs_norm.enabled
    logits, value = model(batch(env))
    assert logits.shape == (5, 3) and value.shape == (5,)
    assert model.torso.actor_encoder.out_dim == cls.default_features


@pytest.mark.parametrize("encoder", ["nature", "impala", "minatar"])
def test_hwc_and_chw_frames_read_the_same_with_the_same_weights(encoder):
    hwc_spec, env = image_spec((40, 40, 3), "uint8")
    chw_spec, _ = image_spec((3, 40, 40), "uint8")
    hwc = make_q_network(hwc_spec, ModelSettings(encoder=encoder))
    chw = make_q_network(chw_spec, ModelSettings(encoder=encoder))
    chw.load_state_dict(hwc.state_dict())
    frames = batch(env)
    with torch.no_grad():
        torch.testing.assert_close(hwc(frames), chw(frames.permute(0, 3, 1, 2)))


def test_vector_discrete_and_named_cnn_encoders():
    spec, env = spec_of("CartPole-v1")
    model = make_actor_critic(spec, ModelSettings(hidden_sizes=(32,), activation="relu", shared=True))
    assert type(model.torso.actor_encoder) is MLPEncoder and model.torso.actor_encoder.out_dim == 32
    spec, env = spec_of("FrozenLake-v1")  # Discrete observations are one-hot
    model = make_actor_critic(spec, ModelSettings())
    assert model.torso.actor_encoder.inp.out_dim == 16 and model(batch(env))[0].shape == (5, 4)
    spec, env = image_spec((64, 64, 3))
    model = make_actor_critic(spec, ModelSettings(encoder="impala", cnn_features=100))
    assert type(model.torso.actor_encoder) is ImpalaCNN and model(batch(env))[0].shape == (5, 3)
    assert model.torso.actor_encoder.out_dim == 100


def test_real_minatar_space_gets_the_minatar_cnn():
    spec, env = spec_of("minatar.gym:BaseEnv", game="breakout")
    assert (spec.obs_shape, spec.obs_dtype) == ((10, 10, 4), "bool")
    net = make_q_network(spec, ModelSettings())
    assert type(net.encoder) is MinAtarCNN
    assert net(batch(env)).shape == (5, spec.n_actions)


def test_dict_observation_one_encoder_per_key_concatenated():
    spec, env = spec_of(f"{HELPERS}:DictEnv", image_shape=(40, 40, 3))
    model = make_actor_critic(spec, ModelSettings(hidden_sizes=(48,)))
    enc = model.torso.actor_encoder
    assert isinstance(enc, MultiInputEncoder) and enc.keys == ("flags", "mode", "pixels", "state")
    assert [type(p) for p in enc.parts] == [FlatInput, FlatInput, NatureCNN, FlatInput]
    assert enc.mlp[0].in_features == 4 + 3 + 512 + 5 and enc.out_dim == 48
    obs = batch(env)
    logits, value = model(obs)
    assert logits.shape == (5, 3) and value.shape == (5,)
    # the Discrete(3, start=-1) key: values -1, 0, 1 -> one-hot columns 0, 1, 2
    assert obs["mode"].min() >= -1 and obs["mode"].max() <= 1
    mode = enc.parts[enc.keys.index("mode")].encode(torch.tensor([-1, 0, 1]))
    assert torch.equal(mode, torch.eye(3))


def test_text_key_is_refused_naming_the_key_or_dropped_with_ignore_keys():
    spec, env = spec_of(f"{HELPERS}:DictEnv", text=True)
    with pytest.raises(ConfigError) as err:
        make_actor_critic(spec, ModelSettings())
    assert str(err.value) == ("model: observation key 'mission' is Text, which no encoder reads; drop it with "
                              "model.ignore_keys=[mission], or wrap the env so that it becomes a Box (e.g. "
                              "env.wrappers=[FlattenObservation] flattens a whole space of fixed size)")
    model = make_actor_critic(spec, ModelSettings(ignore_keys=["mission"]))
    assert "mission" not in model.torso.actor_encoder.keys
    assert model(batch(env))[0].shape == (5, 3)  # the Text entry in the batch is simply not read
    with pytest.raises(ConfigError, match=r"model.ignore_keys: 'misson' is not an observation key; did you mean "
                                          r"'mission'\?"):
        make_actor_critic(spec, ModelSettings(ignore_keys=["misson"]))
    with pytest.raises(ConfigError, match=r"drops every observation key \(flags, mission, mode, pixels, state\)"):
        make_actor_critic(spec, ModelSettings(ignore_keys=["pixels", "state", "mode", "flags", "mission"]))
    spec, _ = spec_of("CartPole-v1")
    with pytest.raises(ConfigError, match=r"model.ignore_keys=\['x'\]: the observation space .* is not a Dict"):
        make_actor_critic(spec, ModelSettings(ignore_keys=["x"]))


# ---- dtype handling ----

def test_uint8_frames_are_scaled_on_the_device_like_float_frames():
    spec, env = image_spec((84, 84, 4), "uint8")
    model = make_actor_critic(spec, ModelSettings())
    obs = batch(env)
    assert obs.dtype == torch.uint8
    with torch.no_grad():
        a, b = model(obs), model(obs.float() / 255.0)
    torch.testing.assert_close(a, b)
    spec, env = image_spec((10, 10, 4), "bool")
    model = make_actor_critic(spec, ModelSettings())
    obs = batch(env)
    with torch.no_grad():
        torch.testing.assert_close(model(obs), model(obs.float()))


# ---- bad input: one line each ----

def test_cnn_too_big_for_the_frames_names_shapes_and_the_encoder_that_fits():
    spec, _ = image_spec((10, 10, 4), "uint8")
    with pytest.raises(ConfigError) as err:
        make_actor_critic(spec, ModelSettings(encoder="nature"))
    assert str(err.value) == ("model.encoder=nature needs frames >= 36x36; got 10x10x4 uint8: "
                              "use model.encoder=minatar")
    spec, _ = spec_of("CartPole-v1")
    with pytest.raises(ConfigError, match=r"model.encoder=impala needs image observations .* use model.encoder=mlp"):
        make_actor_critic(spec, ModelSettings(encoder="impala"))


def test_mlp_on_large_frames_warns_once_with_the_parameter_count():
    spec, _ = image_spec((84, 84, 4), "uint8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = make_actor_critic(spec, ModelSettings(encoder="mlp", hidden_sizes=(64,)))
    assert type(model.torso.actor_encoder) is MLPEncoder
    msgs = [str(w.message) for w in caught]
    assert msgs == ["model.encoder=mlp on 84x84x4 uint8 frames: its first layer alone has 1,806,400 parameters; "
                    "model.encoder=auto would use a CNN"]
    assert model.torso.actor_encoder.mlp[0].weight.numel() + 64 == 1_806_400


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"encoder": "resnet"}, "model.encoder=resnet: unknown (valid: auto, mlp, nature, impala, minatar, grid)"),
    ({"encoder": "natur"}, "model.encoder=natur: unknown; did you mean 'nature', 'minatar'? (valid: auto, mlp, nature, "
                           "impala, minatar, grid)"),
    ({"shared": "yes"}, "model.shared='yes': true, false or auto"),
    ({"core": "lstn"}, "model.core=lstn: unknown; did you mean 'lstm'? (valid: identity, lstm, gru)"),
    ({"activation": "gelu"},
     "model.activation=gelu: unknown; did you mean 'elu', 'relu'? (valid: tanh, relu, elu, silu)"),
    ({"hidden_sizes": [64, 0]}, "model.hidden_sizes=[64, 0]: every width must be a positive integer "
                                "(e.g. model.hidden_sizes=[64,64])"),
])
def test_bad_settings_are_one_line(kwargs, message):
    with pytest.raises(ConfigError) as err:
        ModelSettings(**kwargs)
    assert str(err.value) == message


def test_settings_are_frozen_keyword_only_and_norm_obs_is_for_float_vectors():
    with pytest.raises(TypeError):
        ModelSettings("mlp")  # type: ignore[misc]
    settings = ModelSettings(hidden_sizes=[8, 8], ignore_keys=["a"])
    assert settings.hidden_sizes == (8, 8) and settings.ignore_keys == ("a",)
    with pytest.raises(AttributeError):
        settings.encoder = "mlp"  # type: ignore[misc]
    spec, _ = image_spec((84, 84, 4))
    with pytest.raises(ConfigError, match=r"algo.norm_obs=true normalises float vector observations only"):
        make_actor_critic(spec, ModelSettings(), norm_obs=True)
    spec, _ = spec_of("CartPole-v1")
    assert make_actor_critic(spec, ModelSettings(), norm_obs=True).obs_norm.enabled


def test_the_model_group_composes_and_builds_typed_settings():
    from omegaconf import OmegaConf

    from rltrain.cli.build import check_node, model_settings
    from tests.conftest import compose_cfg

    cfg = OmegaConf.to_container(compose_cfg(["model.encoder=minatar"]), resolve=True)
    # algo=ppo brings its published MLP (PPO.mlp) into the model group
    assert model_settings(cfg) == ModelSettings(encoder="minatar", hidden_sizes=(64, 64), activation="tanh")
    cls = ModelSettings
    with pytest.raises(ConfigError, match=r"model.core_size='big' has the wrong type: expected int"):
        check_node(cls, {"core_size": "big"}, "model")


# ---- the assembled modules ----

CASES = {
    "vector-discrete": ("CartPole-v1", {}, {}),
    "vector-box-shared": ("Pendulum-v1", {}, {"shared": True, "hidden_sizes": (16, 16)}),
    "image-box-shared": (f"{HELPERS}:ImageEnv", {"shape": (40, 40, 3), "continuous": True}, {"shared": True}),
    "image-impala": (f"{HELPERS}:ImageEnv", {"shape": (3, 16, 16)}, {"encoder": "impala"}),
    "dict-box": (f"{HELPERS}:DictEnv", {"continuous": True, "image_shape": (40, 40, 3)}, {}),
    "discrete-obs": ("FrozenLake-v1", {}, {"shared": True}),
}


def build_case(case: str, seed: int = 0) -> tuple[ActorCritic, object]:
    env_id, env_kwargs, model_kwargs = CASES[case]
    spec, env = spec_of(env_id, **env_kwargs)
    torch.manual_seed(seed)
    return make_actor_critic(spec, ModelSettings(**model_kwargs), init_log_std=-0.5), env


def test_float_vectors_with_separate_mlps_get_the_twin_mlp_actor_critic_with_the_same_maths():
    spec, env = spec_of("Pendulum-v1")
    settings = ModelSettings(hidden_sizes=(8, 8))
    twin = make_actor_critic(spec, settings, init_log_std=-0.3)
    assert type(twin.torso) is TwinMLPTorso  # PPO's numpy backend runs this execution
    modular = ActorCritic(spec, settings.with_mlp((64, 64), "tanh"), init_log_std=-0.3, torso=EncoderTorso)
    # the TwinMLP stacks [actor, critic] weights as [2, in, out]; copy them into the two Linear stacks
    with torch.no_grad():
        torso = modular.torso
        for k, (encoder, head) in enumerate([(torso.actor_encoder, torso.actor_out),
                                             (torso.critic_encoder, torso.critic_head.linear)]):
            linears = [m for m in encoder.mlp if isinstance(m, torch.nn.Linear)] + [head]
            for layer, w, b in zip(linears, twin.torso.nets.weights, twin.torso.nets.biases, strict=True):
                layer.weight.copy_(w[k, :, :layer.out_features].t())
                layer.bias.copy_(b[k, 0, :layer.out_features])
        obs = batch(env)
        for a, b in zip(twin(obs), modular(obs), strict=True):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(twin.dist.log_std, modular.dist.log_std)


@pytest.mark.parametrize("case", list(CASES))
def test_act_log_prob_matches_evaluate(case):
    model, env = build_case(case)
    obs = batch(env, 6)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        out = model.act(obs, generator=gen)
        logp, entropy, value = model.evaluate(obs, out.action)
    torch.testing.assert_close(out.log_prob, logp)
    assert entropy.shape == value.shape == (6,)
    discrete, act_dim = model.spec.action_kind == "discrete", model.dist.param_dim
    assert out.action.shape == ((6,) if discrete else (6, act_dim))
    if not discrete:
        assert model.dist.log_std.shape == (act_dim,) and model.dist.log_std.detach()[0].item() == -0.5
        det = model.act(obs, deterministic=True).action
        torch.testing.assert_close(det, model(obs)[0])
    torch.testing.assert_close(model.value(obs), value)


@pytest.mark.parametrize("case", list(CASES))
def test_gradient_reaches_every_parameter(case):
    model, env = build_case(case)
    obs = batch(env, 6)
    logp, entropy, value = model.evaluate(obs, model.act(obs).action.detach())
    (logp.sum() + entropy.sum() + value.sum()).backward()
    dead = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert dead == []
    if isinstance(model.torso, EncoderTorso):
        # model.shared=auto (the default): one torso for images and Dicts holding one, two otherwise
        shared = CASES[case][2].get("shared", "auto")
        expected = has_image(model.spec.observation) if shared == "auto" else shared
        assert (model.torso.critic_encoder is None) == expected


def test_q_network_gradients_and_refusal_for_box_actions():
    spec, env = spec_of(f"{HELPERS}:DictEnv", image_shape=(12, 12, 3))
    net = make_q_network(spec, ModelSettings(encoder="minatar"))
    assert isinstance(net, QNetwork) and net(batch(env)).shape == (5, 3)
    net(batch(env)).max(1).values.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())
    spec, _ = spec_of("Pendulum-v1")
    with pytest.raises(ConfigError, match=r"a Q-network needs Discrete actions; env.id=Pendulum-v1 has Box"):
        make_q_network(spec, ModelSettings())


@pytest.mark.parametrize("case", ["image-box-shared", "dict-box", "vector-discrete"])
def test_checkpoint_round_trip_gives_identical_outputs(case, tmp_path):
    model, env = build_case(case, seed=0)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    fresh, _ = build_case(case, seed=1)
    obs = batch(env)
    with torch.no_grad():
        assert not torch.equal(fresh(obs)[1], model(obs)[1])
        fresh.load_state_dict(torch.load(path, weights_only=True))
        for a, b in zip(fresh(obs), model(obs), strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("activation", ["relu", "tanh", "elu", "silu"])
def test_mlp_forward_and_gradients_are_bit_for_bit_the_layers_own(activation):
    # MLP runs F.linear and the activation itself (ReLU / tanh in place on the Linear's output): the values and
    # every gradient must be exactly those of nn.Sequential calling each layer, and the input is left untouched
    from torch import nn

    from rltrain.models.layers import mlp

    torch.manual_seed(0)
    net = mlp(5, (16, 16), 3, activation=activation)
    x = torch.randn(8, 5, requires_grad=True)
    kept = x.detach().clone()
    ours = net(x)
    ours.square().sum().backward()
    grads = [p.grad.clone() for p in net.parameters()] + [x.grad.clone()]
    net.zero_grad()
    x.grad = None
    theirs = nn.Sequential.forward(net, x)
    theirs.square().sum().backward()
    assert torch.equal(ours, theirs) and torch.equal(x.detach(), kept)
    assert all(torch.equal(a, b) for a, b in zip(grads, [*(p.grad for p in net.parameters()), x.grad], strict=True))
    with torch.inference_mode():
        assert torch.equal(net(x.detach()), theirs.detach())
