"""Trainers declare what they are and what one update consumes; the CLI asks them (cli/preflight.py,
cli/check.py, cli/build.py) instead of testing their names or attributes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rltrain.cli.build import build_trainer, prepare
from rltrain.cli.schema import options
from rltrain.trainers.base import Trainer
from tests.conftest import compose_cfg

CLI = Path(__file__).resolve().parent.parent / "rltrain" / "cli"
SMOKE = ["debug=smoke", "env.num_envs=2", "algo.rollout_len=16", "total_env_steps=4096"]


def built(tmp_path: Path, overrides: list[str]) -> Trainer:
    cfg = compose_cfg([*SMOKE, *overrides])
    return build_trainer(prepare(cfg), tmp_path)


@pytest.mark.parametrize("choice", sorted(options("trainers")))
def test_every_trainer_names_its_choice(tmp_path, choice):
    trainer = built(tmp_path, [f"trainer={choice}"])
    assert trainer.name == choice
    assert trainer.describe()  # rltrain-check's process layout comes from the trainer


def test_update_size_follows_the_trainer(tmp_path):
    seq = built(tmp_path / "a", ["trainer=sequential"]).update_size()
    assert (seq.env_steps, seq.env_processes) == (32, 2)
    dist = built(tmp_path / "b", ["trainer=distributed_simulator", "trainer.world_size=3"])
    assert dist.capabilities.all_reduce and dist.replicas() == 3
    assert dist.update_size().env_steps == 96 and "trainer.world_size (3)" in dist.update_size().text
    actors = built(tmp_path / "c", ["trainer=subprocess_actors", "trainer.num_actors=3",
                                    "trainer.batch_rollouts=2", "trainer.envs_per_actor=4"])
    size = actors.update_size()
    assert actors.capabilities.batched_rollouts
    assert (size.env_steps, size.env_processes) == (2 * 4 * 16, 3 * 4)
    assert built(tmp_path / "d", ["trainer=parallel"]).capabilities.agent_configs


def test_the_cli_never_tests_a_trainer_by_name_or_attribute():
    """No ``hasattr`` in cli/ and no comparison against a trainer's name: the trainer declares it."""
    names = set(options("trainers"))
    assert names == {"sequential", "parallel", "distributed_simulator", "subprocess_actors"}
    found = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr":
                found.append(f"{path.name}:{node.lineno} hasattr")
            if isinstance(node, ast.Compare):
                consts = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                found += [f"{path.name}:{node.lineno} compares to {c!r}" for c in consts if c in names]
    assert found == []


@pytest.mark.parametrize("overrides", [["trainer=parallel"], ["trainer=distributed_simulator"],
                                       ["algo=impala", "trainer=subprocess_actors"]])
def test_check_shows_the_seeds_each_worker_runs_with(tmp_path, monkeypatch, overrides):
    """rltrain-check's seeds table gives every worker's seeds, as seeds.json will: a worker's tree hangs below the
    root, so the root's own env seeds (the table showed them alone) are no worker's."""
    from rich.console import Console

    from rltrain.cli import check
    from rltrain.cli.presets import resolve_experiment
    from rltrain.run.seeding import derive

    monkeypatch.chdir(tmp_path)
    console = Console(record=True, width=400)
    assert check.check(resolve_experiment([*SMOKE, *overrides, "hydra.run.dir=run"])[0], console) == 0
    said = console.export_text()
    table = said[said.index("root seed"):said.index("batch arithmetic")]
    trainer = built(tmp_path, overrides)
    trees = trainer.seed_trees() or {"learner": derive(1, 0), **{f"actor_{k}_gen_0": trainer.actor_seeds(k, 0)
                                                                 for k in range(trainer.num_actors)}}
    assert len(trees) > 1
    for name, tree in trees.items():  # what the run records in seeds.json (a fresh run's first actors)
        assert f"{name} " in table and f"torch {tree.torch_seed}" in table and f"eval {tree.eval_seed}" in table
        assert all(str(s) in table for s in tree.env_seeds)
    assert str(derive(1, 2).env_seeds[0]) not in table  # the root's own: no worker's
