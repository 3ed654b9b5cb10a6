"""Trainer ``parallel``: K independent agents, one process each, aggregated like a proper experiment.

The skrl ParallelTrainer idea (several agents, each on its own scope of environments), but the agents do not
step in lockstep: each agent process runs the very same ``TrainLoop`` as ``trainer=sequential``, on its own
envs (``scopes``), device and seed, and writes a complete run dir ``agent_<k>/``. Agent k's root seed is
``worker_root(seed, (k,))`` (a SeedSequence child, recorded in ``seeds.json``), so ``trainer=sequential
seed=<that seed>`` reproduces it exactly: parallelism changes placement, never results.

The parent only supervises (``workers.WorkerGroup``): it shows one progress table fed by the agents'
messages, reports a failed agent by index with its traceback (or the signal that killed it), stops everyone
on Ctrl-C / SIGTERM (each agent checkpoints), and finally aggregates the final eval returns (mean, median,
IQM, bootstrap 95% CI; see ``rltrain.run.stats``) into ``summary.json`` and draws ``learning_curves.png``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import yaml

from rltrain.run.agents_display import AgentsDisplay, prefix_agent_output
from rltrain.run.device import pick_device
from rltrain.run.plots import few_seeds_note
from rltrain.run.process import init_process
from rltrain.run.seeding import SeedTree, derive, write_seeds
from rltrain.run.signals import StopFlag, StopRequested, during
from rltrain.run.stats import aggregate
from rltrain.run.summary import newest_checkpoint, resume_command
from rltrain.trainers.base import Capabilities, Trainer
from rltrain.trainers.hooks import Placement, TrainerParts
from rltrain.trainers.loop import TrainLoop
from rltrain.trainers.sequential import SequentialTrainer
from rltrain.trainers.settings import ParallelSettings, RunSettings
from rltrain.trainers.supervise import (
    ContextStop,
    Done,
    Exited,
    Failed,
    Started,
    Unresponsive,
    WorkerContext,
    WorkerGroup,
)


# -- messages and the agent process ---------------------------------------------------------------------------
@dataclass(frozen=True)
class AgentJob:
    """Everything an agent process needs: its complete settings (as a sequential run's) and run dir."""

    index: int
    settings: RunSettings
    run_dir: str
    progress_interval_s: float


@dataclass(frozen=True)
class AgentProgress:
    """agent -> parent, at most every ``progress_interval_s`` (and at the end)."""

    index: int
    env_steps: int
    total: int
    sps: float
    episode_return: float | None


class _MessageProgress:
    """Stands in for ``ProgressDisplay`` inside an agent: sends throttled ``AgentProgress`` messages."""

    def __init__(self, ctx: WorkerContext, send_every_s: float, total: int, *, initial: int = 0, **_):
        self.ctx, self.send_every_s, self.total = ctx, send_every_s, total
        self._last = 0.0
        self._latest = AgentProgress(ctx.index, initial, total, 0.0, None)

    def update(self, env_steps: int, *, sps: float, episode_return: float | None,
               per_agent: dict[str, float] | None = None) -> None:
        self._latest = AgentProgress(self.ctx.index, env_steps, self.total, sps, episode_return)
        now = time.monotonic()
        if now - self._last >= self.send_every_s:
            self._last = now
            self.ctx.send(self._latest)

    def close(self, summary: dict | None = None) -> None:
        self.ctx.send(self._latest)


def agent_main(ctx: WorkerContext, job: AgentJob) -> dict:
    """One agent, in its own process: what ``trainer=sequential`` does, minus signal handling (the parent
    decides when everyone stops)."""
    s = job.settings
    init_process(torch_threads=s.torch_threads)
    run_dir = Path(job.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(s.config, sort_keys=False))
    seeds = derive(s.seed, s.env.num_envs)
    write_seeds(run_dir / "seeds.json", s.seed, {"main": seeds}, drawn=False)
    streams = prefix_agent_output(job.index)  # without a TTY: whole lines, each prefixed with the agent
    try:
        place = Placement(run_dir, seeds, pick_device(s.device), title=f"agent_{job.index}")
        # its share's whole updates, as trainer=sequential's run ends (a turn-based env's after their count): the
        # same figures the parent's start line and progress rows give (ParallelTrainer.agent_runs)
        run = SequentialTrainer(settings=s, run_dir=run_dir)
        parts = TrainerParts(progress_factory=partial(_MessageProgress, ctx, job.progress_interval_s),
                             ends_at=run.ends_at(), updates=run.budget_updates())
        loop = TrainLoop(s, place, ContextStop(ctx), parts)
        return loop.run()
    except StopRequested as err:  # stopped while it built its envs or loaded its checkpoint: nothing failed
        ckpt = newest_checkpoint(run_dir)
        return {"status": "interrupted", "stop_reason": f"{err.reason}{during(err)}",
                "checkpoint": str(ckpt) if ckpt else None}
    finally:
        for stream in streams:
            stream.finish()


# -- the parent ------------------------------------------------------------------------------------------------
class ParallelTrainer(Trainer):
    """K agents, one process each. ``agents`` (one ``RunSettings`` per agent) is composed by the CLI from
    ``num_agents``, ``scopes``, ``devices`` and ``agent_overrides`` (cli/agents.py); the trainer only places them."""

    name = "parallel"
    settings_class = ParallelSettings
    capabilities = Capabilities(agent_configs=True)

    def __init__(self, *, settings: RunSettings, run_dir: Path, agents: list[RunSettings],
                 trainer: ParallelSettings = ParallelSettings()):
        """``agents``: every agent's complete settings (cli/agents.py composed and validated them)."""
        super().__init__(settings=settings, run_dir=run_dir)
        self.agents, self.num_agents = agents, len(agents)
        self.agent_overrides = trainer.agent_overrides
        self.start_method, self.on_agent_failure = trainer.start_method, trainer.on_agent_failure
        self.resolved_start_method = trainer.start_method  # auto -> fork or forkserver, once the group decided
        self.heartbeat_timeout_s, self.shutdown_grace_s = trainer.heartbeat_timeout_s, trainer.shutdown_grace_s

    def agent_runs(self) -> list[SequentialTrainer]:
        """Each agent's run as its process makes it (``agent_main``): where it ends (``ends_at``) and its update
        size, for the start line (cli/preflight.py) and the progress rows. Nothing is built or started."""
        return [SequentialTrainer(settings=a, run_dir=self.run_dir / f"agent_{k}") for k, a in enumerate(self.agents)]

    def seed_trees(self) -> dict[str, SeedTree]:
        return {f"agent_{k}": derive(a.seed, a.env.num_envs) for k, a in enumerate(self.agents)}

    def train(self, stop: StopFlag) -> dict:
        K = self.num_agents
        interval = float(self.settings.logger.progress_interval_s)
        jobs = [AgentJob(k, a, str(self.run_dir / f"agent_{k}"), min(interval, 1.0)) for k, a in enumerate(self.agents)]
        overrides = self.agent_overrides or [[]] * K
        records = [{"index": k, "run_dir": f"agent_{k}", "seed": a.seed, "num_envs": a.env.num_envs,
                    "device": a.device, "algo": a.algo_class.__name__, "overrides": overrides[k], "status": "starting"}
                   for k, a in enumerate(self.agents)]
        display = AgentsDisplay([run.ends_at() for run in self.agent_runs()], mode=self.settings.logger.progress,
                                interval_s=interval)
        t0 = time.perf_counter()
        aborted: str | None = None
        try:
            with WorkerGroup(start_method=self.start_method, heartbeat_timeout_s=self.heartbeat_timeout_s,
                             name="rltrain-agent", daemon=False) as group:  # agents may start env processes
                self.resolved_start_method = group.start_method
                for job in jobs:
                    group.start(agent_main, job)
                stopping = False
                while group.alive:
                    if (stop.requested or aborted) and not stopping:
                        stopping = True
                        group.stop_all(stop.reason or aborted or "stop")
                        display.note(f"stopping all agents ({stop.reason or aborted}); each writes a checkpoint")
                    for ev in group.poll(timeout=0.25):
                        failed = self._on_event(ev, records, display, group)
                        if failed is not None and self.on_agent_failure == "abort" and not aborted:
                            aborted = f"on_agent_failure=abort: agent {failed} failed"
                    display.refresh()
                group.shutdown(grace_s=self.shutdown_grace_s)
        finally:
            display.close()
        summary = self._summarize(records, stop, aborted, time.perf_counter() - t0)
        agg = summary["aggregate"]
        if self.settings.logger.progress != "off" and agg["n"]:
            print(f"[parallel] {summary['status']}: {summary['total_env_steps']} env steps over {self.num_agents} "
                  f"agents (total_env_steps={self.settings.total_env_steps}, all agents together); "
                  f"final eval return over {agg['n']} agents: mean {agg['mean']:.2f} "
                  f"(95% CI {agg['ci95_mean'][0]:.2f}..{agg['ci95_mean'][1]:.2f}{few_seeds_note(agg['n'])}), "
                  f"median {agg['median']:.2f}, IQM {agg['iqm']:.2f}; {self.run_dir / 'summary.json'}", flush=True)
        return summary

    def _on_event(self, ev, records: list[dict], display: AgentsDisplay, group: WorkerGroup) -> int | None:
        """Update the records/display; returns the agent index when this event is a failure."""
        if isinstance(ev, AgentProgress):
            display.update(ev.index, env_steps=ev.env_steps, sps=ev.sps, episode_return=ev.episode_return)
        elif isinstance(ev, Started):
            records[ev.index]["status"] = "running"
            display.set_status(ev.index, "running")
        elif isinstance(ev, Done):
            rec = records[ev.index]
            rec.update({k: ev.result.get(k) for k in ("status", "final_eval_return", "final_eval_return_std",
                                                        "best_eval_return", "total_env_steps", "sps", "wall_time_s",
                                                        "solved_at_env_steps", "checkpoint", "stop_reason",
                                                        "final_eval_return_per_agent", "eval_vs_random")
                        if k in ev.result or k not in ("final_eval_return_per_agent", "eval_vs_random")})
            display.set_status(ev.index, rec["status"])
        elif isinstance(ev, (Failed, Exited)):
            rec = records[ev.index]
            error = ev.error if isinstance(ev, Failed) else ev.description
            if isinstance(ev, Exited) and rec.get("killed_because"):  # we killed it: say why, not just the signal
                error = f"killed by rltrain: {rec['killed_because']}"
            rec.update(status="failed", error=error)
            if isinstance(ev, Failed):
                rec["traceback"] = ev.traceback
            display.set_status(ev.index, "failed")
            # one line; the traceback goes to agent_<k>/error.txt (an env fault's loop wrote it already)
            where = self._keep_traceback(ev.index, ev.traceback, error) if isinstance(ev, Failed) else ""
            print(f"rltrain: agent {ev.index} failed: {error}{where}", file=sys.stderr, flush=True)
            return ev.index
        elif isinstance(ev, Unresponsive):
            why = (f"no heartbeat for {ev.silent_s:.0f} s (trainer.heartbeat_timeout_s="
                   f"{self.heartbeat_timeout_s:g}: stuck or hung)")
            records[ev.index]["killed_because"] = why
            print(f"rltrain: agent {ev.index}: {why}; killing it", file=sys.stderr, flush=True)
            group.kill(ev.index)  # its Exited event follows and marks it failed
        return None

    def _keep_traceback(self, index: int, text: str, error: str = "") -> str:
        """Agent ``index``'s traceback in its ``error.txt`` (unless its loop wrote one); the note naming it, unless
        ``error`` (the loop's line) names it already."""
        path = self.run_dir / f"agent_{index}" / "error.txt"
        try:
            if not path.exists():
                path.write_text(text)
        except OSError:
            return ""
        return "" if str(path) in error else f" (traceback in {path})"

    def earlier_wall_s(self) -> float:
        """The parent's wall time in the sessions this one resumes (0 for a fresh start). An agent carries its own
        in its checkpoints; the parent has none, so it reads the summary the last session ended with: this run
        dir's as it was before this session marked it running, or that of the run dir ``resume=`` names. A session
        that crashed without a summary is not counted (its agents' checkpoints still count theirs)."""
        resume = self.settings.resume
        if resume == "never":
            return 0.0
        earlier = self.earlier_summary()
        if resume != "auto" and Path(resume).resolve() != self.run_dir.resolve():
            try:
                earlier = json.loads((Path(resume) / "summary.json").read_text())
            except (OSError, ValueError):
                return 0.0
        wall = earlier.get("wall_time_s") if isinstance(earlier, dict) and earlier.get("trainer") == self.name \
            else None
        return float(wall) if isinstance(wall, (int, float)) and math.isfinite(wall) and wall > 0 else 0.0

    def _summarize(self, records: list[dict], stop: StopFlag, aborted: str | None, wall: float) -> dict:
        from rltrain.run.plots import plot_learning_curves, read_curve

        for r in records:  # what a resume continues from: also for an agent that failed or was killed
            if not r.get("checkpoint"):
                found = newest_checkpoint(self.run_dir / r["run_dir"])
                r["checkpoint"] = str(found) if found else None
        finals = [r.get("final_eval_return") for r in records if r["status"] == "completed"]
        agg = aggregate(finals)
        n_failed = sum(r["status"] == "failed" for r in records)
        interrupted = stop.requested and not aborted
        if interrupted:
            status = "interrupted"
        elif n_failed and (aborted or agg["n"] == 0):
            status = "failed"
        elif n_failed:
            status = "partial"  # on_agent_failure=continue: the aggregate covers the agents that completed
        else:
            status = "completed"
        curves = None
        panels = {name: {f"agent_{r['index']}": read_curve(self.run_dir / r["run_dir"] / "metrics.csv", col)
                         for r in records}
                  for name, col in (("training return", "rollout/episode_return"), ("eval return", "eval/return_mean"))}
        try:
            curves = plot_learning_curves(panels, self.run_dir / "learning_curves.png",
                                          title=f"{self.num_agents} agents, {self.settings.env.id}").name
        except Exception as err:  # a figure must never cost the run its summary
            print(f"rltrain: could not draw learning curves: {err}", file=sys.stderr)
        summary = {
            "status": status,
            "trainer": "parallel",
            "num_agents": self.num_agents,
            "start_method": self.resolved_start_method,
            "seed": self.settings.seed,
            "env_id": self.settings.env.id,
            # the budget of all agents together, as under every trainer, and the steps they took
            "budget_env_steps": self.settings.total_env_steps,
            "total_env_steps": sum(int(r.get("total_env_steps") or 0) for r in records),
            "final_eval_return": agg["mean"],  # what the CLI returns to sweepers (aggregate mean)
            "aggregate": agg,
            **per_agent_means(records),
            "agents": records,
            "failed_agents": [r["index"] for r in records if r["status"] == "failed"],
            "wall_time_s": self.earlier_wall_s() + wall,  # the run's, over its sessions, as each agent's
            "learning_curves": curves,
            "exit_code": stop.exit_code if interrupted else 1 if status == "failed" else 0,
        }
        if interrupted:
            summary["stop_reason"] = stop.reason
            summary["resume_command"] = resume_command(self.run_dir)
        elif aborted:
            summary["stop_reason"] = aborted
        return summary


def per_agent_means(records: list[dict]) -> dict:
    """A multi-agent env's teams: each agent's final return, averaged over the teams that completed ({} for a
    single-agent env)."""
    teams = [r["final_eval_return_per_agent"] for r in records
             if r["status"] == "completed" and r.get("final_eval_return_per_agent")]
    if not teams:
        return {}
    return {"final_eval_return_per_agent": {a: float(sum(t[a] for t in teams) / len(teams)) for a in teams[0]}}
