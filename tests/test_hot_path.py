"""PPO's hot path by counts, not times: the calls made per env step, per update and per evaluation step stay within
the budget recorded in tests/data/hot_path_budget.json (scripts/hot_path_counts.py). A slip of a few calls per env
step is a few per cent of a small env's CPU, which no timing on a shared machine could catch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import hot_path_counts  # noqa: E402


def test_hot_path_calls_stay_within_the_recorded_budget():
    """The real TrainLoop of a seeded CartPole run (numpy backends, and an LSTM core on the torch backends)."""
    res = subprocess.run([sys.executable, "scripts/hot_path_counts.py", "--check"], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, f"{res.stderr}\n{res.stdout}"
    assert "ppo_cleanrl/collect" in res.stdout and "ppo_lstm/learn" in res.stdout, res.stdout


def test_the_budget_names_what_grew():
    """A phase over its budget is one line naming the phase, both totals and the functions that grew most."""
    budget = {"cases": {"ppo_cleanrl": {"collect": {"units": 512, "per_unit": {
        "rltrain/envs/vector.py:VecEnv.step": 0.25, "<numpy.array>": 2.0}}}}}
    same = {"ppo_cleanrl": {"collect": budget["cases"]["ppo_cleanrl"]["collect"]}}
    assert hot_path_counts.compare(same, budget) == []
    grown = {"ppo_cleanrl": {"collect": {"units": 512, "per_unit": {
        "rltrain/envs/vector.py:VecEnv.step": 0.25, "rltrain/envs/vector.py:_put_exact": 2.0, "<numpy.array>": 2.0}}}}
    [line] = hot_path_counts.compare(grown, budget)
    assert line.startswith("ppo_cleanrl/collect: 4.2 calls per env step (rltrain's own 2.2) against a budget of 2.2 "
                           "(0.2)"), line
    assert "grew most: rltrain/envs/vector.py:_put_exact +2" in line, line
    # library calls may drift a little with a library's release; rltrain's own may not
    drift = {"ppo_cleanrl": {"collect": {"units": 512, "per_unit": {
        "rltrain/envs/vector.py:VecEnv.step": 0.25, "<numpy.array>": 2.05}}}}
    assert hot_path_counts.compare(drift, budget) == []
    # a library's calls moved into rltrain (a module call inlined) with fewer calls in all: no slip
    inlined = {"ppo_cleanrl": {"collect": {"units": 512, "per_unit": {
        "rltrain/envs/vector.py:VecEnv.step": 0.25, "rltrain/models/layers.py:MLP.forward": 0.25,
        "<numpy.array>": 1.5}}}}
    assert hot_path_counts.compare(inlined, budget) == []
    missing = hot_path_counts.compare({"ppo_lstm": same["ppo_cleanrl"]}, budget)
    assert missing == ["ppo_lstm/collect: no budget recorded (run scripts/hot_path_counts.py --record)"]


def test_the_recorded_budget_says_where_it_was_measured():
    budget = json.loads((REPO / "tests" / "data" / "hot_path_budget.json").read_text())
    assert set(budget["recorded_at"]) >= {"commit", "numpy", "torch", "gymnasium", "python"}
    assert set(budget["cases"]) == set(hot_path_counts.CASES)
    for phases in budget["cases"].values():
        assert set(phases) == {"collect", "learn", "eval"} and all(p["units"] > 0 for p in phases.values())
