"""The OmegaConf resolvers conf/train.yaml uses, registered with the schema before any composition
(hydra_plugins/rltrain_plugins/schema.py), so they exist in every process that composes or resolves it.

- ``${rltrain_job_dir:${hydra.job.num},${hydra.job.override_dirname}}``: a multirun job's directory name, its
  number then its overrides as plain text. Hydra escapes what its override grammar reserves (``env.id=pkg\\:Env``)
  and a ``/`` in a value (``env.id=ALE/Pong-v5``) would nest directories: brackets, braces, quotes and
  backslashes are dropped, any other character outside ``[A-Za-z0-9._=,+-]`` becomes ``-``. No timestamp: a
  requeued SLURM job (it adds ``resume=auto``, which the name leaves out) lands in the same directory, and
  the job number keeps the names unique.
- ``${rltrain_help:docs}`` / ``${rltrain_help:preset}``: the computed parts of ``rltrain --help``: the
  documentation page of each part of the config, and the preset ``experiment=auto`` would add.
"""

from __future__ import annotations

import re

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


def job_dir(num, overrides: str) -> str:
    """A multirun job's directory name: ``3_algo.lr=0.001,env.id=pkg-Env``. Past ``MAX_NAME`` characters the
    overrides are cut, but the seed stays in the name (an Optuna trial's long floats would otherwise leave the
    dirs of a trial's seeds told apart by their number alone)."""
    text = UNSAFE.sub("-", DROPPED.sub("", str(overrides))).strip("-")
    if len(text) <= MAX_NAME:
        return f"{num}_{text}"
    seed = next((part for part in text.split(",") if part.startswith("seed=")), "")
    cut = text[:MAX_NAME].rstrip("-,")
    if not seed or seed in cut.split(","):
        return f"{num}_{cut}"
    return f"{num}_{text[:MAX_NAME - len(seed) - 1].rstrip('-,')},{seed}"


def help_text(what: str) -> str:
    if what == "docs":
        width = max(len(part) for part, _ in DOCS) + 2
        return "\n".join(f"{part:<{width}}{page}" for part, page in DOCS)
    return HELP.get(what, "")


def register() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("rltrain_job_dir", job_dir, replace=True)
    OmegaConf.register_new_resolver("rltrain_help", help_text, replace=True)
