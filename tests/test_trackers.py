"""logger=wandb / logger=mlflow: real runs, read back from W&B's offline run file and MLflow's store."""

from __future__ import annotations

import csv
import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

SMOKE = ["debug=smoke", "env.num_envs=2", "log.every_env_steps=512", "logger.progress=off"]
REPO = str(Path(__file__).resolve().parents[1])


def no_network_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Offline W&B with no key anywhere it looks (a fresh HOME / config dir), and a server URL that refuses."""
    with socket.socket() as s:  # a port nobody listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "WANDB_CONFIG_DIR": str(home / ".config" / "wandb"), "WANDB_API_KEY": "",
            "WANDB_BASE_URL": f"http://127.0.0.1:{port}", "WANDB_MODE": "offline", "WANDB_PROJECT": "",
            "WANDB_ENTITY": "", "WANDB_DIR": "", "WANDB_INIT_TIMEOUT": "30", **extra}


def _csv_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def wandb_records(run_dir: Path) -> list:
    """Every record of the one offline run under ``run_dir/wandb``.

    The ``.wandb`` file is a LevelDB-style log (a 7-byte ``:W&B`` header, then 32 KiB blocks of records, each
    with a 7-byte header: crc32, length, kind = full / first / middle / last) of ``wandb_internal_pb2.Record``.
    """
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    return wandb_file_records(path)


def wandb_file_records(path: Path) -> list:
    """The records of one offline run's ``.wandb`` file (``wandb_records``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, pending, records = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the block's end
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)  # "rollout/episode_return" arrives as nested parts


def wandb_readback(run_dir: Path) -> dict:
    """{"run": RunRecord, "config": {key: value}, "history": [{key: value}], "summary": {key: value}}."""
    out: dict = {"config": {}, "history": [], "summary": {}}
    for record in wandb_records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            out["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in record.summary.update})
    return out


def _same_scalars(csv_rows: list[dict], logged: list[dict[str, float]]) -> None:
    """Every CSV row's non-empty scalars were logged under the same names at the same env step."""
    by_step: dict[int, dict] = {}
    for point in logged:
        by_step.setdefault(int(point["_step"]), {}).update(point)
    assert sorted(by_step) == sorted(int(float(r["env_steps"])) for r in csv_rows)
    for row in csv_rows:
        point = by_step[int(float(row["env_steps"]))]
        for key, value in row.items():
            if key != "env_steps" and value != "":
                assert point[key] == pytest.approx(float(value), rel=1e-6), key


def test_wandb_offline_logs_csv_scalars_config_and_summary(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    res = run_cli([*SMOKE, "logger=wandb", "logger.mode=offline", "logger.progress=off", "logger.tags=[smoke,ci]",
                   f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    back = wandb_readback(run_dir)
    assert back["run"].project == "rltrain" and back["run"].display_name == "run"
    assert list(back["run"].tags) == ["smoke", "ci"]
    assert back["config"]["algo.lr"] == pytest.approx(0.002) and back["config"]["env.id"] == "CartPole-v1"
    _same_scalars(_csv_rows(run_dir), back["history"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert back["summary"]["final_eval_return"] == pytest.approx(summary["final_eval_return"])
    assert back["summary"]["total_env_steps"] == summary["total_env_steps"]
    assert back["summary"]["status"] == "completed"
    assert "checkpoint" not in back["summary"]  # numbers only


def _mlflow_client(store: Path):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=str(store))


def test_mlflow_local_store_logs_csv_scalars_params_and_summary(tmp_path):
    pytest.importorskip("mlflow")
    run_dir = tmp_path / "run"
    res = run_cli([*SMOKE, "logger=mlflow", "logger.progress=off", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                  timeout=300)
    assert res.returncode == 0, res.stderr
    client = _mlflow_client(run_dir / "mlruns")
    (run,) = client.search_runs([client.get_experiment_by_name("rltrain").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params["algo.lr"] == "0.002" and run.data.params["env.id"] == "CartPole-v1"
    rows = _csv_rows(run_dir)
    keys = {k for r in rows for k, v in r.items() if v != "" and k != "env_steps"}
    logged = []
    for key in keys:
        for m in client.get_metric_history(run.info.run_id, key):
            logged.append({"_step": m.step, key: m.value})
    summary = json.loads((run_dir / "summary.json").read_text())
    final = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "total_env_steps")}
    assert final == {summary["total_env_steps"]: summary["total_env_steps"]}
    assert run.data.metrics["final_eval_return"] == pytest.approx(summary["final_eval_return"])
    assert run.data.tags["status"] == "completed"
    # the summary's final metrics share the last row's step; compare the log rows themselves
    logged = [p for p in logged if "final_eval_return" not in p]
    _same_scalars(rows, logged)


def test_a_resumed_run_continues_its_tracker_runs_and_sends_no_step_twice(tmp_path):
    """resume=auto goes on in the same MLflow run (one run, its parameters once) and the same W&B run id (offline:
    a second offline-run dir of that id, which `wandb sync` uploads into it); steps only ever increase."""
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    both = ["logger.sinks=[csv,wandb,mlflow]", "logger.mode=offline", f"hydra.run.dir={run_dir}"]
    for extra in ([], ["resume=auto", "total_env_steps=3072"]):
        res = run_cli([*SMOKE, *both, *extra], cwd=tmp_path, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
    client = _mlflow_client(run_dir / "mlruns")
    (run,) = client.search_runs([client.get_experiment_by_name("rltrain").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["algo.lr"] == "0.002"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "rollout/episode_return")]
    assert steps == sorted(set(steps)) and steps[-1] == 3072 and 1024 in steps, steps
    files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    ids = {path.name.removeprefix("run-").removesuffix(".wandb") for path in files}
    assert len(files) == 2 and len(ids) == 1, files
    sent = [int(r.history.step.num) for path in files for r in wandb_file_records(path)
            if r.WhichOneof("record_type") == "history"]
    assert sent == sorted(set(sent)) and sent[-1] == 3072, sent
    record = json.loads((run_dir / "trackers.json").read_text())
    assert record["mlflow"] == {"id": run.info.run_id, "last_step": 3072, "final_step": 3072}
    assert record["wandb"]["id"] in ids and record["wandb"]["final_step"] == 3072


def test_resuming_a_finished_run_sends_the_tracker_nothing_it_has(tmp_path):
    """A run that completed, resumed in its run dir (resume=auto, then resume=<run dir>), has nothing left to
    train: the MLflow run gets neither its rows nor the summary's final metrics again (one point per final
    metric, at the run's last step) and stays FINISHED."""
    pytest.importorskip("mlflow")
    run_dir = tmp_path / "run"
    for extra in ([], ["resume=auto"], [f"resume={run_dir}"]):
        res = run_cli([*SMOKE, "logger=mlflow", f"hydra.run.dir={run_dir}", *extra], cwd=tmp_path, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
    client = _mlflow_client(run_dir / "mlruns")
    (run,) = client.search_runs([client.get_experiment_by_name("rltrain").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "completed"
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("final_eval_return", "total_env_steps", "train_return_last100"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == [summary["total_env_steps"]], (key, history)
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "rollout/episode_return")]
    assert steps == sorted(set(steps)), steps


def test_a_tracker_gets_no_step_it_was_sent_before_a_crash(tmp_path, monkeypatch):
    """After a crash the replayed training comes again through steps the tracker already has: they are not sent."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a directory store named by tracking_uri
    from rltrain.run.trackers import MLflowLogger

    common = {"config": {"algo": {"lr": 0.1}}, "project": "p", "group": None, "name": None, "tags": (),
              "tracking_uri": str(tmp_path / "mlruns")}
    first = MLflowLogger(tmp_path, **common)
    for step in (100, 200, 300):
        first.log(step, {"x": float(step)})  # the crash: never closed
    again = MLflowLogger(tmp_path, **common, resumed=True)  # resumed from a checkpoint at step 150
    for step in (200, 300, 400):
        again.log(step, {"x": step + 0.5})
    again.close(None)
    assert again.run_id == first.run_id
    history = [(m.step, m.value) for m in again.client.get_metric_history(again.run_id, "x")]
    assert sorted(history) == [(100, 100.0), (200, 200.0), (300, 300.0), (400, 400.5)]


@pytest.mark.slow
def test_mlflow_multirun_groups_jobs_in_the_sweep_store(tmp_path):
    pytest.importorskip("mlflow")
    sweep = tmp_path / "sweep"
    res = run_cli(["-m", "seed=1,2", *SMOKE, "logger=mlflow", "logger.progress=off", f"hydra.sweep.dir={sweep}"],
                  cwd=tmp_path, timeout=400)
    assert res.returncode == 0, res.stderr
    client = _mlflow_client(sweep / "mlruns")
    runs = client.search_runs([client.get_experiment_by_name("rltrain").experiment_id])
    jobs = sorted(p.name for p in sweep.iterdir() if (p / "summary.json").exists())
    assert len(jobs) == 2 and jobs[0].startswith("0_") and jobs[0].endswith("seed=1")
    assert sorted(r.info.run_name for r in runs) == jobs  # one run per job, named by its job dir
    assert {r.data.tags["group"] for r in runs} == {"sweep"}


@pytest.mark.slow
def test_wandb_parallel_opens_one_run_per_agent(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "exp"
    res = run_cli([*SMOKE, "trainer=parallel", "logger=wandb", "logger.mode=offline", "logger.progress=off",
                   f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=400)
    assert res.returncode == 0, res.stderr
    for k in (0, 1):
        back = wandb_readback(run_dir / f"agent_{k}")
        assert back["run"].display_name == f"agent_{k}" and back["run"].run_group == "exp"
        _same_scalars(_csv_rows(run_dir / f"agent_{k}"), back["history"])
    assert not (run_dir / "wandb").exists()  # the parent process logs nothing itself


@pytest.mark.slow
def test_wandb_distributed_logs_from_rank_0_only(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "dist"
    res = run_cli([*SMOKE, "trainer=distributed_simulator", "trainer.timeout_s=60", "logger=wandb",
                   "logger.mode=offline", "logger.progress=off", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                  timeout=400, env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    assert len(list(tmp_path.rglob("offline-run-*"))) == 1  # one tracker run for the whole job
    back = wandb_readback(run_dir)
    _same_scalars(_csv_rows(run_dir), back["history"])
    assert back["summary"]["world_size"] == 2


def test_a_missing_tracker_package_is_one_line_naming_the_extra(tmp_path):
    # a `wandb` that cannot be found: a meta-path finder placed first answers None for it
    hide = ("import importlib.abc, sys\n"
            "class Hide(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'wandb':\n"
            "            raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Hide())\n")
    (tmp_path / "sitecustomize.py").write_text(hide)
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    res = run_cli([*SMOKE, "logger=wandb", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip() == ("rltrain: error: logger.sinks=wandb: the wandb package is missing; "
                                  "pip install 'rltrain[wandb]'")


def test_unknown_sink_is_one_line(tmp_path):
    res = run_cli([*SMOKE, "logger.sinks=[csv,wandbb]", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                  timeout=120)
    assert res.returncode == 2
    err = res.stderr.strip()
    assert err.count("\n") == 0 and "unknown sink 'wandbb'" in err and "wandb" in err


def test_trackers_are_not_imported_unless_chosen(tmp_path):
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('TRACKERS', sorted(m for m in ('wandb', 'mlflow') if m in sys.modules)))\n"
            "sys.argv = ['rltrain', " + ", ".join(repr(a) for a in [*SMOKE, f"hydra.run.dir={tmp_path / 'run'}"]) +
            "]\nfrom rltrain.cli.train import main\nmain()\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert res.returncode == 0, res.stderr
    assert "TRACKERS []" in res.stdout


def test_wandb_follows_its_environment_offline_without_key_or_network(tmp_path):
    pytest.importorskip("wandb")
    run_dir, wandb_dir = tmp_path / "run", tmp_path / "wandb_home"
    wandb_dir.mkdir()
    env = no_network_env(tmp_path, WANDB_PROJECT="from-env", WANDB_DIR=str(wandb_dir))
    res = run_cli([*SMOKE, "logger=wandb", f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert not (run_dir / "wandb").exists()  # WANDB_DIR decides where the run goes
    back = wandb_readback(wandb_dir)
    assert back["run"].project == "from-env" and back["run"].display_name == "run"
    assert back["config"]["seed"] == back["config"]["seeds.root"]
    assert str(back["config"]["seeds.torch_seed"]) in (run_dir / "seeds.json").read_text()
    assert back["config"]["system.torch"] and back["config"]["system.device"] == "cpu"
    assert back["config"]["system.cpu_count"] == os.cpu_count()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert back["summary"]["sps"] == pytest.approx(summary["sps"])
    # the last stderr line names the directory `wandb sync` uploads: the offline run with its .wandb file
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("rltrain: W&B offline run saved; upload it with: wandb sync ")
    sync_dir = Path(line.rsplit(" ", 1)[1])
    assert sync_dir.name.startswith("offline-run-") and sync_dir.parent == wandb_dir / "wandb"
    assert list(sync_dir.glob("run-*.wandb"))


def test_wandb_online_without_a_key_is_one_line_naming_both_fixes(tmp_path):
    pytest.importorskip("wandb")
    env = no_network_env(tmp_path, WANDB_MODE="online")
    res = run_cli([*SMOKE, "logger=wandb", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=180, env=env)
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert err.startswith("rltrain: error: logger=wandb: no W&B API key")
    assert "`wandb login`" in err and "WANDB_MODE=offline" in err


def test_logger_mode_set_in_the_config_wins_over_the_environment(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    env = no_network_env(tmp_path, WANDB_MODE="online")
    res = run_cli([*SMOKE, "logger=wandb", "logger.mode=offline", "logger.project=mine",
                   f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert wandb_readback(run_dir)["run"].project == "mine"


def test_mlflow_follows_its_environment(tmp_path):
    pytest.importorskip("mlflow")
    run_dir, store = tmp_path / "run", tmp_path / "store"
    env = {"MLFLOW_TRACKING_URI": store.as_uri(), "MLFLOW_EXPERIMENT_NAME": "from-env",
           "MLFLOW_ALLOW_FILE_STORE": "true"}
    res = run_cli([*SMOKE, "logger=mlflow", f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert not (run_dir / "mlruns").exists()
    client = _mlflow_client(store)
    (run,) = client.search_runs([client.get_experiment_by_name("from-env").experiment_id])
    params = run.data.params
    assert params["seeds.root"] == params["seed"] and params["system.device"] == "cpu" and params["system.torch"]
    assert run.data.metrics["sps"] == pytest.approx(json.loads((run_dir / "summary.json").read_text())["sps"])



def test_mlflow_refusing_a_directory_store_is_one_line_naming_both_fixes(tmp_path):
    """MLFLOW_TRACKING_URI naming a directory without MLFLOW_ALLOW_FILE_STORE: MLflow 3 refuses its file store;
    the run stops before training with one line (the opt-in, or a database URI), and writes nothing."""
    pytest.importorskip("mlflow")
    run_dir, store = tmp_path / "run", tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "HYDRA_FULL_ERROR"))}
    env["MLFLOW_TRACKING_URI"] = str(store)
    res = subprocess.run([sys.executable, "-m", "rltrain", *SMOKE, "logger=mlflow", f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"rltrain: error: logger=mlflow: MLflow 3 opens the directory store {store} only "
                                 "with MLFLOW_ALLOW_FILE_STORE=true; set it, or use a database store: "
                                 f"MLFLOW_TRACKING_URI=sqlite:///{store}.db")
    assert not run_dir.exists() and not store.exists()

@pytest.mark.slow
def test_wandb_multirun_jobs_are_runs_grouped_by_sweep(tmp_path):
    pytest.importorskip("wandb")
    sweep = tmp_path / "sweep"
    res = run_cli(["-m", "seed=1,2", *SMOKE, "logger=wandb", f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                  timeout=400, env=no_network_env(tmp_path))
    assert res.returncode == 0, res.stderr
    jobs = sorted(p for p in sweep.iterdir() if (p / "summary.json").exists())
    assert len(jobs) == 2
    for job in jobs:
        back = wandb_readback(job)
        assert back["run"].display_name == job.name and back["run"].run_group == "sweep"
        assert back["config"]["seed"] == int(job.name[-1])
