"""Gymnasium plugin packages whose ids live under a namespace (``ALE/``, ``MinAtar/``): Gymnasium 1.x does not
import them by itself, so an id of theirs is registered here, on first use, by importing the package
(``gym.register_envs(ale_py)`` / ``minatar.gym.register_envs()``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

import gymnasium as gym

from rltrain.errors import ConfigError

# namespace -> (the module that registers its ids, the rltrain extra that installs it)
NAMESPACES: dict[str, tuple[str, str]] = {"ALE": ("ale_py", "atari"), "MinAtar": ("minatar.gym", "minatar")}


# what a plugin imports at its top only to draw its screens, never to step an env: MinAtar's environment module
# imports pyplot and seaborn (seaborn brings scipy.stats), 1.2 s of a 1.5 s import, in every process that builds
# one of its envs
DISPLAY_ONLY: dict[str, tuple[str, ...]] = {"minatar.gym": ("matplotlib.pyplot", "seaborn")}


class OnUse(types.ModuleType):
    """A stand-in for a module, bound by a plugin's ``import`` while ``imported_on_use`` holds it in
    ``sys.modules``: the real module is imported the first time the plugin reads an attribute of it (a screen
    drawn), by then no longer shadowed."""

    def __getattr__(self, attr: str) -> Any:
        if sys.modules.get(self.__name__) is self:  # still inside the import that bound it
            raise AttributeError(attr)
        return getattr(importlib.import_module(self.__name__), attr)


@contextlib.contextmanager
def imported_on_use(names: tuple[str, ...]) -> Iterator[None]:
    """While a plugin is imported, the modules ``names`` that no one imported yet are ``OnUse`` stand-ins; after
    it, ``sys.modules`` is as it was, so anyone's own ``import seaborn`` gets the real module."""
    stand_ins = {name: OnUse(name) for name in names if name not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]


def register_namespace(env_id: str) -> None:
    """Import the package behind a known namespace (``ALE/`` -> ale_py) so its ids are registered."""
    namespace = env_id.split("/", 1)[0] if "/" in env_id else None
    if namespace not in NAMESPACES or any(key.startswith(f"{namespace}/") for key in gym.registry):
        return  # not ours, or registered already (registering twice makes Gymnasium warn per id)
    module_name, extra = NAMESPACES[namespace]
    try:
        with imported_on_use(DISPLAY_ONLY.get(module_name, ())):
            module = importlib.import_module(module_name)
    except ImportError:
        package = module_name.split(".")[0]
        raise ConfigError(f"env.id={env_id} needs {package}: pip install 'rltrain[{extra}]'") from None
    if callable(getattr(module, "register_envs", None)):  # minatar registers on request, ale_py on import
        module.register_envs()


def register_plugins() -> None:
    """Import every installed package behind ``NAMESPACES`` (their ids registered), for an id without a
    namespace that Gymnasium does not know yet: only on that path, so a run never pays for a plugin it does
    not use."""
    for namespace, (module_name, _) in NAMESPACES.items():
        if importlib.util.find_spec(module_name.split(".")[0]) is None:
            continue
        try:
            register_namespace(f"{namespace}/")
        except ConfigError:
            continue  # installed but broken: the unknown-id line stands
