"""rltrain: train reinforcement-learning agents from Hydra configs, from one process to a SLURM cluster.

``rltrain.train(overrides)``, ``rltrain.load_policy(path)`` and ``rltrain.evaluate(path)`` are the Python API
(rltrain/api.py); they are imported on first use, so ``import rltrain`` stays cheap (no torch, no Hydra).
"""

__version__ = "0.2.0"
__all__ = ["train", "load_policy", "evaluate", "RunResult", "LoadedPolicy", "EvalResult", "__version__"]


def __getattr__(name: str):
    if name in ("train", "load_policy", "evaluate", "RunResult", "LoadedPolicy", "EvalResult"):
        from rltrain import api

        return getattr(api, name)
    raise AttributeError(f"module 'rltrain' has no attribute {name!r}")
