"""``experiment=auto`` (the default): the tuned preset made for a run's (algo, env), chosen BEFORE composition.

The algorithms' settings dataclasses hold generic defaults (the published values for a task nobody tuned); tuned
settings live in ``conf/experiment``. ``resolve_experiment`` rewrites a command line's overrides: with no
``experiment=`` (or ``experiment=auto``) the preset made for this algo on this env id and wrappers is added and
announced in one line; ``experiment=none`` opts out; with no match one line says the generic defaults run (and
names the closest preset). ``rltrain`` and ``rltrain.train`` both call it, so they compose the same config. The presets
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

# libyaml's loader where PyYAML was built with it: every run reads all ~45 preset files before composing
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CONF = Path(__file__).resolve().parent.parent / "conf"
FAMILY_GROUPS = {"mujoco", "atari", "minatar"}  # env groups whose presets fit any task of the family
OFF = ("none", "null", "None")  # experiment=none: the generic defaults, no preset


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
    doc = yaml.load((conf / "experiment" / f"{name}.yaml").read_text(), Loader=_LOADER) or {}
    groups: dict[str, str] = {}
    env: dict = {}
    for item in doc.get("defaults") or []:
        if isinstance(item, str) and item != "_self_":  # another experiment this one builds on
            groups, env = _read(conf, item)
        elif isinstance(item, dict):
            for key, value in item.items():
                groups[key.removeprefix("override ").strip("/")] = str(value)
    return groups, {**env, **(doc.get("env") or {})}


_READ: dict[tuple, list[Preset]] = {}  # (conf, each experiment and env file's name and mtime) -> its presets


def presets(conf: Path = CONF) -> list[Preset]:
    """Every preset in ``conf/experiment``, read once per process while no file there changes (a run asks
    twice: to resolve ``experiment=auto`` and for the generic-defaults note; a test's sweep, hundreds)."""
    files = sorted((conf / "experiment").glob("*.yaml"))
    key = (str(conf), *((str(f), f.stat().st_mtime_ns) for f in [*files, *sorted((conf / "env").glob("*.yaml"))]))
    if key not in _READ:
        _READ.clear()
        _READ[key] = _scan(conf, files)
    return list(_READ[key])


def _scan(conf: Path, files: list[Path]) -> list[Preset]:
    out = []
    for path in files:
        groups, env = _read(conf, path.stem)
        if "algo" not in groups or "env" not in groups:
            continue
        env = {**(yaml.load((conf / "env" / f"{groups['env']}.yaml").read_text(), Loader=_LOADER) or {}), **env}
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
    """One line for a run that trains with the generic defaults (no preset, or ``experiment=none``): what runs,
    and the preset that fits best, if any."""
    if experiment not in (None, *OFF):
        return None
    wrappers = wrapper_names(wrappers)
    best, exact = closest(algo, env_id, presets(conf), wrappers)
    task = env_id + (f" with wrappers {list(wrappers)}" if wrappers and (best is None or not best.generic) else "")
    head = f"algo={algo}'s generic defaults are used on {task} (published values: {published(algo)})"
    if best is None:
        return f"{head}; no preset is close (docs/algorithms/index.md lists them)"
    cmd = f"experiment={best.name}" + (f" env.id={env_id}" if best.generic and best.env_id != env_id else "")
    if exact:
        return f"{head}; the tuned preset for it: rltrain {cmd}"
    made_for = f"any {best.family} task" if best.generic else best.env_id
    return f"{head}; the closest preset: rltrain {cmd} (algo={best.algo} on {made_for})"


def published(algo: str) -> str:
    """Where an algorithm's generic defaults are written: its settings dataclass (``PPOSettings in
    rltrain/algos/ppo.py``)."""
    from rltrain.cli.schema import options

    info = options("algos").get(algo)
    if info is None:
        return f"algo={algo}"
    module, cls = info["settings"]
    return f"{cls} in {module.replace('.', '/')}.py"


def auto_preset(algo: str, env_group: str, env_id: str, wrappers=(), conf: Path = CONF) -> Preset | None:
    """The preset made for ``algo`` on this env id and wrappers (a family preset: any task of its family);
    among several, the one named ``<algo>_<env group>`` (ppo_cartpole, not ppo_cleanrl)."""
    exact = [p for p in presets(conf) if p.algo == algo and p.fits(env_id, wrapper_names(wrappers))]
    named = [p for p in exact if p.name == f"{algo}_{env_group}"]
    return (named or exact or [None])[0]


def _group_default(conf: Path, group: str) -> str:
    for item in (yaml.load((conf / "train.yaml").read_text(), Loader=_LOADER) or {}).get("defaults") or []:
        if isinstance(item, dict) and group in item:
            return str(item[group])
    raise KeyError(group)


def with_override(args: list[str], override: str) -> list[str]:
    """``args`` with ``override`` placed just before the user's first ``key=value`` (at the end where there is
    none): Hydra's argument parser reads the overrides as one run of positionals, so one added after a flag and
    its value (``algo=dqn --cfg job experiment=...``) would be refused as an unrecognised argument."""
    first = next((i for i, a in enumerate(args) if "=" in a and not a.startswith("-")), len(args))
    return [*args[:first], override, *args[first:]]


def resolve_experiment(overrides: list[str], conf: Path = CONF) -> tuple[list[str], str | None]:
    """(overrides with ``experiment=auto`` resolved, the line to announce or None).

    Reads ``algo=``, ``env=``, ``env.id=`` and ``env.wrappers=`` from the overrides (else the defaults in
    train.yaml and the env group's file). A sweep over algo / env / env.id cannot be resolved before its jobs
    are composed: it runs the generic defaults unless it names a preset, and the line says so."""
    values: dict[str, str] = {}
    for item in overrides:
        key, eq, value = item.partition("=")
        if eq and not key.startswith("-"):
            values[key.lstrip("+~")] = value
    rest = [o for o in overrides if o.partition("=")[0].lstrip("+~") != "experiment" or "=" not in o]
    choice = values.get("experiment", "auto")
    if choice not in ("auto", *OFF):
        return overrides, None
    algo = values.get("algo") or _group_default(conf, "algo")
    env_group = values.get("env") or _group_default(conf, "env")
    if any("," in values.get(k, "") for k in ("algo", "env", "env.id")):
        return rest, (f"experiment={choice} in a sweep over algo/env: the generic defaults are used (name a "
                      "preset with experiment=...)")
    added = [o.partition("=")[0] for o in overrides if o.startswith("+") and "." not in o.partition("=")[0]]
    if added and choice == "auto":  # a config group of the user's (+grid=...) may itself choose the algo or env
        return rest, (f"experiment=auto with {added[0]}=...: that group may choose the algo or the env, so no "
                      "preset is applied and the generic defaults are used (name a preset with experiment=...)")
    try:
        env = yaml.load((conf / "env" / f"{env_group}.yaml").read_text(), Loader=_LOADER) or {}
    except FileNotFoundError:
        return rest, None  # composition names the unknown env group
    env_id = str(values.get("env.id") or env.get("id"))
    wrappers = yaml.safe_load(values["env.wrappers"]) if "env.wrappers" in values else env.get("wrappers")
    wrappers = wrappers if isinstance(wrappers, list) else []
    if choice == "auto":
        preset = auto_preset(algo, env_group, env_id, wrappers, conf)
        if preset is not None:
            sticky = "" if "env.kwargs.repeat_action_probability" in values or env_id.startswith("ALE/") or \
                preset.family != "atari" else STICKY_V4
            return with_override(rest, f"experiment={preset.name}"), (
                f"preset experiment={preset.name} (tuned for algo={algo} on "
                f"{'any ' + preset.family + ' task' if preset.generic else env_id}"
                f"{' with wrappers ' + str(list(preset.wrappers)) if preset.wrappers else ''}); "
                f"experiment=none for the generic defaults{sticky}")
    return rest, preset_note(algo, env_id, None, conf, wrappers)


# a -v4 id registers no sticky actions; the atari env group plays every game with v5's (conf/env/atari.yaml)
STICKY_V4 = ("; it plays this -v4 id with sticky actions, env.kwargs.repeat_action_probability=0.25 (the v5 ids' "
             "protocol, Machado et al. 2018), where the id registers 0: set it to 0 for the 2015 protocol")
