"""The timed runs ``scripts/bench_throughput.py`` builds its rows from, each returning what it measured:

- ``measure_train``: rltrain's real ``TrainLoop`` in this process, steps/s (wall and CPU) over a measured span
  after a warm-up, marked at rollout starts and at the end of the last ``learn()``;
- ``run_cli``: a whole ``python -m rltrain`` process (start-up, training, final evaluation), its wall and CPU
  time and its ``summary.json``;
- ``run_peer``: ``scripts/peers/sb3_ppo.py`` under a peer library's Python, its wall time and JSON result.

The processes are timed by ``bench_offpolicy.timed`` (wall time, and the CPU of the child's process tree from
this process's children rusage), as the other benchmarks time theirs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
for _path in (REPO, SCRIPTS):  # this checkout's rltrain and tests.conftest; the scripts beside this one
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from bench_offpolicy import path_env, timed  # noqa: E402

PEER = SCRIPTS / "peers" / "sb3_ppo.py"


def clock() -> tuple[float, float]:
    """(wall s, this process's CPU s), read together."""
    return time.perf_counter(), time.process_time()


def measure_train(overrides: list[str], *, warmup: int, measure: int) -> tuple[float, float, dict]:
    """(wall SPS, CPU SPS, summary) of ``TrainLoop.run`` between the end of ``warmup`` steps and the end.

    The loop is the real one (collector, learn, bookkeeping, logging); evaluation and checkpoints are
    off during the measured span, and rollout starts are timestamped by wrapping ``collector.collect``.
    """
    import torch

    from rltrain.cli.build import prepare, settings_from
    from rltrain.run.device import pick_device
    from rltrain.run.seeding import derive
    from rltrain.run.signals import StopFlag
    from rltrain.trainers.hooks import Placement
    from rltrain.trainers.loop import TrainLoop
    from tests.conftest import compose_cfg

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose_cfg([*overrides, "logger=quiet", "eval.every_env_steps=0", "checkpoint.every_env_steps=0",
                           "eval.episodes=1", f"total_env_steps={warmup + measure}"])
        s = settings_from(prepare(cfg))
        torch.set_num_threads(s.torch_threads)
        place = Placement(Path(tmp), derive(s.seed, s.env.num_envs), pick_device(s.device))
        loop = TrainLoop(s, place, StopFlag())
        marks: list[tuple[int, float, float]] = []
        collect = loop.source.collect

        def timed_collect(*a, **kw):
            marks.append((loop.counters["env_steps"], *clock()))
            return collect(*a, **kw)

        loop.source.collect = timed_collect  # type: ignore[method-assign]
        loop.algo.learn = _wrap_end(loop.algo.learn, marks, loop)  # type: ignore[method-assign]
        summary = loop.run()
    start = next(m for m in marks if m[0] >= warmup)
    end = marks[-1]
    n = end[0] - start[0]
    return n / (end[1] - start[1]), n / (end[2] - start[2]), summary


def _wrap_end(learn: Callable, marks: list, loop) -> Callable:
    """Marks the end of the last learn() too, so the measured span covers whole iterations."""

    def timed_learn(rollout, **kw):
        out = learn(rollout, **kw)
        marks.append((loop.counters["env_steps"] + rollout.num_steps, *clock()))
        return out

    return timed_learn


def run_cli(cli_args: list[str], cwd: Path) -> tuple[float, float, dict]:
    """Run ``python -m rltrain <args>`` in ``cwd``; (wall s, child CPU s, summary.json)."""
    wall, cpu, _ = timed([sys.executable, "-m", "rltrain", *cli_args, f"hydra.run.dir={cwd}/run"], cwd=cwd,
                         env=path_env(REPO), timeout=900)
    return wall, cpu, json.loads((cwd / "run" / "summary.json").read_text())


def run_peer(python: str, *cli: str, timeout: float = 3600) -> tuple[float, dict]:
    """Run ``scripts/peers/sb3_ppo.py <cli>`` under the peer's Python: (wall s, its JSON result line)."""
    wall, _, proc = timed([python, str(PEER), *cli], cwd=Path.cwd(), env=dict(os.environ), timeout=timeout)
    return wall, json.loads(proc.stdout.strip().splitlines()[-1])
