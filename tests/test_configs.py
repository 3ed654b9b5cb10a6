"""One schema: every default is written on a settings dataclass, Hydra composes the nodes generated from them
(cli/schema.py), the YAML under conf/ selects groups and holds presets only, and every group option composes
and agrees with its dataclass (options are globbed and discovered: new ones are covered without edits)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest
import yaml

from rltrain.cli import schema
from rltrain.cli.build import check_config, config_fields, validate
from rltrain.envs.make import EnvFactory
from rltrain.models.settings import ModelSettings
from rltrain.trainers.settings import LoggerSettings, RunSettings
from tests.conftest import CONF_DIR, compose_cfg

FILE_GROUPS = sorted(p for p in CONF_DIR.iterdir() if p.is_dir() and not p.name.startswith(("_", "hydra")))
OPTIONS = [(g.name, f.stem) for g in FILE_GROUPS for f in sorted(g.glob("*.yaml"))]
OPTIONS += [(group, name) for group, layer in (("algo", "algos"), ("trainer", "trainers"))
            for name in schema.options(layer)]


def plain(overrides: list[str]) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose_cfg(overrides), resolve=True)


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_validates(group, option):
    cfg = plain([f"{group}={option}"] + (["experiment=none"] if group != "experiment" else []))
    validate(cfg)  # keys and types against the dataclasses, then every value (the trainer's included)


def imported_defaults(cls: type) -> dict:
    """A settings dataclass's config keys with their defaults, from the imported class (``???``: none)."""
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("internal"):
            continue
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = schema.MISSING
            hint = config_fields(cls)[f.name]
            if dataclasses.is_dataclass(hint):
                value = imported_defaults(hint)
        if dataclasses.is_dataclass(value):
            value = imported_defaults(type(value))
        out[f.name] = [*value] if isinstance(value, tuple) else value
    return out


def _class(target: str) -> type:
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_generated_nodes_are_the_imported_dataclasses_defaults():
    """cli/schema.py reads the defaults from the source (Hydra composes before torch is imported): every value
    it reads is the imported dataclass's, for the root, every algorithm and every trainer."""
    assert schema.root_node() == imported_defaults(RunSettings)
    assert set(schema.options("algos")) == {"ppo", "a2c", "dqn", "rainbow", "sac", "td3", "ddpg", "impala", "pqn",
                                            "ippo", "mappo"}
    assert set(schema.options("trainers")) == {"sequential", "parallel", "distributed_simulator", "subprocess_actors"}
    for name, info in schema.options("algos").items():
        cls = _class(info["target"])
        assert cls.name == name and schema.defaults(*info["settings"]) == imported_defaults(cls.settings_class)
        assert schema.algo_node(name)["model"] == {"hidden_sizes": [*cls.mlp.hidden_sizes],
                                                   "activation": cls.mlp.activation}
    for name, info in schema.options("trainers").items():
        cls = _class(info["target"])
        assert cls.name == name and schema.defaults(*info["settings"]) == imported_defaults(cls.settings_class)


def test_the_schema_is_read_without_importing_torch():
    import subprocess
    import sys

    code = ("import sys; from rltrain.cli import schema; schema.register(); "
            "print('torch' in sys.modules, sorted(schema.options('algos')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    expected = ("False ['a2c', 'ddpg', 'dqn', 'impala', 'ippo', 'mappo', 'ppo', 'pqn', 'rainbow', 'sac', "
                "'td3']")
    assert out.stdout.strip() == expected, out.stdout + out.stderr


@pytest.mark.parametrize("algo", sorted(schema.options("algos")))
def test_every_algo_group_composes_to_its_dataclass_and_mlp(algo):
    """algo=<name> with experiment=none is the settings dataclass's defaults, and model.hidden_sizes /
    model.activation its published ``mlp``: what the run builds."""
    cfg = plain([f"algo={algo}", "experiment=none"])
    cls = _class(cfg["algo"]["_target_"])
    node = {k: v for k, v in cfg["algo"].items() if k not in ("_target_", "_partial_")}
    assert node == imported_defaults(cls.settings_class)
    assert (tuple(cfg["model"]["hidden_sizes"]), cfg["model"]["activation"]) == tuple(cls.mlp)
    settings = validate(cfg)
    assert settings.algo_settings == cls.settings_class()


@pytest.mark.parametrize("trainer", sorted(schema.options("trainers")))
def test_every_trainer_group_composes_to_its_dataclass(trainer):
    cfg = plain([f"trainer={trainer}", "experiment=none"])
    cls = _class(cfg["trainer"]["_target_"])
    assert {k: v for k, v in cfg["trainer"].items() if not k.startswith("_")} == imported_defaults(cls.settings_class)


def test_the_root_and_its_groups_compose_to_their_dataclasses():
    cfg = plain(["experiment=none"])
    expected = imported_defaults(RunSettings)
    for key, value in expected.items():
        if key == "env":  # env=cartpole sets the id and its solved score; every other key is EnvFactory's
            assert {k: v for k, v in cfg["env"].items() if k not in ("id", "solved_return")} == \
                {k: v for k, v in value.items() if k not in ("id", "solved_return")}
        elif key == "model":  # algo=ppo's published MLP
            assert {**cfg["model"], "hidden_sizes": None, "activation": None} == value
        else:
            assert cfg[key] == value, key
    assert set(cfg) == {*expected, "algo", "trainer"}


def test_defaults_are_ppo_cartpole_sequential():
    cfg = compose_cfg()
    assert cfg.algo._target_.endswith("PPO")
    assert cfg.trainer._target_.endswith("SequentialTrainer")
    assert cfg.env.id == "CartPole-v1"


# -- the YAML holds presets only --------------------------------------------------------------------------------
def _flat(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value and key not in ("kwargs", "key_encoders", "actor_resources"):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


GROUP_SCHEMA = {"env": EnvFactory, "logger": LoggerSettings, "model": ModelSettings}


def restated_defaults(conf: Path) -> list[str]:
    """Every key a YAML file under ``conf`` sets to its dataclass's default, outside the presets (experiment/,
    debug/) and Hydra's own settings: an env / logger / model file may set only what differs, train.yaml
    only selects groups, and algo / trainer options are generated (no YAML may restate them)."""
    found = []
    root = _flat(schema.root_node())
    for path in sorted(conf.rglob("*.yaml")):
        rel = path.relative_to(conf)
        if rel.parts[0] in ("experiment", "debug", "hydra"):
            continue
        doc = yaml.safe_load(path.read_text()) or {}
        if len(rel.parts) == 1:  # train.yaml: the defaults list and hydra's settings
            found += [f"{rel}: {k}" for k in doc if k not in ("defaults", "hydra")]
            continue
        group = rel.parts[0]
        if group in ("algo", "trainer"):
            found += [f"{rel}: the {group} options are generated from the settings dataclasses (cli/schema.py)"]
            continue
        if group not in GROUP_SCHEMA:
            found += [f"{rel}: group {group} has no settings dataclass in this check"]
            continue
        for key, value in _flat({k: v for k, v in doc.items() if k != "defaults"}).items():
            default = root.get(f"{group}.{key}", _flat(schema.root_node()[group]).get(key))
            if value == default and type(value) is type(default):
                found.append(f"{rel}: {key}: {value!r} is {GROUP_SCHEMA[group].__name__}'s default")
    return found


def test_no_yaml_outside_the_presets_restates_a_default():
    assert restated_defaults(CONF_DIR) == []


def test_the_restatement_check_catches_a_restated_key(tmp_path):
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "env" / "cartpole.yaml").write_text("id: CartPole-v1\nnum_envs: 4\nsolved_return: 475\n")
    (conf / "algo").mkdir()
    (conf / "algo" / "ppo.yaml").write_text("lr: 3.0e-4\n")
    (conf / "train.yaml").write_text((conf / "train.yaml").read_text() + "seed: 1\n")
    assert restated_defaults(conf) == ["algo/ppo.yaml: the algo options are generated from the settings dataclasses "
                                       "(cli/schema.py)", "env/cartpole.yaml: num_envs: 4 is EnvFactory's default",
                                       "train.yaml: seed"]


# -- every default says what it means and where it comes from ---------------------------------------------------
def settings_classes() -> list[tuple[str, str]]:
    found = {schema.ROOT}
    for layer in ("algos", "trainers"):
        found |= {info["settings"] for info in schema.options(layer).values()}
    classes = set()
    for module, name in found:
        classes |= _with_nested(module, name)
    return sorted(classes)


def _with_nested(module: str, name: str) -> set[tuple[str, str]]:
    module, cls = schema._resolve(module, name)
    out = {(module, name)}
    for base in cls.bases:
        parent = schema._settings_class(module, base)
        out |= _with_nested(parent[0], parent[1].name) if parent else set()
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign):
            nested = schema._settings_class(module, stmt.value if stmt.value is not None else stmt.annotation)
            out |= _with_nested(nested[0], nested[1].name) if nested else set()
    return out


@pytest.mark.parametrize(("module", "name"), settings_classes(), ids=lambda v: v)
def test_every_setting_says_its_meaning_and_source(module, name):
    """The config reference is generated from the fields' trailing comments: ``# <meaning>. Source: <where>``,
    comment-only lines below a field continuing it."""
    tree, path = schema._module(module)
    cls = schema._classes(module)[name]
    lines = path.read_text().splitlines()
    missing = []
    for stmt in cls.body:
        if not isinstance(stmt, ast.AnnAssign) or "ClassVar" in ast.unparse(stmt.annotation):
            continue
        if schema._settings_class(module, stmt.value if stmt.value is not None else stmt.annotation):
            continue  # a nested group: its own fields say it
        if schema._field_default(module, stmt) is schema._INTERNAL:
            continue
        comment, i = lines[stmt.end_lineno - 1].partition("  # ")[2], stmt.end_lineno
        while i < len(lines) and lines[i].strip().startswith("#"):
            comment += " " + lines[i].strip().lstrip("#").strip()
            i += 1
        if "Source: " not in comment or len(comment.partition("Source: ")[0].strip()) < 3:
            missing.append(stmt.target.id)
    assert missing == [], f"{path.name} {name}: fields without '# <meaning>. Source: ...': {missing}"


def test_check_config_turns_whole_floats_into_counts_and_refuses_fractions():
    cfg = plain(["experiment=none", "algo=dqn", "total_env_steps=1e5", "eval.every_env_steps=2.5e4",
                 "algo.buffer_size=1e6", "trainer=subprocess_actors", "trainer.num_actors=3.0"])
    check_config(cfg)
    assert (cfg["total_env_steps"], cfg["eval"]["every_env_steps"], cfg["algo"]["buffer_size"],
            cfg["trainer"]["num_actors"]) == (100_000, 25_000, 1_000_000, 3)
    assert all(type(v) is int for v in (cfg["total_env_steps"], cfg["algo"]["buffer_size"]))
    from rltrain.errors import ConfigError

    for override, line in (("total_env_steps=2.5e4", None), ("algo.batch_size=31.5", "algo.batch_size=31.5"),
                           ("eval.episodes=1.5", "eval.episodes=1.5")):
        cfg = plain(["experiment=none", "algo=dqn", override])
        if line is None:
            check_config(cfg)
            assert cfg["total_env_steps"] == 25_000
            continue
        with pytest.raises(ConfigError, match=rf"^{line} has the wrong type: expected int \(a count: a whole"):
            check_config(cfg)


def test_a_config_recorded_before_the_one_schema_resumes_unchanged():
    """A run dir's config.yaml or a checkpoint written when the algorithm held the MLP width (algo.hidden_sizes,
    algo.activation), algo.checkpoint_buffer copied checkpoint.replay_buffer and the model group named its
    class resumes with today's composed config: nothing differs."""
    import copy

    from rltrain.run.resume_rules import config_changes, upgrade_config

    for overrides in (["experiment=none"], ["experiment=sac_pendulum"], ["experiment=ppo_lstm_cartpole_novel"],
                      ["algo=dqn", "experiment=none", "model.hidden_sizes=[32]"]):
        now = plain(overrides)
        old = copy.deepcopy(now)
        old["algo"].update(hidden_sizes=list(now["model"]["hidden_sizes"]), activation=now["model"]["activation"],
                           checkpoint_buffer=False)
        if "experiment=none" in overrides and "model.hidden_sizes=[32]" not in overrides:
            old["model"].update(hidden_sizes=None, activation=None)  # the algorithm's, then
        old["model"]["_target_"] = "rltrain.models.settings.ModelSettings"
        for key in ("action_noise", "noise_theta", "noise_dt"):
            old["algo"].pop(key, None)  # SAC keys the old YAML did not have
        assert config_changes(upgrade_config(old), now) == ([], []), overrides
    with pytest.raises(Exception, match="algo.hidden_sizes: unknown key; the MLP width is model.hidden_sizes"):
        check_config({**plain(["experiment=none"]), "algo": {**plain(["experiment=none"])["algo"],
                                                              "hidden_sizes": [64, 64]}})


def test_the_config_reference_has_a_generated_table_for_every_algorithm_and_trainer():
    """docs/reference/config.md cannot drift: each ``algo=<name>`` and ``trainer=<name>`` the schema finds has a
    table generated from its settings class (a new algorithm without one fails here)."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "reference" / "config.md").read_text()
    marked = set(re.findall(r"<!-- settings: ([\w.]+) ", page))
    for layer in ("algos", "trainers"):
        for name, info in schema.options(layer).items():
            module, cls = info["settings"]
            if not schema.defaults(module, cls):
                continue  # trainer=sequential has no settings of its own (the page says so)
            assert f"{module}.{cls}" in marked, f"{layer[:-1]}={name}: no table for {module}.{cls} in config.md"


def test_logger_progress_takes_yaml_booleans_on_the_command_line_and_in_yaml(tmp_path):
    """A user types ``false`` / ``true`` (and a YAML file's bare ``off`` / ``on`` are booleans too): false is
    ``off``, true the default display (``auto``), on the command line and in a YAML config alike; the run dir's
    config records the mode. A value that is neither is refused in one line naming both forms."""
    from omegaconf import OmegaConf

    from rltrain.errors import ConfigError

    for typed, mode in (("false", "off"), ("true", "auto"), ("off", "off"), ("plain", "plain")):
        cfg = plain(["experiment=none", f"logger.progress={typed}"])
        assert validate(cfg).logger.progress == mode, typed
        assert cfg["logger"]["progress"] == mode, typed  # what config.yaml records
    for written, mode in (("off", "off"), ("on", "auto"), ("false", "off"), ("true", "auto")):
        path = tmp_path / f"{written}.yaml"
        path.write_text(f"logger:\n  progress: {written}\n")
        cfg = plain(["experiment=none"])
        cfg["logger"].update(OmegaConf.to_container(OmegaConf.load(path))["logger"])  # as Hydra reads a YAML file
        assert validate(cfg).logger.progress == mode, written
    for typed, line in (("fast", "logger.progress='fast' is not one of: auto, rich, plain, off"),
                        ("3", "logger.progress=3 has the wrong type")):
        with pytest.raises(ConfigError) as err:
            validate(plain(["experiment=none", f"logger.progress={typed}"]))
        assert str(err.value).startswith(line) and "\n" not in str(err.value), str(err.value)


# -- env=atari's reference score is the game's own --------------------------------------------------------------
def test_atari_solved_return_is_the_games_own_dqn_score():
    """env=atari's env.solved_return follows env.id (DQN's score in Mnih et al. 2015 for that game), where it was
    Breakout's 400 for every game; a target that reads it gets the game's number."""
    from rltrain.cli.build import to_plain

    ids = ("ALE/Pong-v5", "ALE/Breakout-v5", "SpaceInvadersNoFrameskip-v4")
    scores = {env_id: compose_cfg(["env=atari", f"env.id={env_id}"]).env.solved_return for env_id in ids}
    assert scores == {"ALE/Pong-v5": 18.9, "ALE/Breakout-v5": 401.2, "SpaceInvadersNoFrameskip-v4": 1976.0}
    cfg = to_plain(compose_cfg(["env=atari", "env.id=ALE/Pong-v5", "target_return=${env.solved_return}"]))
    assert (cfg["target_return"], cfg["env"]["solved_return"]) == (18.9, 18.9)  # config.yaml records the number


@pytest.mark.parametrize("key", ["target_return", "eval.target_return"])
def test_a_game_without_a_reference_score_is_null_and_a_target_reading_it_is_refused(key):
    """A game outside the table has no conventional score: null, not another game's; a stop target that reads it
    would never be reached, so it is refused in one line naming the game (a target of null stays allowed)."""
    from rltrain.cli.build import to_plain
    from rltrain.errors import ConfigError

    cfg = compose_cfg(["env=atari", "env.id=ALE/Tetris-v5"])
    assert cfg.env.solved_return is None
    assert to_plain(cfg)["env"]["solved_return"] is None  # no target reads it: the run starts
    with pytest.raises(ConfigError, match=re.escape(f"{key}=${{env.solved_return}} is null: env.id=ALE/Tetris-v5 "
                                                    "has no reference score")):
        to_plain(compose_cfg(["env=atari", "env.id=ALE/Tetris-v5", f"{key}=${{env.solved_return}}"]))
