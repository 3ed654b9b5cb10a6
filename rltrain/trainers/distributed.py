"""Trainer ``distributed_simulator``: data-parallel training over ``torch.distributed``.

W ranks, each with its own envs (``env.num_envs`` per rank, seeds from the SeedSequence tree at path
``(rank,)``) and its own replica of the algorithm. Rank 0's weights (and optimiser and normaliser state)
are broadcast before the first update; every gradient step all-reduces the gradients as one flattened
bucket, averaged and waited, so all replicas apply the same update and stay identical (the DD-PPO
recipe, Wijmans et al. 2020). Normaliser moments are summed and logged scalars averaged over ranks.

Ranks come from our own local spawn (``trainer.world_size`` workers of one ``supervise.WorkerGroup``), from
torchrun or from a SLURM step (``rendezvous.py``). Rank 0 alone logs, shows progress and writes checkpoints.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from rltrain.algos.base import Sync
from rltrain.cli.build import algo_factory, pick_device, resolve_target
from rltrain.errors import ConfigError
from rltrain.run.checkpoint import CheckpointManager, load_checkpoint
from rltrain.run.seeding import derive, seed_process, write_seeds
from rltrain.run.signals import StopFlag
from rltrain.run.summary import write_summary
from rltrain.trainers.loop import Trainer, TrainLoop
from rltrain.trainers.rendezvous import LaunchInfo, detect_launch, free_port
from rltrain.trainers.supervise import (
    HEAVY_MODULES,
    ContextStop,
    Done,
    Exited,
    Failed,
    WorkerContext,
    WorkerGroup,
)

BACKENDS = ("auto", "gloo", "nccl")


class PeerFailure(RuntimeError):
    """A collective failed or timed out: another rank is gone, hung or crashed."""


class TorchDistSync(Sync):
    """All-reducing ``Sync``: gradients (one flat bucket, averaged), moments (summed), scalars (averaged).

    Scalars and objects travel over the default (gloo, CPU) group; gradients over ``grad_group`` (nccl
    on GPUs) or the default group. Every collective is waited, and a watchdog thread aborts the process
    when one has waited longer than ``timeout_s`` plus a grace (a backend that failed to time out).
    """

    def __init__(self, *, rank: int, world_size: int, timeout_s: float, grad_device: torch.device,
                 grad_group=None, backend: str = "gloo"):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.grad_device, self.grad_group, self.backend = grad_device, grad_group, backend
        self._busy: tuple[str, float] | None = None

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
            if p.grad is None:
                p.grad = chunk.clone()
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
            while True:
                time.sleep(0.5)
                busy = self._busy
                if busy and time.monotonic() - busy[1] > self.timeout_s + 10:
                    print(f"rltrain: rank {self.rank}: {busy[0]} waited more than trainer.timeout_s="
                          f"{self.timeout_s:g}; a peer is gone or hung; aborting", file=sys.stderr, flush=True)
                    os._exit(70)
                if parent_pid is not None and os.getppid() != parent_pid:
                    os._exit(71)  # the supervisor died (SIGKILL): never linger as an orphan

        threading.Thread(target=watch, name="rltrain-watchdog", daemon=True).start()


def init_distributed(launch: LaunchInfo, *, backend: str, device: torch.device, timeout_s: float) -> TorchDistSync:
    """Join the process group (gloo for scalars and objects; nccl for gradients when chosen)."""
    timeout = timedelta(seconds=timeout_s)
    launch.export()  # env:// also reuses torchrun's own store (TORCHELASTIC_USE_AGENT_STORE)
    dist.init_process_group("gloo", init_method="env://", rank=launch.rank, world_size=launch.world_size,
                            timeout=timeout)
    sync = TorchDistSync(rank=launch.rank, world_size=launch.world_size, timeout_s=timeout_s,
                         grad_device=torch.device("cpu"))
    devices = sync.gather_object(str(device))
    cpu_ranks = [r for r, d in enumerate(devices) if not d.startswith("cuda")]
    if backend == "nccl" and cpu_ranks:
        raise ConfigError(f"trainer.backend=nccl needs every rank on a GPU; rank(s) {cpu_ranks} run on "
                          f"{devices[cpu_ranks[0]]}; use device=cuda on GPU nodes or trainer.backend=gloo")
    if backend == "nccl" or (backend == "auto" and not cpu_ranks):
        sync.grad_group = dist.new_group(backend="nccl", timeout=timeout)
        sync.grad_device, sync.backend = device, "nccl"
    return sync


class DistTrainLoop(TrainLoop):
    """``TrainLoop`` plus the distributed start (rank 0's state broadcast), resume rules and summary."""

    def __init__(self, *args, launch: LaunchInfo, **kwargs):
        super().__init__(*args, **kwargs)
        self.launch = launch
        self.sync: TorchDistSync

    def layout(self) -> dict:
        return {"world_size": self.sync.world_size, "num_envs": self.cfg["env"]["num_envs"],
                "rollout_len": int(self.algo.rollout_len)}

    def checkpoint_state(self) -> dict:
        state = super().checkpoint_state()
        state["meta"]["layout"] = self.layout()
        return state

    def maybe_resume(self) -> Path | None:
        payload = None
        if self.is_main:
            try:
                path = super().maybe_resume()  # rank 0 restores everything, its envs and RNG included
                error = self._check_layout(path) if path else None
            except ConfigError as err:
                path, error = None, str(err)
            payload = {"error": error, "path": str(path) if path else None,
                       "algo": _to_cpu(self.algo.state_dict()), "counters": dict(self.counters),
                       "best_eval": self.best_eval, "solved": self.solved}
        payload = self.sync.broadcast_object(payload)
        if payload["error"]:
            raise ConfigError(payload["error"])
        if not self.is_main:  # identical start: rank 0's weights, optimiser and normaliser state
            self.algo.load_state_dict(payload["algo"])
            self.counters.update(payload["counters"])
            self.best_eval, self.solved = payload["best_eval"], payload["solved"]
            if payload["path"]:  # fresh, distinct random streams after a resume
                seed_process(derive(self.seeds.root, 0, path=(self.sync.rank, self.counters["env_steps"])).torch_seed)
        return Path(payload["path"]) if payload["path"] else None

    def _check_layout(self, path: Path) -> str | None:
        return layout_mismatch(load_checkpoint(path)[0]["meta"], self.layout(), path)

    def _finish(self, status: str, *, start_steps: int = 0, t0: float | None = None, error: str | None = None) -> dict:
        elapsed = time.perf_counter() - t0 if t0 is not None else math.nan
        own_steps = (self.counters["env_steps"] - start_steps) / self.sync.world_size
        summary = super()._finish(status, start_steps=start_steps, t0=t0, error=error)
        summary.update(backend=self.sync.backend, launcher=self.launch.source)
        if status != "failed":  # no collectives on the failure path: peers may be gone
            summary["rank_sps"] = self.sync.gather_object(own_steps / elapsed if elapsed > 0 else None)
            # the replicas must be bitwise identical; recorded so anyone can check it after the fact
            summary["rank_param_sha256"] = self.sync.gather_object(param_digest(self.algo.policy))
            if self.is_main:
                write_summary(self.run_dir, summary)
        return summary


def layout_mismatch(meta: dict, new: dict, path: Path) -> str | None:
    """Resume needs the same global batch (ranks x envs x steps); else the arithmetic and a fix."""
    old = meta.get("layout") or {"world_size": 1, "num_envs": meta["config"]["env"]["num_envs"],
                                 "rollout_len": meta["config"]["algo"].get("rollout_len", new["rollout_len"])}
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


def _to_cpu(obj):
    if isinstance(obj, Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def run_rank(launch: LaunchInfo, cfg: dict, run_dir: Path, *, backend: str, timeout_s: float,
             stop: StopFlag | None = None) -> dict:
    """One rank from start to finish: join the group, train, leave the group. Returns its summary.

    ``stop``: the flag the loop polls; None installs signal handlers (torchrun / SLURM ranks).
    """
    torch.set_num_threads(int(cfg["torch_threads"]))
    device = pick_device(cfg["device"], local_rank=launch.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sync = init_distributed(launch, backend=backend, device=device, timeout_s=timeout_s)
    sync.start_watchdog(parent_pid=os.getppid() if launch.source == "local" else None)
    stop = StopFlag().install() if stop is None else stop
    try:
        if launch.source != "local":  # ranks started by others agree on rank 0's root seed (seed=null draws)
            cfg["seed"] = sync.broadcast_object(cfg["seed"])
        n = cfg["env"]["num_envs"]
        seeds = derive(cfg["seed"], n, path=(launch.rank,))
        if launch.is_main:
            trees = {f"rank_{r}": derive(cfg["seed"], n, path=(r,)) for r in range(launch.world_size)}
            write_seeds(Path(run_dir) / "seeds.json", cfg["seed"], trees, drawn=cfg["seed_drawn"])
        loop = DistTrainLoop(cfg, Path(run_dir), seeds=seeds, device=device, algo_factory=algo_factory(cfg),
                             stop=stop, sync=sync, is_main=launch.is_main, launch=launch,
                             title=f"distributed x{launch.world_size}")
        summary = loop.run()
        summary["exit_code"] = stop.exit_code if summary["status"] == "interrupted" else 0
        return summary
    finally:
        stop.uninstall()
        if dist.is_initialized():
            dist.destroy_process_group()


# -- local spawn: W ranks as the W workers of one WorkerGroup ---------------------------------------------------
@dataclass(frozen=True)
class RankJob:
    """What a locally spawned rank needs (plain, picklable)."""

    launch: LaunchInfo
    cfg: dict
    run_dir: str
    backend: str
    timeout_s: float


@dataclass(frozen=True)
class RankFailure:
    """Why a rank failed; rank -> parent just before the bootstrap's ``Failed``. ``kind``: ``config`` (bad
    input), ``error`` (its own failure), ``peer`` (a collective failed because another rank is gone),
    ``died`` (exited without a word: killed or crashed)."""

    rank: int
    kind: str
    message: str
    traceback: str = ""


def failure_of(rank: int, err: BaseException) -> RankFailure:
    kind = "config" if isinstance(err, ConfigError) else "peer" if isinstance(err, PeerFailure) else "error"
    return RankFailure(rank, kind, f"{type(err).__name__}: {err}" if kind != "config" else str(err),
                       "".join(traceback.format_exception(type(err), err, err.__traceback__)))


def primary_failure(failures: list[RankFailure]) -> RankFailure:
    """The root cause: a rank that failed on its own beats ranks that only lost contact with it."""
    own = [f for f in failures if f.kind != "peer"]
    return (own or failures)[0]


def _spawned_rank(ctx: WorkerContext, job: RankJob) -> dict:
    """Worker ``rank`` of the parent's group: its summary returns as ``Done``; a failure is classified here,
    where the exception's type is known, and sent before the bootstrap sends ``Failed`` with the traceback."""
    try:
        return run_rank(job.launch, job.cfg, Path(job.run_dir), backend=job.backend, timeout_s=job.timeout_s,
                        stop=ContextStop(ctx))  # the parent's Stop -> the all-reduced stop bit -> same update
    except BaseException as err:  # noqa: B036 - classify everything, KeyboardInterrupt included; then re-raise
        ctx.send(replace(failure_of(job.launch.rank, err), traceback=""))
        raise


def supervise_ranks(group: WorkerGroup, stop: StopFlag, *, timeout_s: float
                    ) -> tuple[dict[int, dict], list[RankFailure]]:
    """Wait for every rank; pass a stop request on; after the first failure give the others ``timeout_s``
    to notice (their collectives fail), then terminate whatever is left, so a dead peer never hangs the job.
    Returns the summaries by rank and the failures in the order they happened."""
    summaries: dict[int, dict] = {}
    failures: dict[int, RankFailure] = {}
    first_failure: float | None = None
    stopping = False
    while group.alive:
        if stop.requested and not stopping:
            stopping = True
            group.stop_all(stop.reason or "stop")
        for ev in group.poll(timeout=0.25):
            if isinstance(ev, Done):
                summaries[ev.index] = ev.result
            elif isinstance(ev, RankFailure):
                failures.setdefault(ev.rank, ev)
            elif isinstance(ev, Failed):  # the traceback joins the rank's RankFailure (sent just before)
                known = failures.setdefault(ev.index, RankFailure(ev.index, "error", ev.error))
                failures[ev.index] = replace(known, traceback=ev.traceback)
            elif isinstance(ev, Exited):
                failures.setdefault(ev.index, RankFailure(ev.index, "died" if ev.exitcode else "error",
                                                          ev.description))
        if failures and first_failure is None:
            first_failure = time.monotonic()
        if first_failure is not None and time.monotonic() - first_failure > timeout_s:
            for w in group.workers:
                if not w.finished:
                    failures.setdefault(w.index, RankFailure(w.index, "peer", "did not stop within "
                                                             f"trainer.timeout_s={timeout_s:g}"))
            group.shutdown(grace_s=0.0)  # SIGTERM, then SIGKILL
            break
    return summaries, list(failures.values())


class DistributedSimulatorTrainer(Trainer):
    def __init__(self, *, cfg: dict, run_dir: Path, world_size: int = 2, backend: str = "auto",
                 timeout_s: float = 300.0, master_addr: str = "127.0.0.1"):
        if world_size < 1:
            raise ConfigError(f"trainer.world_size={world_size} must be >= 1")
        if backend not in BACKENDS:
            raise ConfigError(f"trainer.backend={backend!r} is not one of: {', '.join(BACKENDS)}")
        if timeout_s <= 0:
            raise ConfigError(f"trainer.timeout_s={timeout_s} must be > 0")
        algo_cls = resolve_target(cfg["algo"], "algo")
        if not getattr(algo_cls, "on_policy", True):
            raise ConfigError(f"trainer=distributed_simulator: algo={algo_cls.name} is off-policy and its replay "
                              "updates are not all-reduced; use trainer=sequential, parallel or subprocess_actors")
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.world_size, self.backend, self.timeout_s, self.master_addr = world_size, backend, timeout_s, master_addr

    def fit(self) -> dict:
        launch = detect_launch()
        if launch is None:
            return self._spawn_and_supervise()
        try:
            return run_rank(launch, self.cfg, self.run_dir, backend=self.backend, timeout_s=self.timeout_s)
        except ConfigError:
            raise
        except BaseException as err:  # noqa: B036 - name the rank, exit non-zero (torchrun / srun stop the rest)
            failure = failure_of(launch.rank, err)
            print(failure.traceback, file=sys.stderr)
            print(f"rltrain: rank {launch.rank} failed: {failure.message}", file=sys.stderr, flush=True)
            return {"status": "failed", "error": failure.message, "failed_rank": launch.rank, "exit_code": 1}

    def _precheck_resume(self) -> None:
        """Refuse a mismatched resume before spawning anything (rank 0 checks again when joined)."""
        spec, rollout_len = self.cfg.get("resume") or "never", self.cfg["algo"].get("rollout_len")
        if spec == "never" or rollout_len is None:
            return
        path = CheckpointManager(self.run_dir / "checkpoints").latest() if spec == "auto" else Path(spec)
        if path is not None:
            new = {"world_size": self.world_size, "num_envs": self.cfg["env"]["num_envs"], "rollout_len": rollout_len}
            error = layout_mismatch(load_checkpoint(path)[0]["meta"], new, path)
            if error:
                raise ConfigError(error)

    def _spawn_and_supervise(self) -> dict:
        self._precheck_resume()
        port = free_port(self.master_addr)
        jobs = [RankJob(LaunchInfo(rank=r, world_size=self.world_size, local_rank=r, master_addr=self.master_addr,
                                   master_port=port, source="local"), self.cfg, str(self.run_dir), self.backend,
                        self.timeout_s) for r in range(self.world_size)]
        stop = StopFlag().install()  # Ctrl-C / SIGTERM here -> Stop to every rank (the ranks ignore SIGINT)
        try:
            # auto: fork (the ranks inherit torch and this module: nothing to import) while this process has
            # no other thread and no CUDA context, else forkserver (imported once by the server, not per rank);
            # daemon=False: a rank may start processes of its own (env.vectorization=async)
            with WorkerGroup(start_method="auto", heartbeat_timeout_s=None, start_timeout_s=None,
                             name="rltrain-rank", daemon=False, preload=HEAVY_MODULES) as group:
                for job in jobs:
                    group.start(_spawned_rank, job)  # worker index == rank
                summaries, failures = supervise_ranks(group, stop, timeout_s=self.timeout_s)
        finally:
            stop.uninstall()
        if failures:
            return self._report_failure(primary_failure(failures))
        return summaries[0]

    def _report_failure(self, failure: RankFailure) -> dict:
        if failure.kind == "config":
            raise ConfigError(failure.message)
        if failure.traceback:
            print("".join(f"[rank {failure.rank}] {ln}\n" for ln in failure.traceback.splitlines()),
                  file=sys.stderr, end="", flush=True)
        message = f"rank {failure.rank} {failure.message}" if failure.kind == "died" else \
            f"rank {failure.rank} failed: {failure.message}"
        print(f"rltrain: {message}", file=sys.stderr, flush=True)
        path = self.run_dir / "summary.json"
        try:
            import json

            summary = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            summary = {}
        summary.update(status="failed", error=message, failed_rank=failure.rank, world_size=self.world_size)
        write_summary(self.run_dir, summary)
        return {**summary, "exit_code": 1}
