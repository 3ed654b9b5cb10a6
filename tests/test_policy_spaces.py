"""A checkpoint records the spaces its policy acts on (``PolicySpaces``, data/structs.py) as plain containers:
every observation and action space kind rltrain takes survives ``torch.save`` / ``torch.load(weights_only=True)``
unchanged (frame stacks, action masks and a recurrent state shape included), and a malformed record is refused."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rltrain.data.structs import ACTION_KINDS, OBS_KINDS, EnvSpec, PolicySpaces
from rltrain.envs.make import env_spec
from rltrain.envs.spaces import ActionMaskObservation, TupleAsDict


class SpacesEnv(gym.Env):
    """An env that is only its spaces (and a mask, for ``ActionMaskObservation``)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space):
        self.observation_space, self.action_space = observation_space, action_space

    def action_masks(self) -> np.ndarray:
        return np.ones(int(self.action_space.n), np.int8)


def _env(obs: gym.Space, act: gym.Space = spaces.Discrete(3)) -> gym.Env:
    return SpacesEnv(obs, act)


CASES = {
    "box-float-discrete": lambda: _env(spaces.Box(-1.0, 1.0, (3,), np.float32)),
    "image-frame-stack": lambda: gym.wrappers.FrameStackObservation(
        _env(spaces.Box(0, 255, (12, 12), np.uint8)), 4),
    "grid-cells": lambda: _env(spaces.Box(0, 10, (7, 7, 3), np.uint8)),
    "discrete-start-box-unbounded": lambda: _env(spaces.Discrete(5, start=2),
                                                 spaces.Box(-np.inf, np.inf, (2,), np.float32)),
    "multibinary-multidiscrete-start": lambda: _env(spaces.MultiBinary(6),
                                                    spaces.MultiDiscrete([3, 4], start=[-1, 5])),
    "multidiscrete-multibinary": lambda: _env(spaces.MultiDiscrete([2, 3]), spaces.MultiBinary((2, 3))),
    "nested-dict-with-text": lambda: _env(spaces.Dict({
        "image": spaces.Box(0, 255, (8, 8, 3), np.uint8), "pos": spaces.Discrete(4),
        "inner": spaces.Dict({"v": spaces.Box(-2.0, 2.0, (2,), np.float64)}), "note": spaces.Text(5)})),
    "tuple": lambda: TupleAsDict(_env(spaces.Tuple((spaces.Discrete(32), spaces.Discrete(11), spaces.Discrete(2))))),
    "action-mask": lambda: ActionMaskObservation(_env(spaces.Box(0.0, 1.0, (6,), np.float32), spaces.Discrete(6)),
                                                 "method"),
}
LSTM_STATE = ((1, 1, 16), (1, 1, 16))


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_space_kind_survives_a_weights_only_checkpoint(case, tmp_path):
    spec = env_spec(CASES[case](), case)
    recorded = PolicySpaces(spec, "method" if spec.masked else "off", LSTM_STATE if "image" in case else None)
    torch.save({"meta": {"spaces": recorded.to_record()}}, tmp_path / "ckpt.pt")
    back = PolicySpaces.from_record(torch.load(tmp_path / "ckpt.pt", weights_only=True)["meta"]["spaces"])
    assert back == recorded


def test_the_cases_cover_every_kind_rltrain_takes():
    specs = [env_spec(make(), name) for name, make in CASES.items()]

    def kinds(space):
        return {space.kind} | {k for _, part in space.parts for k in kinds(part)}

    assert set().union(*(kinds(s.observation) for s in specs)) == set(OBS_KINDS)
    assert {s.action_kind for s in specs} == set(ACTION_KINDS)
    assert any(s.frame_stack for s in specs) and any(s.masked for s in specs)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r["env"].update(action_kind="teleport"), "action kind 'teleport'"),
    (lambda r: r["env"]["obs_space"].update(kind="smell"), "observation kind 'smell'"),
    (lambda r: r["env"].update(obs_shape="big"), "obs_shape is 'big', not list"),
    (lambda r: r["env"]["obs_space"].update(parts=[["a"]]), "parts is not a list of"),
    (lambda r: r.update(core_state=[[1, "x"]]), "core_state is 'x', not int"),
    (lambda r: r["env"].pop("n_actions"), "no 'n_actions'"),
])
def test_a_malformed_record_is_a_value_error_naming_what(edit, message):
    record = PolicySpaces(EnvSpec("t", (3,), "discrete", (), n_actions=2)).to_record()
    record["env"]["obs_space"] = PolicySpaces(env_spec(CASES["box-float-discrete"](), "t")).spec.obs_space.to_record()
    edit(record)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        PolicySpaces.from_record(record)
