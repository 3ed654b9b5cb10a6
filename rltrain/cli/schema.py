"""The config schema: Hydra's config nodes generated from the settings dataclasses, where every default is written.

    top-level keys, eval, log, checkpoint, logger   trainers/settings.py  RunSettings and the classes it holds
    env                                             envs/make.py          EnvFactory
    model                                           models/settings.py    ModelSettings
    algo=<name>                                     the ``settings_class`` of the algorithm class whose ``name``
                                                    it is (algos/<name>.py), and its published MLP (``mlp``)
    trainer=<name>                                  the ``settings_class`` of the trainer class whose ``name``
                                                    it is (trainers/settings.py)

``register()`` stores them in Hydra's ConfigStore (``schema``, ``algo/<name>``, ``trainer/<name>``); Hydra's
plugin scan runs it (hydra_plugins/rltrain_plugins/schema.py) before any composition, and so do rltrain's entry
points, so the CLI, ``rltrain.train``, ``rltrain-check``, a sweep's jobs and the tests all compose the same
config. conf/train.yaml
selects the groups; the YAML files under conf/ are presets that set what differs from these defaults.

Why generated dicts rather than the dataclasses themselves: OmegaConf turns a frozen dataclass into a
read-only config (every override fails: "Cannot change read-only config container"), types an ``int`` field
so that ``total_env_steps=1e5`` is refused, reports a wrong type over several lines, and cannot type a field
such as ``model.key_encoders`` (a mapping or pairs). As plain nodes the composed config is the one it always
was (``rltrain --cfg job``), Hydra still refuses a key no node has, and ``cli/build.py`` checks every key and
type against the dataclasses in one place, in one line.

Why read from the source: the modules that hold the dataclasses import torch (seconds), and Hydra composes
before anything is imported (``rltrain --help``, the first line of output). A default is a literal, a
``field(default=... | default_factory=...)`` or a settings dataclass (a nested node); a field whose metadata
says ``internal`` is not a config key; anything else fails here naming the file and line.
tests/test_configs.py checks every value read here against the imported dataclass.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

PKG = Path(__file__).resolve().parent.parent  # rltrain/
MISSING = "???"  # Hydra's "must be set": a field without a default (env.id, set by an env preset)
ROOT = ("rltrain.trainers.settings", "RunSettings")


class SchemaError(Exception):
    """A settings dataclass this reader cannot turn into defaults (a bug in rltrain, not user input)."""


class Node(dict):
    """The node of one settings dataclass (a typed group: its keys are fixed), as opposed to a free-form
    mapping field such as ``env.kwargs``."""


@functools.cache
def _module(name: str) -> tuple[ast.Module, Path]:
    rel = Path(*name.split("."))
    path = PKG.parent / rel.with_suffix(".py")
    if not path.exists():
        path = PKG.parent / rel / "__init__.py"
    return ast.parse(path.read_text(), str(path)), path


def _classes(module: str) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in _module(module)[0].body if isinstance(n, ast.ClassDef)}


def _imports(module: str) -> dict[str, str]:
    """Names a module imports from rltrain -> the module that defines them."""
    out = {}
    for node in _module(module)[0].body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rltrain"):
            out.update({a.asname or a.name: node.module for a in node.names})
    return out


def _resolve(module: str, name: str) -> tuple[str, ast.ClassDef] | None:
    """The (module, class) a name refers to in ``module``, following rltrain imports; None: not an rltrain class."""
    if name in _classes(module):
        return module, _classes(module)[name]
    source = _imports(module).get(name)
    return _resolve(source, name) if source else None


def _is_dataclass(cls: ast.ClassDef) -> bool:
    for decorator in cls.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name) and target.id == "dataclass":
            return True
    return False


def _settings_class(module: str, node: ast.expr | None) -> tuple[str, ast.ClassDef] | None:
    """The settings dataclass an annotation or a default expression names (``X``, ``X()``, ``X | None``)."""
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        node = node.func
    if isinstance(node, ast.Name):
        found = _resolve(module, node.id)
        return found if found and _is_dataclass(found[1]) else None
    return None


def _plain(value: Any) -> Any:
    """Tuples as lists (YAML has no tuples), recursively."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _where(module: str, node: ast.AST) -> str:
    return f"{_module(module)[1].relative_to(PKG.parent)}:{getattr(node, 'lineno', '?')}"


def defaults(module: str, name: str) -> dict[str, Any]:
    """The config node of a settings dataclass: every field that is a config key, with its default (``???``
    where it has none), base classes' fields first and settings dataclasses as nested nodes."""
    found = _resolve(module, name)
    if found is None or not _is_dataclass(found[1]):
        raise SchemaError(f"{module}.{name} is not a settings dataclass rltrain defines")
    module, cls = found
    out = Node()
    for base in cls.bases:
        parent = _settings_class(module, base)
        if parent is not None:
            out.update(defaults(parent[0], parent[1].name))
    for stmt in cls.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        if "ClassVar" in ast.unparse(stmt.annotation):
            continue
        value = _field_default(module, stmt)
        if value is not _INTERNAL:
            out[stmt.target.id] = value
    return out


_INTERNAL = object()


def _field_default(module: str, stmt: ast.AnnAssign) -> Any:
    value = stmt.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "field":
        options = {k.arg: k.value for k in value.keywords}
        if "metadata" in options and _literal(module, options["metadata"]).get("internal"):
            return _INTERNAL
        if "default" in options:
            value = options["default"]
        elif "default_factory" in options:
            factory = options["default_factory"]
            if isinstance(factory, ast.Name) and factory.id in ("list", "tuple", "dict"):
                return {"list": [], "tuple": [], "dict": {}}[factory.id]
            value = ast.Call(func=factory, args=[], keywords=[])
        else:
            value = None
    nested = _settings_class(module, value if value is not None else stmt.annotation)
    if nested is not None:
        return defaults(nested[0], nested[1].name)
    if value is None:
        return MISSING
    try:
        return _plain(ast.literal_eval(value))
    except ValueError:
        raise SchemaError(f"{_where(module, stmt)}: the default of {stmt.target.id} "  # type: ignore[union-attr]
                          f"({ast.unparse(value)}) is not a literal, a default_factory or a settings dataclass"
                          ) from None


def _constant(module: str, name: str) -> tuple[str, ast.expr] | None:
    """(module, expression) of a module-level constant, following rltrain imports (``SB3_MLP``)."""
    for stmt in _module(module)[0].body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            return module, stmt.value
    source = _imports(module).get(name)
    return _constant(source, name) if source else None


def _literal(module: str, node: ast.expr) -> Any:
    """A literal, or the name of a module-level constant holding one (``metadata=INTERNAL``)."""
    if isinstance(node, ast.Name) and (found := _constant(module, node.id)) is not None:
        module, node = found
    return ast.literal_eval(node)


def _mlp(module: str, node: ast.expr | None) -> list | None:
    """An algorithm's ``mlp``: ``MLP((64, 64), "tanh")`` or a constant holding one, as [widths, activation]."""
    if isinstance(node, ast.Name) and (found := _constant(module, node.id)) is not None:
        module, node = found
    if not isinstance(node, ast.Call):
        return None
    return _plain(ast.literal_eval(ast.Tuple(elts=node.args, ctx=ast.Load())))


def _class_attrs(cls: ast.ClassDef) -> dict[str, ast.expr]:
    return {t.id: s.value for s in cls.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}


@functools.cache
def options(layer: str) -> dict[str, dict[str, Any]]:
    """The algorithms (``layer="algos"``) or trainers (``"trainers"``) rltrain defines: every class under
    ``rltrain/<layer>/`` with a ``name`` and a ``settings_class``, by name -> ``{"target", "settings", "mlp"}``
    (``settings``: (module, class) of its settings dataclass; ``mlp``: its published ``mlp``, or None)."""
    found = {}
    for path in sorted((PKG / layer).rglob("*.py")):
        if "settings_class" not in path.read_text():
            continue
        module = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
        for cls in _classes(module).values():
            attrs = _class_attrs(cls)
            if not isinstance(attrs.get("name"), ast.Constant) or not isinstance(attrs.get("settings_class"), ast.Name):
                continue
            settings = _resolve(module, attrs["settings_class"].id)  # type: ignore[union-attr]
            if settings is None:
                raise SchemaError(f"{_where(module, cls)}: {cls.name}.settings_class is not a class rltrain defines")
            found[attrs["name"].value] = {  # type: ignore[union-attr]
                "target": f"{module}.{cls.name}", "settings": (settings[0], settings[1].name),
                "mlp": _mlp(module, attrs.get("mlp"))}
    return found


def typed_groups(node: dict, prefix: str = "") -> set[str]:
    """The dotted paths of the typed groups in a node ("" for the node itself when it is one)."""
    found = {prefix} if isinstance(node, Node) else set()
    for key, value in node.items():
        if isinstance(value, dict):
            found |= typed_groups(value, f"{prefix}.{key}".lstrip("."))
    return found


def all_typed_groups() -> set[str]:
    """Every typed group of the config: the root, its groups, ``algo``, ``trainer`` and their nested groups."""
    found = typed_groups(root_node())
    for name in options("algos"):
        found |= typed_groups(defaults(*options("algos")[name]["settings"]), "algo")
    for name in options("trainers"):
        found |= typed_groups(defaults(*options("trainers")[name]["settings"]), "trainer")
    return found


def algo_name(target: str) -> str | None:
    """The ``algo=<name>`` whose class ``target`` names (``rltrain.algos.ppo.PPO`` -> ``ppo``)."""
    return next((name for name, info in options("algos").items() if info["target"] == target), None)


def _plain_dicts(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain_dicts(v) for k, v in value.items()}
    return value


def root_node() -> dict[str, Any]:
    """The top-level keys and the groups with one schema (env, model, logger, eval, log, checkpoint)."""
    return defaults(*ROOT)


def algo_node(name: str) -> dict[str, Any]:
    """``algo=<name>``: the algorithm's keys under ``algo`` and its published MLP under ``model`` (what the run
    builds unless the model group, a preset or the command line sets ``model.hidden_sizes``)."""
    info = options("algos")[name]
    node: dict[str, Any] = {"algo": {"_target_": info["target"], "_partial_": True, **defaults(*info["settings"])}}
    if info["mlp"] is not None:
        node["model"] = {"hidden_sizes": info["mlp"][0], "activation": info["mlp"][1]}
    return node


def trainer_node(name: str) -> dict[str, Any]:
    info = options("trainers")[name]
    return {"_target_": info["target"], "_partial_": True, **defaults(*info["settings"])}


def register() -> None:
    """Store the nodes in Hydra's ConfigStore: ``schema`` (conf/train.yaml's first default), ``algo/<name>``
    (at the config root: it sets ``model``'s MLP too) and ``trainer/<name>``; and the resolvers
    conf/train.yaml uses (cli/resolvers.py). Idempotent. Hydra's plugin scan runs it before any composition
    (hydra_plugins/rltrain_plugins/schema.py); rltrain's own entry points run it too, so that a package of
    the user's named ``hydra_plugins``, which hides every installed plugin, cannot hide the schema."""
    from hydra.core.config_store import ConfigStore

    from rltrain.cli import resolvers

    resolvers.register()
    store = ConfigStore.instance()
    node = store.repo.get("schema.yaml")
    if node is not None and node.provider == "rltrain":
        return  # stored already in this process (an entry point ran it, then Hydra's plugin scan)
    root = root_node()
    scalars = {k: v for k, v in root.items() if not isinstance(v, Node)}
    groups = {k: v for k, v in root.items() if isinstance(v, Node)}
    # algo and trainer, filled by their groups, right after the top-level keys: the order --cfg job shows
    store.store(name="schema", node=_plain_dicts({**scalars, "algo": {}, "trainer": {}, **groups}), provider="rltrain")
    for name in options("algos"):
        store.store(group="algo", name=name, node=_plain_dicts(algo_node(name)), package="_global_",
                    provider="rltrain")
    for name in options("trainers"):
        store.store(group="trainer", name=name, node=_plain_dicts(trainer_node(name)), provider="rltrain")
