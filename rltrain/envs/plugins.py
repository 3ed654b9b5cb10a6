"""Gymnasium plugin packages whose ids live under a namespace (``ALE/``, ``MinAtar/``): Gymnasium 1.x does not
import them by itself, so an id of theirs is registered here, on first use, by importing the package
(``gym.register_envs(ale_py)`` / ``minatar.gym.register_envs()``).
"""

from __future__ import annotations

import importlib
import importlib.util

import gymnasium as gym

from rltrain.errors import ConfigError

# namespace -> (the module that registers its ids, the rltrain extra that installs it)
NAMESPACES: dict[str, tuple[str, str]] = {"ALE": ("ale_py", "atari"), "MinAtar": ("minatar.gym", "minatar")}


def register_namespace(env_id: str) -> None:
    """Import the package behind a known namespace (``ALE/`` -> ale_py) so its ids are registered."""
    namespace = env_id.split("/", 1)[0] if "/" in env_id else None
    if namespace not in NAMESPACES or any(key.startswith(f"{namespace}/") for key in gym.registry):
        return  # not ours, or registered already (registering twice makes Gymnasium warn per id)
    module_name, extra = NAMESPACES[namespace]
    try:
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
