"""Which tuned ``experiment=`` preset fits an (algo, env) pair, for the start-up note.

A run without ``experiment=`` trains with the algo group's defaults, which are tuned for one env (PPO's for
CartPole-v1): on anything else the user should hear it once, with the preset that fits best. The presets
are read from ``conf/experiment/*.yaml`` (their ``override /algo`` and ``override /env`` defaults and their
``env.id``), so a new preset file is picked up without a table to keep in step. Presets on the ``mujoco``,
``atari`` and ``minatar`` env groups are meant for every task of that family (``env.id=Ant-v5``). A preset
whose env wraps the task (``env=cartpole_novel``: a ``VelocityMask``) is another task than the bare env: it
fits a run only with the same wrappers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

CONF = Path(__file__).resolve().parent.parent / "conf"
FAMILY_GROUPS = {"mujoco", "atari", "minatar"}  # env groups whose presets fit any task of the family
# what each algo group's own defaults were tuned for (see the comment at the top of conf/algo/<name>.yaml)
DEFAULTS_TUNED_FOR = {"ppo": "CartPole-v1", "dqn": "CartPole-v1", "a2c": "CartPole-v1",
                      "impala": "CartPole-v1", "sac": "MuJoCo (CleanRL's sac_continuous_action)"}


@dataclass(frozen=True)
class Preset:
    name: str
    algo: str
    env_id: str
    family: str
    generic: bool  # fits every task of its family
    wrappers: tuple[str, ...] = ()  # the names of its env's wrappers, in order

    def fits(self, env_id: str, wrappers: tuple[str, ...]) -> bool:
        """Made for this task: the same env id and wrappers (a family preset: any task of its family)."""
        return (self.generic and self.family == family(env_id)) or (self.env_id == env_id
                                                                      and self.wrappers == wrappers)


def family(env_id: str) -> str:
    """mujoco | box2d | classic | atari | minatar | other, from the id and Gymnasium's registry (no env built)."""
    if env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4"):
        return "atari"
    if env_id.startswith("MinAtar/"):
        return "minatar"
    try:
        import gymnasium as gym

        entry = str(gym.registry[env_id].entry_point) if env_id in gym.registry else ""
    except Exception:  # a broken plugin must not stop a run over a note
        entry = ""
    for part, name in (("envs.mujoco", "mujoco"), ("envs.box2d", "box2d"), ("envs.classic_control", "classic")):
        if part in entry:
            return name
    return "other"


def wrapper_names(wrappers) -> tuple[str, ...]:
    """``env.wrappers`` entries (a name, or a one-key mapping name -> kwargs) -> their names."""
    return tuple(w if isinstance(w, str) else next(iter(w)) for w in wrappers or ())


def _read(conf: Path, name: str) -> tuple[dict[str, str], dict]:
    """(groups overridden, the ``env`` keys set) by one experiment file, following experiments it builds on."""
    doc = yaml.safe_load((conf / "experiment" / f"{name}.yaml").read_text()) or {}
    groups: dict[str, str] = {}
    env: dict = {}
    for item in doc.get("defaults") or []:
        if isinstance(item, str) and item != "_self_":  # another experiment this one builds on
            groups, env = _read(conf, item)
        elif isinstance(item, dict):
            for key, value in item.items():
                groups[key.removeprefix("override ").strip("/")] = str(value)
    return groups, {**env, **(doc.get("env") or {})}


def presets(conf: Path = CONF) -> list[Preset]:
    out = []
    for path in sorted((conf / "experiment").glob("*.yaml")):
        groups, env = _read(conf, path.stem)
        if "algo" not in groups or "env" not in groups:
            continue
        env = {**(yaml.safe_load((conf / "env" / f"{groups['env']}.yaml").read_text()) or {}), **env}
        env_id = str(env.get("id"))
        out.append(Preset(path.stem, groups["algo"], env_id, family(env_id), groups["env"] in FAMILY_GROUPS,
                          wrapper_names(env.get("wrappers"))))
    return out


def closest(algo: str, env_id: str, available: list[Preset], wrappers: tuple[str, ...] = ()
            ) -> tuple[Preset | None, bool]:
    """(best preset, whether it is tuned for exactly this algo and task) in this order: made for this algo on
    this task (env id and wrappers; or its family, for family presets); this algo on the same family; another
    algo on this task; another algo on the same family."""
    fam = family(env_id)
    exact = [p for p in available if p.algo == algo and p.fits(env_id, wrappers)]
    if exact:
        return exact[0], True
    for pick in ([p for p in available if p.algo == algo and p.family == fam and fam != "other"],
                 [p for p in available if p.fits(env_id, wrappers)],
                 [p for p in available if p.family == fam and fam != "other"]):
        if pick:
            return pick[0], False
    return None, False


def preset_note(algo: str, env_id: str, experiment: str | None, conf: Path = CONF, wrappers=()) -> str | None:
    """One line for a run without ``experiment=`` whose task (env and ``env.wrappers``) is not what the algo's
    defaults are tuned for."""
    if experiment not in (None, "null", "None"):
        return None
    tuned_for = DEFAULTS_TUNED_FOR.get(algo)
    wrappers = wrapper_names(wrappers)
    if (tuned_for == env_id and not wrappers) or (algo == "sac" and family(env_id) == "mujoco"):
        return None
    best, exact = closest(algo, env_id, presets(conf), wrappers)
    task = env_id + (f" with wrappers {list(wrappers)}" if wrappers and (best is None or not best.generic) else "")
    head = f"no experiment= preset chosen: algo={algo}'s defaults are used on {task}"
    head += f" (tuned for {tuned_for})" if tuned_for else ""
    if best is None:
        return f"{head}; no preset is close (the README's preset tables list them)"
    cmd = f"experiment={best.name}" + (f" env.id={env_id}" if best.generic and best.env_id != env_id else "")
    if exact:
        return f"{head}; the tuned preset for it: rltrain {cmd}"
    made_for = f"any {best.family} task" if best.generic else best.env_id
    return f"{head}; the closest preset: rltrain {cmd} (algo={best.algo} on {made_for})"
