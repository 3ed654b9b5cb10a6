"""Function calls on PPO's hot path, counted (not timed), against the budget recorded in the repo.

    python scripts/hot_path_counts.py              # print the counts of every case beside the budget
    python scripts/hot_path_counts.py --check      # exit 1 naming what grew past the budget (tests/test_hot_path.py)
    python scripts/hot_path_counts.py --record     # write the budget (after a change that is meant to cost more
                                                   # calls, or a library upgrade): tests/data/hot_path_budget.json

A slip in the hot path (a per-step check, a wrapper, a property that goes through ``nn.Module.__getattr__``) costs
CPU on every env step, and timings on a shared machine cannot see a 10% slip. Counts can: every Python function
call and every call of a built-in (``sys.setprofile``'s ``call`` and ``c_call`` events: numpy/torch functions and
array methods; numpy's ufuncs do not raise an event) is counted while the real ``TrainLoop`` of a seeded run

- collects a rollout (``collect``: calls per env step),
- learns from it (``learn``: calls per update, values, GAE, every minibatch step),
- evaluates (``eval``: calls per evaluation env step, both modes, as the run's default evaluation does),

for each case in ``CASES``: PPO at CleanRL's CartPole settings (``experiment=ppo_cleanrl``: the numpy backends)
and the same with an LSTM core (the torch acting and update paths). Seeded runs make the counts exact for given
library versions. ``--check`` fails when a phase's calls inside rltrain grow by more than ``OWN_SLACK`` per
unit, or its calls in all by more than ``ALL_SLACK`` (libraries change their internals between versions),
and names the functions that grew most.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
BUDGET = REPO / "tests" / "data" / "hot_path_budget.json"
OWN_SLACK = 0.02  # calls into rltrain per unit may grow this much (relative) before --check fails ...
ALL_SLACK = 0.05  # ... and all calls this much (a library's patch release may add a call or two)
CASES = {
    "ppo_cleanrl": ["experiment=ppo_cleanrl"],
    "ppo_lstm": ["experiment=ppo_cleanrl", "model.core=lstm"],
}
ROLLOUTS = 2  # counted collect -> learn iterations, after one that is not counted (first-call caches)


def _where(code) -> str:
    """'rltrain/envs/vector.py:VecEnv.step' for rltrain's code, 'gymnasium/core.py:Wrapper.step' for a library's."""
    path = code.co_filename.replace("\\", "/")
    for marker in ("/rltrain/", "/site-packages/", "/lib/python"):
        if marker in path:
            path = path.split(marker, 1)[1] if marker != "/rltrain/" else "rltrain/" + path.split(marker, 1)[1]
            break
    return f"{path.split('/python3.11/')[-1]}:{code.co_qualname}"


def _builtin(fn) -> str:
    owner = getattr(fn, "__self__", None)
    if owner is None or isinstance(owner, type(sys)):
        return f"<{getattr(fn, '__module__', None) or 'builtins'}.{fn.__name__}>"
    return f"<{type(owner).__name__}.{fn.__name__}>"


class CallCounter:
    """``with counter:`` counts every Python and built-in call made inside, by function."""

    def __init__(self):
        self.calls: collections.Counter[str] = collections.Counter()

    def _hook(self, frame, event, arg):
        if event == "call":
            self.calls[_where(frame.f_code)] += 1
        elif event == "c_call":
            self.calls[_builtin(arg)] += 1

    def __enter__(self):
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        self.calls.pop("<sys.setprofile>", None)
        self.calls.pop(_where(CallCounter.__exit__.__code__), None)


def _loop(overrides: list[str], tmp: Path):
    import torch

    from rltrain.cli.build import prepare, settings_from
    from rltrain.run.device import pick_device
    from rltrain.run.seeding import derive
    from rltrain.run.signals import StopFlag
    from rltrain.trainers.hooks import Placement
    from rltrain.trainers.loop import TrainLoop
    from tests.conftest import compose_cfg

    cfg = compose_cfg([*overrides, "seed=1", "logger=quiet", "eval.every_env_steps=0",
                       "checkpoint.every_env_steps=0", "total_env_steps=100000"])
    s = settings_from(prepare(cfg))
    torch.set_num_threads(1)
    return TrainLoop(s, Placement(tmp, derive(s.seed, s.env.num_envs), pick_device("cpu")), StopFlag())


def count_case(overrides: list[str]) -> dict:
    """{phase: {"units": n, "per_unit": {function: calls per unit}}} for one case."""
    from rltrain.envs.deadline import ENV_CALLS

    phases = {p: CallCounter() for p in ("collect", "learn", "eval")}
    units = {"collect": 0, "learn": 0, "eval": 0}
    with tempfile.TemporaryDirectory() as tmp:
        loop = _loop(overrides, Path(tmp))
        algo, source = loop.algo, loop.source
        for i in range(ROLLOUTS + 1):
            counted = i > 0
            with phases["collect"] if counted else _Nothing():
                rollout = source.collect(algo.rollout_len, policy_version=i)
            with phases["learn"] if counted else _Nothing():
                algo.learn(rollout, progress=i / 100)
            if counted:
                units["collect"] += rollout.num_steps
                units["learn"] += 1
        before = ENV_CALLS[0]  # evaluation envs count their steps (envs/vector.py _Counted)
        loop.state.best_eval = float("inf")  # no new best: the checkpoint it would write is not evaluation
        with phases["eval"]:
            loop.evaluate()
        units["eval"] = ENV_CALLS[0] - before
        source.close()
    return {p: {"units": units[p], "per_unit": {k: round(v / units[p], 4) for k, v in sorted(c.calls.items())}}
            for p, c in phases.items()}


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def totals(per_unit: dict[str, float]) -> tuple[float, float]:
    """(calls into rltrain, all calls) per unit."""
    own = sum(v for k, v in per_unit.items() if k.startswith("rltrain/"))
    return own, sum(per_unit.values())


def compare(measured: dict, budget: dict) -> list[str]:
    """One line per phase over its budget, naming the functions that grew most."""
    problems = []
    for case, phases in measured.items():
        for phase, got in phases.items():
            want = budget.get("cases", {}).get(case, {}).get(phase)
            if want is None:
                problems.append(f"{case}/{phase}: no budget recorded (run scripts/hot_path_counts.py --record)")
                continue
            (own, total), (own_b, total_b) = totals(got["per_unit"]), totals(want["per_unit"])
            # calls moved into rltrain from a library (a module call inlined) are no slip when there are at least as
            # many fewer calls in all
            moved = own - own_b <= total_b - total
            if (own <= own_b * (1 + OWN_SLACK) or moved) and total <= total_b * (1 + ALL_SLACK):
                continue
            grew = sorted(((got["per_unit"].get(k, 0) - want["per_unit"].get(k, 0), k)
                           for k in set(got["per_unit"]) | set(want["per_unit"])), reverse=True)
            names = ", ".join(f"{k} +{d:g}" for d, k in grew[:6] if d > 0)
            unit = {"collect": "env step", "learn": "update", "eval": "eval env step"}[phase]
            problems.append(f"{case}/{phase}: {total:.1f} calls per {unit} (rltrain's own {own:.1f}) against a "
                            f"budget of {total_b:.1f} ({own_b:.1f}); grew most: {names}")
    return problems


def versions() -> dict:
    import gymnasium
    import numpy
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return {"commit": commit.stdout.strip() or None, "python": platform.python_version(),
            "numpy": numpy.__version__, "torch": torch.__version__, "gymnasium": gymnasium.__version__}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when a phase grew past its budget")
    ap.add_argument("--record", action="store_true", help=f"write the counts as the budget ({BUDGET.name})")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated: {', '.join(CASES)}")
    args = ap.parse_args(argv)
    wanted = [c for c in args.cases.split(",") if c]
    unknown = [c for c in wanted if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; cases: {', '.join(CASES)}")
    measured = {c: count_case(CASES[c]) for c in wanted}
    budget = json.loads(BUDGET.read_text()) if BUDGET.exists() else {}
    print(f"{'case/phase':22} {'unit':14} {'rltrain':>9} {'all':>9} {'budget':>17}")
    for case, phases in measured.items():
        for phase, got in phases.items():
            own, total = totals(got["per_unit"])
            want = budget.get("cases", {}).get(case, {}).get(phase)
            b = "{:8.1f} {:8.1f}".format(*totals(want["per_unit"])) if want else "none"
            unit = {"collect": "env step", "learn": "update", "eval": "eval step"}[phase]
            print(f"{case + '/' + phase:22} {unit:14} {own:9.1f} {total:9.1f} {b:>17}")
    if args.record:
        BUDGET.parent.mkdir(parents=True, exist_ok=True)
        BUDGET.write_text(json.dumps({"recorded_at": versions(), "cases": measured}, indent=1, sort_keys=True) + "\n")
        print(f"recorded {BUDGET.relative_to(REPO)}")
        return 0
    if args.check:
        problems = compare(measured, budget)
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
