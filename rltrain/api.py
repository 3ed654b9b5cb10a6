"""The Python API: what the command lines do, called from a script or a notebook.

    import rltrain
    result = rltrain.train(["algo=ppo", "env=cartpole", "total_env_steps=20000"])
    policy = rltrain.load_policy(result.run_dir)
    action, state = policy.act(obs)              # one observation, or a batch of them

``train`` composes the same Hydra config from ``rltrain/conf`` that ``rltrain`` composes from its command line
and calls the same ``rltrain.cli.build.run``: ``trainer=sequential`` trains in this process, the other
trainers start the same workers the command line starts. ``load_policy`` is the loader ``rltrain-eval`` and
``rltrain-export`` use: the checkpoint's acting weights only (no trainer, no optimiser state), on the spaces the
checkpoint records, so no env is built and the env's module is not imported; a module named inside the
checkpoint for its network (``model.imports``) is imported only with ``allow_import=True``.

This module sits at the command lines' level (it may import ``rltrain.cli``); nothing inside rltrain imports it.
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rltrain.errors import ConfigError


@dataclass
class RunResult:
    """What ``train`` returns: the run dir, its ``summary.json`` as a dict, and the final policy (the run's
    final, else latest, checkpoint loaded by ``load_policy``; None when the run wrote no single checkpoint,
    e.g. ``trainer=parallel``, whose agents each have their own under ``run_dir/agent_<k>``)."""

    run_dir: Path
    summary: dict
    policy: LoadedPolicy | dict[str, LoadedPolicy] | None  # a dict {agent: policy} for a multi-agent env


def train(overrides: list[str] | Any = (), *, run_dir: str | Path | None = None) -> RunResult:
    """Train as ``rltrain <overrides...>`` does; returns when the run has ended (finished, stopped by its
    wall-time limit or target, or failed: ``summary["status"]`` says which).

    ``overrides``: the command line's ``key=value`` list (``hydra.run.dir=...`` included), or a ``DictConfig``
    composed already (e.g. by ``hydra.compose``). ``run_dir`` overrides ``hydra.run.dir`` (default, as on the
    command line: ``outputs/runs/<date>/<time>`` under the current directory). Bad input raises
    ``rltrain.errors.ConfigError`` with the command line's one-line message."""
    from omegaconf import DictConfig

    refuse_in_a_worker()
    if isinstance(overrides, DictConfig):
        return _train_config(overrides, run_dir)
    if isinstance(overrides, str):
        raise ConfigError(f"overrides={overrides!r}: pass a list of key=value strings (e.g. [{overrides!r}])")
    return _train_overrides(list(overrides), run_dir)


def refuse_in_a_worker() -> None:
    """A worker process that the multi-process trainers start with ``spawn`` or ``forkserver`` runs the calling
    script again as ``__mp_main__`` (Python's multiprocessing does, to find what the script defines): a ``train``
    call at the script's top level would start a second run inside each worker, which finds the run dir locked and
    fails, and the worker is restarted, over and over. Refused there in one line naming the guard."""
    import multiprocessing

    # _inheriting: set by multiprocessing while a new process (a spawned worker, the forkserver) imports the
    # script, the flag its own "bootstrapping phase" error reads
    if getattr(multiprocessing.current_process(), "_inheriting", False) or (
            multiprocessing.parent_process() is not None and
            getattr(sys.modules.get("__main__"), "__name__", None) == "__mp_main__"):
        raise ConfigError("rltrain.train() was called while a worker process started by a run was importing your "
                          "script: put the call under `if __name__ == \"__main__\":` (the multi-process trainers "
                          "start workers that import the main script, as Python's multiprocessing does)")


def _train_overrides(overrides: list[str], run_dir: str | Path | None) -> RunResult:
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from rltrain.cli import schema
    from rltrain.cli.train import announce_experiment, one_line, prepare_job

    schema.register()  # the config nodes compose from (cli/schema.py), whatever hides Hydra's plugin scan
    if any(o.startswith(("-m", "--multirun", "hydra.mode")) for o in overrides):
        raise ConfigError("multirun is a command-line feature: call train() once per job, or run rltrain -m")
    overrides = announce_experiment(overrides)  # experiment=auto, as the command line resolves it
    # the context stays open for the run: trainer=parallel composes its agents' configs under it
    with initialize_config_module("rltrain.conf", version_base="1.3"):
        try:
            cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
        except ConfigError:
            raise
        except Exception as err:  # Hydra / OmegaConf composition errors: the CLI's one line
            raise ConfigError(one_line(err)) from None
        out = Path(run_dir) if run_dir is not None else Path(str(cfg.hydra.run.dir))
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(out.resolve())
        hydra_node = cfg.hydra
        # what @hydra.main's job sees: HydraConfig set (agents read the overrides there), no `hydra` key
        HydraConfig.instance().set_config(cfg)
        try:
            with open_dict(cfg):
                del cfg["hydra"]
            prepare_job(cfg, hydra_node.runtime.cwd)
            return _run(cfg, out)
        finally:
            HydraConfig.instance().cfg = None  # type: ignore[assignment]


def _train_config(cfg: Any, run_dir: str | Path | None) -> RunResult:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))  # ours to edit
    hydra_node = cfg.pop("hydra", None)
    if run_dir is None:
        run_dir = hydra_node.run.dir if hydra_node is not None and "run" in hydra_node else \
            Path("outputs/runs") / datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    from rltrain.cli.train import prepare_job

    prepare_job(cfg, os.getcwd())  # composed already: its experiment= was chosen by whoever composed it
    return _run(cfg, Path(str(run_dir)))


def _run(cfg: Any, run_dir: Path) -> RunResult:
    from rltrain.cli.loading import callers_threads

    with callers_threads():  # the run's thread settings end with it: the caller's process is not its own
        return _run_here(cfg, run_dir)


def _run_here(cfg: Any, run_dir: Path) -> RunResult:
    import logging

    from rltrain.cli.build import run
    from rltrain.run.logs import LogLines, run_file_handler

    # no Hydra job logging here: rltrain's records go to <run dir>/train.log as on the command line and, where
    # the caller configured no logging, read on stderr as there (``rltrain: warning: ...``), not as Python's bare
    # last-resort message; both for this run only
    logger, handler = logging.getLogger("rltrain"), logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogLines())
    mine = not logger.hasHandlers()
    run_dir.mkdir(parents=True, exist_ok=True)
    log_file = run_file_handler(str(run_dir / "train.log"))
    logger.addHandler(log_file)
    if mine:
        logger.addHandler(handler)
    try:
        summary = run(cfg, run_dir)
    finally:
        for added in (log_file, handler) if mine else (log_file,):
            logger.removeHandler(added)
        log_file.close()
        (run_dir / "train.log").touch()  # as the command line's run dir has it, empty when nothing was logged
    policy = None
    if (run_dir / "checkpoints").is_dir():
        try:
            policy = load_policy(run_dir, allow_import=True)  # the user's own run: its env is theirs
        except ConfigError:
            policy = None  # e.g. every checkpoint failed to write: the summary says why
    return RunResult(run_dir=run_dir, summary=summary, policy=policy)


def load_policy(path: str | Path, *, device: str = "cpu",
                allow_import: bool = False) -> LoadedPolicy | dict[str, LoadedPolicy]:
    """The policy in a checkpoint file, or in a run dir (its final, else latest, checkpoint), ready to act; for a
    multi-agent env a dict ``{agent: policy}``, each acting on that agent's own observation (agents that share
    a policy share its weights; the agent's index is added inside).

    Only the acting network is built and loaded (no optimiser state, no replay buffer contents, no trainer),
    from the spaces the checkpoint records: a policy trained on your own env (``env.id=my_env:MyEnv``) loads
    where ``my_env`` cannot be imported. ``allow_import``: import the modules the checkpoint names for its
    network (``model.imports``), and for a checkpoint written before the spaces were recorded, its env's module
    (importing runs the module's code: only for checkpoints you trust)."""
    from rltrain.cli.loading import callers_threads
    from rltrain.cli.loading import load_policy as load

    # the lines name this function's arguments (path=, allow_import=True), not the command line's
    with callers_threads():  # building the algorithm sets numpy's threads: the caller keeps its own
        loaded = load(Path(path), device=device, allow_import=allow_import, opt_in="allow_import=True", key="path")
    if getattr(loaded.policy, "group_list", None) is not None:  # a multi-agent env's policies (models/agents.py)
        return {agent: LoadedPolicy(policy, spec=policy.spec, config=loaded.config, checkpoint=loaded.checkpoint,
                                    env=loaded.env, step_imports=loaded.step_imports)
                for agent, policy in loaded.policy.per_agent().items()}
    return LoadedPolicy(loaded.policy, spec=loaded.spec, config=loaded.config, checkpoint=loaded.checkpoint,
                        env=loaded.env, step_imports=loaded.step_imports)


@dataclass(repr=False)
class EvalResult:
    """What ``evaluate`` returns: each episode's return and where it came from.

    ``returns``: [episodes] (float64), episode j from seed ``seed + j``; for a multi-agent env [episodes,
    agents], in ``agents`` order. ``success_rate``: the share of episodes whose last ``info["is_success"]``
    was true, where the env reports one (goal tasks), else None. ``vs_random`` (self-play, and a constant-sum
    game such as a zero-sum one): the learner's return against uniformly random legal moves per episode, its
    seat ``j % agents`` in episode j, with ``constant_sum`` the game's constant (0 for zero-sum); ``mean``,
    ``std`` and ``outcomes`` then read it, as the run's ``final_eval_return`` does: the mean of ``returns``
    over agents is that constant over their number whatever was learnt."""

    returns: np.ndarray
    checkpoint: Path
    seed: int
    deterministic: bool
    agents: tuple[str, ...] | None = None
    success_rate: float | None = None
    vs_random: np.ndarray | None = None
    constant_sum: float | None = None

    @property
    def mean(self) -> float:
        return float((self.returns if self.vs_random is None else self.vs_random).mean())

    @property
    def std(self) -> float:
        """Over episodes (for a multi-agent env, of the mean over agents; of ``vs_random`` where there is one)."""
        r = self.returns if self.vs_random is None else self.vs_random
        return float((r.mean(1) if r.ndim == 2 else r).std())

    @property
    def outcomes(self) -> dict[str, float] | None:
        """``{win, draw, loss}`` rates of ``vs_random`` (a return above, at or below the fair share of the
        constant, as the run's ``eval_vs_random``), else None."""
        if self.vs_random is None or self.constant_sum is None or not self.agents:
            return None
        from rltrain.trainers.matches import outcomes

        return outcomes(self.vs_random, share=self.constant_sum / len(self.agents))

    def __repr__(self) -> str:  # what a notebook shows: the numbers, not the array of every episode's return
        extra = f", success_rate={self.success_rate:.2f}" if self.success_rate is not None else ""
        extra += f", agents={self.agents}" if self.agents is not None else ""
        extra += f", vs random legal moves (constant-sum {self.constant_sum:g})" if self.vs_random is not None else ""
        return (f"EvalResult(episodes={len(self.returns)}, mean={self.mean:.2f}, std={self.std:.2f}{extra}, "
                f"deterministic={self.deterministic}, seed={self.seed}, "
                f"checkpoint={self.checkpoint})")


def evaluate(path: str | Path, *, episodes: int = 10, deterministic: bool = True, seed: int | None = None,
             checkpoint: str = "final", device: str = "cpu", allow_import: bool = False) -> EvalResult:
    """Run ``episodes`` evaluation episodes of a run dir's policy (its ``checkpoint``: final, best or latest) or
    of a checkpoint file, in this process, as ``rltrain-eval`` does: the env is built as the run built it, so
    an env id registered in this process (a notebook's ``gym.register``) is found, where the ``rltrain-eval``
    command, a new process, cannot see it. ``seed``: the first episode's (default: the run's evaluation
    seed). ``allow_import``: stepping an env named by module (``env.id=my_env:MyEnv``) or an ``env.wrappers``
    entry imports that module, which runs its code; without it, one ``ConfigError`` says so."""
    from rltrain.cli.args import check_episodes_and_seed, pick_checkpoint
    from rltrain.cli.loading import load_policy as load
    from rltrain.cli.loading import refuse_stepping
    from rltrain.trainers.episodes import evaluate as run_episodes
    from rltrain.trainers.matches import evaluate_agents, headline_vs_random, step_cap

    # every refusal names this function's arguments (episodes=, checkpoint=, path=), not rltrain-eval's flags
    check_episodes_and_seed(episodes, seed, names=("episodes", "seed"))
    from rltrain.cli.loading import callers_threads

    with callers_threads():  # building the algorithm sets numpy's threads: the caller keeps its own
        loaded = load(pick_checkpoint(Path(path), checkpoint, name="checkpoint", key="path"), device=device,
                      allow_import=allow_import, opt_in="allow_import=True", key="path")
    refuse_stepping(loaded, opt_in="allow_import=True", key="path")
    seed = loaded.eval_seed if seed is None else seed
    common = {"episodes": episodes, "eval_seed": seed, "deterministic": deterministic,
              "device": torch.device(device)}
    if getattr(loaded.policy, "group_list", None) is not None:  # a multi-agent env: [episodes, agents]
        cap = step_cap(loaded.eval_steps, loaded.env.max_episode_steps)  # where the run's evaluation cut them
        rets = evaluate_agents(loaded.policy, loaded.env.make, max_steps=cap, **common)
        # self-play and constant-sum games: the headline the run's final evaluation gave (final_eval_return)
        vs_random, constant = headline_vs_random(loaded.policy, loaded.env.make, rets, max_steps=cap, **common)
        return EvalResult(np.asarray(rets, np.float64), loaded.checkpoint, seed, deterministic,
                          agents=tuple(loaded.spec.agents), vs_random=vs_random, constant_sum=constant)
    successes: list[bool] = []
    rets = run_episodes(loaded.policy, loaded.env.make, real_scores=loaded.env.real_scores, successes=successes,
                        max_episode_steps=loaded.eval_steps, **common)
    return EvalResult(np.asarray(rets, np.float64), loaded.checkpoint, seed, deterministic,
                      success_rate=sum(successes) / len(successes) if successes else None)


@dataclass(repr=False)
class LoadedPolicy:
    """A trained policy that acts on numpy observations: ``act(obs, state=None, deterministic=True)``.

    ``module``: the torch policy (``module.act`` on batched tensors); ``spec``: the env's spaces;
    ``config``: the run's resolved config; ``checkpoint``: the file it came from. ``make_env()`` builds the env
    as the run built it (its kwargs and wrappers: the observations ``act`` expects)."""

    module: torch.nn.Module = field(repr=False)
    spec: Any = field(repr=False)
    config: dict = field(repr=False)
    checkpoint: Path
    env: Any = field(default=None, repr=False)  # the run's env factory (envs/make.py EnvFactory)
    step_imports: list[str] = field(default_factory=list, repr=False)  # modules building the env imports

    def __post_init__(self) -> None:
        from rltrain.data.obs_checks import ObsCheck
        from rltrain.data.structs import obs_buffer

        self.module.eval().requires_grad_(False)
        self._template = obs_buffer(self.spec.observation, (0,))  # one [0, *shape] array per stored key
        self._check = ObsCheck(self.spec.observation)
        spec = self.spec
        if spec.action_kind == "box":  # the env's own values, as its training envs got them (envs/wrappers.py
            # ActionDtype, BoxShape): its dtype, inside its exact bounds, in its own shape
            self._box_dtype = np.dtype(spec.env_action_dtype or np.float32)
            self._box_bounds = [np.asarray(b, self._box_dtype).reshape(spec.action_shape)
                                for b in (spec.action_low, spec.action_high)]
        self._device = next(self.module.parameters()).device
        self._generator = torch.Generator(device=self._device).manual_seed(0)

    def __repr__(self) -> str:  # rltrain-eval's line for the policy: what was loaded, not only where from
        from rltrain.cli.evaluate import describe_policy

        return f"LoadedPolicy({describe_policy(self.module, self.spec, self.config)}, checkpoint={self.checkpoint})"

    @property
    def recurrent(self) -> bool:
        return bool(getattr(self.module, "recurrent", False))

    def make_env(self, *, render_mode: str | None = None, allow_import: bool = False) -> Any:
        """One env built as the run built its evaluation envs: the same id, ``env.kwargs`` and ``env.wrappers``
        (Atari's preprocessing and frame stack, a time limit, a user's wrappers), so that its observations are
        what ``act`` takes; a multi-agent run's PettingZoo env. ``render_mode``: e.g. ``"human"`` or
        ``"rgb_array"``. An env or wrapper named by module (``env.id=my_env:MyEnv``) is imported only with
        ``allow_import`` (importing runs its code); an id registered in this process is found as it is."""
        if self.env is None:
            raise ValueError("this policy was not loaded from a checkpoint (rltrain.load_policy): no env recorded")
        if self.step_imports and not allow_import:
            raise ConfigError(f"checkpoint={self.checkpoint}: {self.step_imports[0]} inside it names a module to "
                              "import to build the env, which runs its code; pass allow_import=True if you trust "
                              "this checkpoint")
        return self.env.make(render_mode=render_mode)

    def initial_state(self, n: int = 1) -> tuple[torch.Tensor, ...] | None:
        """The state a recurrent policy starts ``n`` envs from (zeros); None for a feed-forward one."""
        return self.module.initial_state(n) if self.recurrent else None

    def reset_state(self, state: tuple[torch.Tensor, ...] | None, done: Any) -> tuple[torch.Tensor, ...] | None:
        """``state`` with the envs whose episode ended (``done`` [N] bool) back at zero."""
        from rltrain.models.cores import reset_state

        return None if state is None else reset_state(state, np.asarray(done, bool))

    def act(self, obs: Any, state: tuple[torch.Tensor, ...] | None = None, *,
            deterministic: bool = True) -> tuple[np.ndarray, tuple[torch.Tensor, ...] | None]:
        """obs: one observation (the env's shape; for a Dict space a dict of arrays, for a Tuple space the env's
        tuple, at any depth) or a batch [N, ...] of them (a Dict's or a Tuple's arrays batched, as a Gymnasium
        vector env returns them) -> (action, state). The action is what to step the env with: an int64
        (Discrete, its ``start`` added; [N] for a batch) or an array clipped to the Box bounds in the env's own
        shape ((2, 2) for a (2, 2) Box, which the policy acts on as 4 values; [N, *shape] for a batch) and action
        dtype (float32; float64 for a float64 Box), the mode when ``deterministic`` else a sample. ``state``: a
        recurrent policy's state returned by the previous call (None: start of an episode); feed-forward policies
        return None. A policy trained with action masking reads the env's mask in the observation, under
        ``"action_mask"``; without it, one ValueError says so. An observation of another shape (any key's), or an
        index outside its Discrete / MultiDiscrete / MultiBinary space, is one ValueError naming the space and the
        shapes it takes (data/obs_checks.py)."""
        from rltrain.data.structs import MASK_KEY, action_mask_of, obs_leaves, obs_map
        from rltrain.envs.spaces import tuples_as_dicts

        if self.spec.masked and not (isinstance(obs, dict) and MASK_KEY in obs):
            action_mask_of(obs, list(self._template))  # one line naming the key and how to pass it
        if isinstance(self._template, dict):
            try:  # a Tuple observation becomes the dict the policy was trained on (the env's TupleAsDict)
                obs = tuples_as_dicts(obs, self._template)
            except (KeyError, ValueError) as err:
                detail = f"no key {err}" if isinstance(err, KeyError) else err
                raise ValueError(f"observation does not match {self.spec.observation.name}: {detail}") from None
        single = self._check.single(obs)  # one ValueError naming the space where the shapes (or indices) do not fit
        try:
            batch = obs_map(lambda t, x: torch.as_tensor(np.asarray(x, t.dtype)[None] if single else
                                                         np.asarray(x, t.dtype), device=self._device),
                            self._template, obs)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"observation does not match {self.spec.observation.name}: {err}") from None
        n = len(obs_leaves(batch)[0])
        if self.recurrent and state is None:
            state = self.module.initial_state(n)
        with torch.inference_mode():
            if self.recurrent:
                out = self.module.act(batch, state, deterministic=deterministic, generator=self._generator)
            else:
                out = self.module.act(batch, deterministic=deterministic, generator=self._generator)
        action = out.action.cpu().numpy()
        spec = self.spec
        if spec.action_kind == "box":
            action = np.clip(action.astype(self._box_dtype), *self._box_bounds)
            if spec.env_action_shape is not None:  # the policy's flat vector in the env's own shape ((2, 2), ())
                action = action.reshape(len(action), *spec.env_action_shape)
        elif spec.action_kind == "discrete" and spec.action_start:  # Discrete(n, start=s): the env's
            action = action + np.int64(spec.action_start[0])          # own value, index + s
        elif spec.env_action_dtype:  # MultiDiscrete values in the env's own integer dtype (int32, ...)
            action = action.astype(spec.env_action_dtype)
        return (action[0] if single else action), (out.state if self.recurrent else None)
