"""Every YAML in every config group composes (globbed: new files are covered without edits)."""

from __future__ import annotations

import pytest

from rltrain.cli.build import check_kwargs, hparams, resolve_target, validate
from tests.conftest import CONF_DIR, compose_cfg

GROUPS = sorted(p for p in CONF_DIR.iterdir() if p.is_dir() and not p.name.startswith(("_", "hydra")))
OPTIONS = [(g.name, f.stem) for g in GROUPS for f in sorted(g.glob("*.yaml"))]


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes(group, option):
    from omegaconf import OmegaConf

    if group == "experiment":
        cfg = compose_cfg([f"+experiment={option}"] if False else [f"experiment={option}"])
    else:
        cfg = compose_cfg([f"{group}={option}"])
    plain = OmegaConf.to_container(cfg, resolve=True)
    validate(plain)
    for node in ("algo", "trainer"):
        cls = resolve_target(plain[node], node)
        check_kwargs(cls, hparams(plain[node]), node)


def test_defaults_are_ppo_cartpole_sequential():
    cfg = compose_cfg()
    assert cfg.algo._target_.endswith("PPO")
    assert cfg.trainer._target_.endswith("SequentialTrainer")
    assert cfg.env.id == "CartPole-v1"
    assert cfg.hydra.job.chdir is False if "hydra" in cfg else True
