"""The OmegaConf resolvers the YAML uses (conf/train.yaml, conf/env/atari.yaml), registered with the schema before
any composition (hydra_plugins/rltrain_plugins/schema.py), so they exist in every process that composes or
resolves it.

- ``${rltrain_job_dir:${hydra.job.num},${hydra.job.override_dirname}}``: a multirun job's directory name, its
  number then its overrides as plain text. Hydra escapes what its override grammar reserves (``env.id=pkg\\:Env``)
  and a ``/`` in a value (``env.id=ALE/Pong-v5``) would nest directories: brackets, braces, quotes and
  backslashes are dropped, any other character outside ``[A-Za-z0-9._=,+-]`` becomes ``-``. No timestamp: a
  requeued SLURM job (it adds ``resume=auto``, which the name leaves out) lands in the same directory, and
  the job number keeps the names unique.
- ``${rltrain_help:docs}`` / ``${rltrain_help:preset}``: the computed parts of ``rltrain --help``: the
  documentation page of each part of the config, and the preset ``experiment=auto`` would add.
- ``${rltrain_atari_score:${.id}}``: ``env=atari``'s ``env.solved_return``, the game's own reference score
  (``ATARI_DQN_2015``), null for a game the table does not hold (``check_targets`` then refuses a
  ``target_return`` that reads it).
"""

from __future__ import annotations

import re

from rltrain.errors import ConfigError

DROPPED = re.compile(r"[\\\[\]{}'\"]")
UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]+")
MAX_NAME = 120  # characters of overrides in a job dir's name (file systems allow 255 bytes)

# where each part of the config is documented (the docs site's pages, docs/ in the repository)
DOCS = (
    ("first steps", "docs/getting-started.md"),
    ("every key", "docs/reference/config.md (each default, its meaning and source)"),
    ("algo=<name>", "docs/algorithms/<name>.md (ppo, a2c, dqn, sac, td3, impala, pqn; ddpg on td3.md, rainbow on "
                    "dqn.md), its presets (experiment=) too"),
    ("algo.her=true", "docs/algorithms/her.md (goal-conditioned tasks: hindsight experience replay)"),
    ("algo=ippo, algo=mappo", "docs/guide/multi-agent.md (PettingZoo envs)"),
    ("trainer=parallel", "docs/scaling/parallel.md"),
    ("trainer=distributed_simulator", "docs/scaling/distributed.md"),
    ("trainer=subprocess_actors", "docs/scaling/subprocess-actors.md (trainer.backend=ray: docs/scaling/ray.md)"),
    ("env", "docs/guide/own-env.md (your own env), docs/guide/pixels.md (images)"),
    ("model", "docs/guide/recurrent.md (model.core), docs/guide/pixels.md (encoders)"),
    ("logger", "docs/guide/trackers.md"),
    ("checkpoint, resume", "docs/guide/checkpoints.md"),
    ("-m, hydra/sweeper", "docs/guide/sweeps.md (hydra/launcher=slurm: docs/scaling/slurm.md)"),
    ("resume_trust_envs", "docs/trust.md (what rltrain runs from a file, and when)"),
)
HELP = {"preset": ""}  # set by the rltrain command before Hydra composes its --help (cli/train.py)

# DQN's score per game, the reference env=atari's env.solved_return reads: Mnih et al. 2015 ("Human-level control
# through deep reinforcement learning", Nature 518), Extended Data Table 2, the "DQN" column (the professional
# human tester's score beside it in a comment). Their protocol: no sticky actions, up to 30 no-ops at the start,
# epsilon 0.05, games of at most 5 minutes; v5's sticky actions (env=atari's) make each game harder. A game
# missing here has no conventional value in rltrain: null, never another game's number.
ATARI_DQN_2015 = {
    "Asterix": 6012.0,        # human 8503
    "BeamRider": 6846.0,      # human 5775
    "Breakout": 401.2,        # human 31.8
    "Enduro": 301.8,          # human 309.6
    "Freeway": 30.3,          # human 29.6
    "MsPacman": 2311.0,       # human 15693
    "Pong": 18.9,             # human 9.3
    "Qbert": 10596.0,         # human 13455
    "Seaquest": 5286.0,       # human 20182
    "SpaceInvaders": 1976.0,  # human 1652
}
# the game in an ALE id: ALE/Pong-v5, and the gym-era Pong-v4, PongNoFrameskip-v4, PongDeterministic-v4
ATARI_GAME = re.compile(r"(?:ALE/)?(?P<game>[A-Za-z]+?)(?:NoFrameskip|Deterministic)?-v\d+")


def job_dir(num, overrides: str) -> str:
    """A multirun job's directory name: ``3_algo.lr=0.001,env.id=pkg-Env``. Past ``MAX_NAME`` characters the
    overrides are cut after the last whole one that fits, but the seed stays in the name (an Optuna trial's long
    floats would otherwise leave the dirs of a trial's seeds told apart by their number alone)."""
    text = UNSAFE.sub("-", DROPPED.sub("", str(overrides))).strip("-")
    if len(text) <= MAX_NAME:
        return f"{num}_{text}"
    parts = OVERRIDE.split(text)
    seed = next((part for part in parts if part.startswith("seed=")), "")
    cut = _whole(parts, MAX_NAME)
    if not seed or seed in OVERRIDE.split(cut):
        return f"{num}_{cut}"
    return f"{num}_{_whole([p for p in parts if p != seed], MAX_NAME - len(seed) - 1)},{seed}"


OVERRIDE = re.compile(r",(?=[A-Za-z0-9_.+~-]+=)")  # the comma between two overrides, not one inside a list value


def _whole(parts: list[str], width: int) -> str:
    """The first whole overrides that fit in ``width`` characters: a value cut short names another value
    (``total_env_steps=20`` for 2048, ``algo.ent_coef=0`` for 0.0085). Only a first override longer than
    ``width`` by itself is cut."""
    kept = ""
    for part in parts:
        joined = f"{kept},{part}" if kept else part
        if len(joined) > width:
            break
        kept = joined
    return kept or parts[0][:width].rstrip("-,")


def help_text(what: str) -> str:
    if what == "docs":
        width = max(len(part) for part, _ in DOCS) + 2
        return "\n".join(f"{part:<{width}}{page}" for part, page in DOCS)
    return HELP.get(what, "")


def atari_game(env_id) -> str | None:
    """The game an ALE id names (``ALE/Pong-v5``, ``PongNoFrameskip-v4`` -> ``Pong``), else None."""
    found = ATARI_GAME.fullmatch(str(env_id))
    return found["game"] if found and (str(env_id).startswith("ALE/") or found["game"] in ATARI_DQN_2015) else None


def atari_score(env_id) -> float | None:
    """The game's score in ``ATARI_DQN_2015``, or None for an id that names no game there."""
    return ATARI_DQN_2015.get(atari_game(env_id) or "")


TARGETS = ("target_return", "eval.target_return")


def check_targets(cfg) -> None:
    """A stop target that reads another key (``target_return=${env.solved_return}``) and finds null there would
    train the whole budget without a word: refused in one line, naming what it read. A target set to null itself
    is the usual "no target". ``cfg``: the composed DictConfig, before anything resolved it away."""
    from omegaconf import OmegaConf

    for key in TARGETS:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if node is None or leaf not in node or not OmegaConf.is_interpolation(node, leaf):
            continue
        if OmegaConf.select(cfg, key) is not None:
            continue
        text = OmegaConf.to_container(node, resolve=False)[leaf]
        why = ""
        if "solved_return" in str(text):
            env_id = OmegaConf.select(cfg, "env.id")
            # only an ALE id can be a game the table lacks; any other env says what its group sets (or not)
            where = "env=atari knows ten games' scores: docs/guide/pixels.md" if atari_game(env_id) else \
                "env.solved_return is null: its env group sets none"
            why = f": env.id={env_id} has no reference score ({where})"
        raise ConfigError(f"{key}={text} is null{why}, so the run would never stop at it; set {key}=<a number>, "
                          "or null to train the whole budget")


def register() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("rltrain_job_dir", job_dir, replace=True)
    OmegaConf.register_new_resolver("rltrain_help", help_text, replace=True)
    OmegaConf.register_new_resolver("rltrain_atari_score", atari_score, replace=True)
