"""``Checkpointing``: the loop's resume (once, before the first step) and its checkpoints, one format.

A checkpoint holds the algorithm (weights, optimisers, an off-policy buffer), the loop's counters, best
evaluation and target-return record, the rollout source's state (episode statistics, envs in a sidecar),
every RNG, the config it was written with and the spaces its policy acts on (``Algorithm.policy_spaces``: the
tools build the network from them, with no env); a trainer adds its own entries (``LoopHooks``). Only the main
worker reads and writes them: on resume it loads, then every other worker starts from its weights, optimiser
and counters through one broadcast, so all replicas are identical (also on a fresh start: rank 0's initial
weights are everyone's).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rltrain import __version__
from rltrain.algos.base import Algorithm
from rltrain.data.structs import EnvSpec
from rltrain.errors import ConfigError
from rltrain.run.checkpoint import CheckpointManager, load_checkpoint, sweep_temp_files
from rltrain.run.resume_rules import config_changes, resume_mismatch
from rltrain.run.seeding import capture_rng, derive, restore_rng, resumed_env_seeds, seed_process
from rltrain.trainers.finite import FiniteGuard
from rltrain.trainers.hooks import LoopHooks, Placement, to_cpu
from rltrain.trainers.settings import RunSettings
from rltrain.trainers.state import LoopState


class Checkpointing:
    def __init__(self, settings: RunSettings, place: Placement, state: LoopState, *, algo: Algorithm,
                 source: Any, spec: EnvSpec, hooks: LoopHooks, guard: FiniteGuard):
        self.s, self.place, self.state = settings, place, state
        self.algo, self.source, self.env_id, self.hooks, self.guard = algo, source, spec.env_id, hooks, guard
        # the spaces the tools build the acting network from (a multi-agent env's: every policy group's), with no
        # env built or imported (cli/loading.py)
        self.spaces = algo.policy_spaces(settings.env.action_mask).to_record()
        self.ckpt = CheckpointManager(place.run_dir / "checkpoints", keep_last=settings.checkpoint.keep_last)
        self._resume_done = False

    # -- resume -------------------------------------------------------------------------------------------
    def resume(self) -> Path | None:
        """Restore ``settings.resume`` once (idempotent); returns the checkpoint resumed from, if any."""
        state, sync, is_main = self.state, self.place.sync, self.place.is_main
        if self._resume_done:
            return state.resumed_from
        self._resume_done = True
        path, error = None, None
        if is_main:
            try:
                path = self._restore()
            except ConfigError as err:
                if sync.world_size == 1:
                    raise
                error = str(err)  # every rank must hear it, or the others wait in the broadcast forever
        if sync.world_size > 1:
            payload = sync.broadcast_object(
                {"error": error, "path": str(path) if path else None, "algo": to_cpu(self.algo.state_dict()),
                 "counters": dict(state.counters), "best_eval": state.best_eval, "solved": state.solved}
                if is_main else None)
            if payload["error"]:
                raise ConfigError(payload["error"])
            if not is_main:
                self.algo.load_state_dict(payload["algo"])
                state.counters.update(payload["counters"])
                state.best_eval, state.solved = payload["best_eval"], payload["solved"]
                if payload["path"]:  # fresh, distinct random streams after a resume
                    seeds = derive(self.place.seeds.root, 0, path=(sync.rank, state.counters["env_steps"]))
                    seed_process(seeds.torch_seed)
            path = Path(payload["path"]) if payload["path"] else None
        state.resumed_from = state.last_checkpoint = path
        return path

    def _restore(self) -> Path | None:
        run_dir, s = self.place.run_dir, self.s
        sweep_temp_files(run_dir)  # a killed earlier run's temp files and uncommitted sidecars
        if s.resume == "never":
            return None
        # corrupt ones are skipped out loud; all corrupt refuses rather than restart over the run
        path = self.ckpt.latest(refuse_if_all_corrupt=True) if s.resume == "auto" else Path(s.resume)
        if path is None:
            return None
        # the envs sidecar is unpickled only if this user's key signed it, or the user opted in
        saved_state, envs_blob = load_checkpoint(path, run_dir=run_dir, trust_envs=s.resume_trust_envs)
        saved = saved_state["meta"].get("config") or {}
        unread = s.unread_keys()
        error = resume_mismatch(path, saved, s.config, unread=unread) or \
            self.hooks.check_resume(saved_state["meta"], path, algo=self.algo)
        if error:
            raise ConfigError(error)
        _, self.state.resume_changes = config_changes(saved, s.config, s.resume_allow_changes, unread=unread)
        if any(c.startswith("env.") for c in self.state.resume_changes):
            envs_blob = None  # the pickled envs carry the old settings: build fresh ones with the new
        try:
            self.algo.load_state_dict(saved_state["algo"])
        except (RuntimeError, KeyError, ValueError) as err:  # what the config comparison could not see
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()] or [type(err).__name__]
            detail = next((ln for ln in lines if ln.startswith(("size mismatch", "Missing", "Unexpected"))),
                          lines[0])
            raise ConfigError(f"resume={path}: its weights do not fit this run's networks ({detail}); resume "
                              "with the checkpoint's algo, env and model settings") from None
        self.state.counters.update(saved_state["counters"])
        self.state.best_eval = float(saved_state.get("best_eval", -math.inf))
        self.state.solved = saved_state.get("solved")
        self.state.last_learn = dict(saved_state.get("last_learn") or {})  # none in a checkpoint before they were
        self.state.train_sps = saved_state.get("train_sps")
        self.state.eval_owed = saved_state.get("eval_owed")
        if not self.source.load_state_dict(saved_state["collector"], envs_blob):
            # envs built afresh (not the checkpoint's): not reset with the first session's seeds again
            self.source.reseed(resumed_env_seeds(self.place.seeds.env_seeds, self.state.counters["env_steps"]))
        self.hooks.on_resume(saved_state)
        restore_rng(saved_state["rng"])  # last: building the objects above consumed RNG draws
        note = self.algo.resume_note(saved_state["algo"])
        if note and s.logger.progress != "off":  # a start line: what this resume leaves behind is no surprise later
            print(f"[rltrain] resume from {path}: {note}", flush=True)
        return path

    # -- save ---------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        state = {
            "algo": self.algo.state_dict(),
            "counters": dict(self.state.counters),
            "best_eval": self.state.best_eval,
            "solved": self.state.solved,
            # plain floats: torch.load(weights_only=True) reads them back
            "last_learn": {k: float(v) for k, v in self.state.last_learn.items()},
            "train_sps": self.state.train_sps,
            "eval_owed": self.state.eval_owed,
            "collector": self.source.state_dict(),
            "rng": capture_rng(),
            "meta": {"algo": self.algo.name, "config": self.s.config, "eval_seed": self.place.seeds.eval_seed,
                     "env_id": self.env_id, "spaces": self.spaces, "rltrain": __version__},
        }
        self.hooks.extend_checkpoint(state, algo=self.algo)
        return state

    def save(self, kind: str = "step") -> Path | None:
        """Write a checkpoint (main worker only); ``kind``: step, best or final."""
        if not self.place.is_main:
            return None
        # never write NaN weights over the last finite checkpoint (the loop checks every update; this is the
        # gate)
        self.guard.check_weights()
        path = self.ckpt.save(self.checkpoint_state(), self.state.counters["env_steps"],
                              envs=self.source.env_state(), kind=kind)
        self.state.last_checkpoint = path
        return path
