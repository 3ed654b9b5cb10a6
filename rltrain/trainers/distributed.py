"""Trainer ``distributed_simulator``: data-parallel training over ``torch.distributed``.

W ranks, each with its own envs (``env.num_envs`` per rank, seeds from the SeedSequence tree at path
``(rank,)``) and its own replica of the algorithm. Rank 0's weights (and optimiser and normaliser state)
are broadcast before the first update; every gradient step all-reduces the gradients as one flattened
bucket, averaged and waited, so all replicas apply the same update and stay identical (the DD-PPO
recipe, Wijmans et al. 2020). Normaliser moments are summed and logged scalars averaged over ranks.

Ranks come from our own local spawn (``trainer.world_size``), from torchrun or from a SLURM step
(``rendezvous.py``; the local spawn is ``ranks.py``). Rank 0 alone logs, shows progress and writes checkpoints.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from rltrain.algos.base import Algorithm, Sync
from rltrain.envs.deadline import EnvFault
from rltrain.errors import ConfigError
from rltrain.run.checkpoint import CheckpointManager, load_checkpoint
from rltrain.run.device import pick_device
from rltrain.run.process import init_process
from rltrain.run.seeding import SeedTree, derive, write_seeds
from rltrain.run.signals import StopFlag, StopRequested
from rltrain.run.summary import last_logged_step, newest_checkpoint, resume_command
from rltrain.trainers.base import Capabilities, Trainer
from rltrain.trainers.hooks import LoopHooks, Placement, TrainerParts
from rltrain.trainers.loop import TrainLoop
from rltrain.trainers.ranks import (
    PeerFailure,
    RankFailure,
    failure_of,
    primary_failure,
    report_failure,
    spawn_ranks,
)
from rltrain.trainers.rendezvous import LaunchInfo, detect_launch, join_group
from rltrain.trainers.settings import DistributedSimulatorSettings, RunSettings

BEAT_KEY = "rltrain/heartbeat"  # + "/<rank>": a counter each rank's watchdog thread adds 1 to every 0.5 s
BEAT_CHECK_S = 2.0


class TorchDistSync(Sync):
    """All-reducing ``Sync``: gradients (one flat bucket, averaged), moments (summed), scalars (averaged).

    Scalars and objects travel over the default (gloo, CPU) group; gradients over ``grad_group`` (nccl
    on GPUs) or the default group. Every collective is waited, and a watchdog thread aborts the process
    when one has waited longer than ``timeout_s`` plus a grace (a backend that failed to time out).
    """

    def __init__(self, *, rank: int, world_size: int, timeout_s: float, grad_device: torch.device,
                 grad_group=None, backend: str = "gloo", store=None):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.grad_device, self.grad_group, self.backend = grad_device, grad_group, backend
        self.store = store  # the rendezvous store: each rank's heartbeat counter (``gone_peers``)
        self._busy: tuple[str, float] | None = None
        self._watch_done = threading.Event()
        self._watch_thread: threading.Thread | None = None

    def _beats(self) -> dict[int, int]:
        out = {}
        for r in range(self.world_size):
            try:
                out[r] = int(self.store.add(f"{BEAT_KEY}/{r}", 0))
            except Exception:  # noqa: BLE001 - the store's host is gone too
                out[r] = -1
        return out

    def gone_peers(self) -> list[int]:
        """After a collective failed: the other ranks whose heartbeat stopped (killed or crashed), read twice
        ``BEAT_CHECK_S`` apart; [] when unknown (no store)."""
        if self.store is None:
            return []
        before = self._beats()
        time.sleep(BEAT_CHECK_S)
        after = self._beats()
        return [r for r in range(self.world_size) if r != self.rank and after[r] <= before[r]]

    def _collective(self, name: str, fn):
        self._busy = (name, time.monotonic())
        try:
            return fn()
        except RuntimeError as err:  # DistBackendError / gloo "Connection closed by peer" / timeouts
            raise PeerFailure(f"{name} failed (a peer rank is gone, hung or crashed; trainer.timeout_s="
                              f"{self.timeout_s:g}): {str(err).splitlines()[0] if str(err) else type(err).__name__}"
                              ) from err
        finally:
            self._busy = None

    def _wait(self, work) -> None:
        work.wait(timeout=timedelta(seconds=self.timeout_s))

    def grads(self, params: list[Tensor]) -> None:
        """Average ``p.grad`` over ranks in place: one flattened bucket, one all-reduce, waited."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self.grad_device)
        self._collective("all_reduce(grads)", lambda: self._wait(
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.grad_group, async_op=True)))
        flat.div_(self.world_size)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            chunk = flat[offset:offset + n].view_as(g).to(p.device)
            if p.grad is None:  # in the parameter's layout, as autograd's (models.layers.input_major)
                p.grad = torch.empty_like(p).copy_(chunk)
            else:
                p.grad.copy_(chunk)
            offset += n

    def _reduce(self, x: np.ndarray, op, name: str) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).clone()
        self._collective(name, lambda: self._wait(dist.all_reduce(t, op=op, async_op=True)))
        return t.numpy().astype(np.asarray(x).dtype, copy=False)

    def sum(self, x: np.ndarray) -> np.ndarray:
        return self._reduce(x, dist.ReduceOp.SUM, "all_reduce(sum)")

    def mean(self, x: np.ndarray) -> np.ndarray:
        return self._reduce(x, dist.ReduceOp.SUM, "all_reduce(mean)") / self.world_size

    def any(self, flag: bool) -> bool:
        return bool(self._reduce(np.array([1.0 if flag else 0.0]), dist.ReduceOp.MAX, "all_reduce(stop)")[0] > 0)

    def broadcast_object(self, obj, src: int = 0):
        box = [obj]
        self._collective("broadcast(state)", lambda: dist.broadcast_object_list(box, src=src))
        return box[0]

    def gather_object(self, obj) -> list:
        out: list = [None] * self.world_size
        self._collective("all_gather(summary)", lambda: dist.all_gather_object(out, obj))
        return out

    def start_watchdog(self, *, parent_pid: int | None = None) -> None:
        """Abort when a collective outlives ``timeout_s`` (+ grace), or when our spawning parent is gone."""

        def watch() -> None:
            while not self._watch_done.wait(0.5):
                if self.store is not None:  # this rank lives (``gone_peers``); a gone store: the collectives say so
                    with contextlib.suppress(Exception):
                        self.store.add(f"{BEAT_KEY}/{self.rank}", 1)
                busy = self._busy
                if busy and time.monotonic() - busy[1] > self.timeout_s + 10:
                    print(f"rltrain: rank {self.rank}: {busy[0]} waited more than trainer.timeout_s="
                          f"{self.timeout_s:g}; a peer is gone or hung; aborting", file=sys.stderr, flush=True)
                    os._exit(70)
                if parent_pid is not None and os.getppid() != parent_pid:
                    os._exit(71)  # the supervisor died (SIGKILL): never linger as an orphan

        self._watch_thread = threading.Thread(target=watch, name="rltrain-watchdog", daemon=True)
        self._watch_thread.start()

    def stop_watchdog(self, *, wait_s: float = 5.0) -> None:
        """End the watchdog before the rank leaves the group. Left running, it may be inside a store call (the GIL
        released) when the interpreter exits; the thread then ends by forced unwinding through C++ frames that must
        not unwind, and the process aborts with SIGABRT after a completed run (seen on a loaded machine)."""
        self._watch_done.set()
        if self._watch_thread is not None:
            self._watch_thread.join(timeout=wait_s)  # a store call on a gone host may block: do not wait on it


def init_distributed(launch: LaunchInfo, *, backend: str, device: torch.device, timeout_s: float,
                     stop: StopFlag | None = None) -> TorchDistSync:
    """Join the process group (gloo for scalars and objects; nccl for gradients when chosen) within a bounded
    time, ``stop`` honoured while waiting (``rendezvous.join_group``)."""
    timeout = timedelta(seconds=timeout_s)
    store = join_group(launch, backend="gloo", timeout_s=timeout_s, stop=stop)
    sync = TorchDistSync(rank=launch.rank, world_size=launch.world_size, timeout_s=timeout_s,
                         grad_device=torch.device("cpu"), store=store)
    devices = sync.gather_object(str(device))
    cpu_ranks = [r for r, d in enumerate(devices) if not d.startswith("cuda")]
    if backend == "nccl" and cpu_ranks:
        raise ConfigError(f"trainer.backend=nccl needs every rank on a GPU; rank(s) {cpu_ranks} run on "
                          f"{devices[cpu_ranks[0]]}; use device=cuda on GPU nodes or trainer.backend=gloo")
    if backend == "nccl" or (backend == "auto" and not cpu_ranks):
        sync.grad_group = dist.new_group(backend="nccl", timeout=timeout)
        sync.grad_device, sync.backend = device, "nccl"
    return sync


class DistributedHooks(LoopHooks):
    """What a rank adds to the shared loop: the resume layout rule and the per-rank summary entries."""

    def __init__(self, launch: LaunchInfo, sync: Sync, *, num_envs: int):
        self.launch, self.sync, self.num_envs = launch, sync, num_envs

    def layout(self, algo: Algorithm) -> dict:
        return {"world_size": self.sync.world_size, "num_envs": self.num_envs,
                "rollout_len": int(algo.rollout_len)}

    def check_resume(self, meta: dict, path: Path, *, algo: Algorithm) -> str | None:
        return layout_mismatch(meta, self.layout(algo), path)

    def extend_checkpoint(self, state: dict, *, algo: Algorithm) -> None:
        state["meta"]["layout"] = self.layout(algo)

    def extend_summary(self, summary: dict, status: str, *, algo: Algorithm) -> None:
        sync = self.sync
        summary.update(backend=getattr(sync, "backend", "none"), launcher=self.launch.source)
        if status != "failed":  # no collectives on the failure path: peers may be gone
            sps = summary["sps"]
            summary["rank_sps"] = sync.gather_object(sps / sync.world_size if sps else None)
            # the replicas must be bitwise identical; recorded so anyone can check it after the fact
            summary["rank_param_sha256"] = sync.gather_object(param_digest(algo.policy))


def layout_mismatch(meta: dict, new: dict, path: Path) -> str | None:
    """Resume needs the same global batch (ranks x envs x steps); else the arithmetic and a fix."""
    old = meta.get("layout") or {"world_size": 1, "num_envs": meta["config"]["env"]["num_envs"],
                                 "rollout_len": meta["config"]["algo"].get("rollout_len") or new["rollout_len"]}
    g_old = old["world_size"] * old["num_envs"] * old["rollout_len"]
    g_new = new["world_size"] * new["num_envs"] * new["rollout_len"]
    if g_old == g_new:
        return None
    envs = old["world_size"] * old["num_envs"]
    fix = (f"with {new['world_size']} ranks use env.num_envs={envs // new['world_size']}"
           if envs % new["world_size"] == 0 and old["rollout_len"] == new["rollout_len"] else
           f"use a world size that divides {envs} envs: {[d for d in range(1, envs + 1) if envs % d == 0]}")
    return (f"resume={path}: the checkpoint's global batch is {old['world_size']} rank(s) x {old['num_envs']} "
            f"envs x {old['rollout_len']} steps = {g_old}, this run's is {new['world_size']} x {new['num_envs']} "
            f"x {new['rollout_len']} = {g_new}; {fix}")


def param_digest(module: torch.nn.Module) -> str:
    """sha256 (16 hex digits) of all parameters and buffers, in state_dict order."""
    h = hashlib.sha256()
    for v in module.state_dict().values():
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def run_rank(launch: LaunchInfo, settings: RunSettings, run_dir: Path, *, backend: str, timeout_s: float,
             stop: StopFlag, ends_at: int | None = None, updates: int | None = None) -> dict:
    """One rank from start to finish: join the group, train, leave the group. Returns its summary."""
    init_process(torch_threads=settings.torch_threads)
    device = pick_device(settings.device, local_rank=launch.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sync = init_distributed(launch, backend=backend, device=device, timeout_s=timeout_s, stop=stop)
    sync.start_watchdog(parent_pid=os.getppid() if launch.source == "local" else None)
    try:
        if launch.source != "local":  # ranks started by others agree on rank 0's root seed (seed=null draws)
            seed = sync.broadcast_object(settings.seed)
            settings = settings.replace(seed=seed)
            if launch.is_main:
                trees = {f"rank_{r}": derive(seed, settings.env.num_envs, path=(r,)) for r in range(launch.world_size)}
                write_seeds(Path(run_dir) / "seeds.json", seed, trees, drawn=settings.seed_drawn)
        seeds = derive(settings.seed, settings.env.num_envs, path=(launch.rank,))
        place = Placement(Path(run_dir), seeds, device, sync=sync, is_main=launch.is_main,
                          title=f"distributed x{launch.world_size}")
        hooks = DistributedHooks(launch, sync, num_envs=settings.env.num_envs)
        loop = TrainLoop(settings, place, stop, TrainerParts(hooks=hooks, ends_at=ends_at, updates=updates))
        return loop.run()
    except PeerFailure as err:
        err.gone = sync.gone_peers()  # which rank died first, for the line and the summary
        raise
    finally:
        sync.stop_watchdog()
        if dist.is_initialized():
            dist.destroy_process_group()


class DistributedSimulatorTrainer(Trainer):
    name = "distributed_simulator"
    settings_class = DistributedSimulatorSettings
    capabilities = Capabilities(all_reduce=True)

    def __init__(self, *, settings: RunSettings, run_dir: Path,
                 trainer: DistributedSimulatorSettings = DistributedSimulatorSettings()):
        super().__init__(settings=settings, run_dir=run_dir)
        algo_cls = settings.algo_class
        if not getattr(algo_cls, "on_policy", True):
            raise ConfigError(f"trainer=distributed_simulator: algo={algo_cls.name} is off-policy and its replay "
                              "updates are not all-reduced; use trainer=sequential, parallel or subprocess_actors")
        self.world_size, self.backend = trainer.world_size, trainer.backend
        self.timeout_s, self.master_addr = trainer.timeout_s, trainer.master_addr
        self.launch = detect_launch()  # None: this process spawns and supervises its own ranks

    def replicas(self) -> int:
        return self.world_size

    def describe(self) -> list[tuple[str, str]]:
        return [(f"{self.world_size} ranks (local spawn; torchrun / SLURM tasks set their own)",
                 f"backend {self.backend}, each rank envs {self.envs_text()}")]

    def seed_trees(self) -> dict[str, SeedTree]:
        if self.launch is not None:  # torchrun / SLURM: rank 0 records them once the ranks agree on the seed
            return {}
        return self.planned_seed_trees()

    def planned_seed_trees(self) -> dict[str, SeedTree]:
        s = self.settings
        return {f"rank_{r}": derive(s.seed, s.env.num_envs, path=(r,)) for r in range(self.world_size)}

    def writes_summary(self) -> bool:
        return self.launch is None or self.launch.is_main

    def train(self, stop: StopFlag) -> dict:
        launch = self.launch
        if launch is None:
            self._precheck_resume()
            rank = functools.partial(run_rank, ends_at=self.ends_at(), updates=self.budget_updates())
            summaries, failures = spawn_ranks(rank, self.settings, self.run_dir, stop, world_size=self.world_size,
                                              backend=self.backend, timeout_s=self.timeout_s,
                                              master_addr=self.master_addr)
            if failures and stop.requested and all(f.kind == "peer" for f in failures):
                # stopped before the ranks could agree on it (joining, building envs): none of them failed
                ckpt = newest_checkpoint(self.run_dir)
                return {"status": "interrupted", "stop_reason": f"{stop.reason} (the ranks were starting)",
                        "checkpoint": str(ckpt) if ckpt else None, "resume_command": resume_command(self.run_dir)}
            if failures:
                first = primary_failure(failures)
                return self._failed(report_failure(first, self.run_dir), first.rank, first.exit_code)
            return summaries[0]
        try:
            return run_rank(launch, self.settings, self.run_dir, backend=self.backend, timeout_s=self.timeout_s,
                            stop=stop, ends_at=self.ends_at(), updates=self.budget_updates())
        except StopRequested:
            raise
        except BaseException as err:  # noqa: B036 - name the rank, exit non-zero (torchrun / srun stop the rest)
            if isinstance(err, ConfigError) and not isinstance(err, EnvFault):
                raise  # bad input: the CLI's one line; an env fault is this rank's, named as a spawned rank's is
            failure = failure_of(launch.rank, err)
            gone = getattr(err, "gone", None) or getattr(err.__cause__, "gone", None) or []
            if gone:  # a peer was killed or crashed: it failed first, this rank only lost it
                failure = RankFailure(gone[0], "died", f"stopped answering (killed or crashed: its heartbeat "
                                      f"stopped); rank {launch.rank}: {failure.message}", failure.traceback)
            if not launch.is_main:  # rank 0 writes the run's files; this rank's one line is in its own log
                return {"status": "failed", "error": report_failure(failure, None), "failed_rank": failure.rank,
                        "exit_code": failure.exit_code}
            return self._failed(report_failure(failure, self.run_dir), failure.rank, failure.exit_code)

    def resume_layout_error(self, meta: dict, path: Path) -> str | None:
        new = {"world_size": self.world_size, "num_envs": self.settings.env.num_envs,
               "rollout_len": self.update_size().rollout_len}  # algo.rollout_len=null resolved
        return layout_mismatch(meta, new, path)

    def _precheck_resume(self) -> None:
        """Refuse a mismatched resume before spawning anything (rank 0 checks again when joined)."""
        spec = self.settings.resume
        if spec == "never":
            return
        path = CheckpointManager(self.run_dir / "checkpoints").latest() if spec == "auto" else Path(spec)
        if path is not None:
            error = self.resume_layout_error(load_checkpoint(path)[0]["meta"], path)
            if error:
                raise ConfigError(error)

    def _failed(self, message: str, rank: int, exit_code: int = 1) -> dict:
        """The run's summary (rank 0's, when it got that far) marked failed by ``rank``; ``exit_code`` 2 where the
        user's env failed it (``RankFailure.exit_code``)."""
        path = self.run_dir / "summary.json"
        try:
            summary = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            summary = {}
        ckpt = newest_checkpoint(self.run_dir)
        summary.update(status="failed", error=message, failed_rank=rank, world_size=self.world_size,
                       last_checkpoint=str(ckpt) if ckpt else None)
        if summary.get("total_env_steps") is None:  # rank 0 never wrote its own: the last step it logged
            summary["total_env_steps"] = last_logged_step(self.run_dir)
        return {**summary, "exit_code": exit_code}
