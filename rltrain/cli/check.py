"""``rltrain-check <overrides>``: compose and validate a run without training, and show what it would do.

The thing to run before submitting 500 jobs: it builds the config exactly as ``rltrain`` does (same overrides,
same validation, the algorithm and trainer constructors' keyword checks), then prints the process layout, the
seed table, the batch arithmetic and the output dir. A sweep (``-m a=1,2``: a multirun exactly where ``rltrain``
runs one) first passes the refusals ``rltrain -m`` makes at start (cli/sweep_plan.py), then is expanded and every
job is validated as its launcher runs it; a sampling sweeper's intervals at their ends, mixed.
Exit code 0 when every job is valid, 2 (one line per bad job) otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rltrain.errors import ConfigError

if TYPE_CHECKING:
    from rltrain.trainers.base import Trainer

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def sweep_plan(overrides: list[str]):
    """The multirun's own config, composed as Hydra composes it for ``rltrain -m``, refused where ``rltrain -m``
    refuses it at start (``sweep_plan.refuse_at_start``: nesting, unknown keys), and the sweep's axes."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from rltrain.cli.schema import register
    from rltrain.cli.sweep_plan import refuse_at_start

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        config = loader.load_configuration(config_name="train", overrides=overrides, run_mode=RunMode.MULTIRUN)
        return config, refuse_at_start(config, loader=loader)


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from rltrain.cli.schema import register

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=overrides, return_hydra_config=True)


def output_dir(cfg, overrides: list[str], *, job_num: int | None) -> str:
    """``hydra.run.dir`` (or sweep dir/subdir) as Hydra will resolve it; ``now`` is the current time."""
    from omegaconf import OmegaConf, open_dict

    exclude = set(cfg.hydra.job.config.override_dirname.exclude_keys)
    kept = sorted(o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in exclude
                  and not o.startswith("hydra"))
    with open_dict(cfg):
        cfg.hydra.job.override_dirname = ",".join(kept)
        cfg.hydra.job.num = job_num if job_num is not None else 0
    if job_num is None:
        return str(OmegaConf.select(cfg, "hydra.run.dir"))
    return f"{OmegaConf.select(cfg, 'hydra.sweep.dir')}/{OmegaConf.select(cfg, 'hydra.sweep.subdir')}"


def validate_job(cfg, *, show: bool = True):
    """The full build-time validation of ``build.run`` without starting anything; returns the plain config
    and the trainer built from it (nothing started). ``show``: print the model, as a start does."""
    import copy

    from omegaconf import OmegaConf

    from rltrain.cli import build
    from rltrain.cli.resolvers import check_targets
    from rltrain.run.device import pick_device

    check_targets(cfg)  # as build.to_plain: a target_return that reads a null is refused
    plain = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
    build.validate(plain)
    job = copy.deepcopy(plain)  # what prepare() adds: a root seed (drawn at start when null)
    job["seed_drawn"] = job["seed"] is None
    job["seed"] = 0 if job["seed"] is None else job["seed"]
    if not job["env"].get("search_path"):  # as the rltrain CLI: an env module beside the user (envs/make.py)
        job["env"]["search_path"] = str(Path.cwd())
    # trainer=parallel's agents compose their trainer.agent_overrides over the command line's overrides, which
    # they read from Hydra's runtime config (cli/agents.py): set as `rltrain` has it, else they would miss them
    from hydra.core.hydra_config import HydraConfig

    runtime, previous = HydraConfig.instance(), HydraConfig.instance().cfg
    runtime.set_config(copy.deepcopy(cfg))  # it marks what it gets read-only; output_dir writes to cfg
    try:  # settings, factories, trainer keys: every check a real start makes
        trainer = build.build_trainer(job, Path("."), check_only=True, show=show)  # writes nothing, builds on the CPU
    finally:
        runtime.cfg = previous  # an in-process caller's later compose must not see this job's overrides
    pick_device(plain["device"])
    return plain, trainer


def batch_rows(plain: dict, trainer) -> list[tuple[str, str]]:
    """The batch arithmetic of one update, as the trainer consumes it (``Trainer.update_size``: the sizes the
    run itself works out, PPO's nulls resolved)."""
    from rltrain.cli.multiagent import agent_batch_rows
    from rltrain.data.agents import AgentsSpec

    spec = trainer.settings.env_spec
    if isinstance(spec, AgentsSpec):  # agents, policy groups, slots, rows and bytes: what a multi-agent update holds
        rows = agent_batch_rows(plain, trainer, spec)
    else:
        rows = single_batch_rows(plain, trainer)
    if trainer.capabilities.agent_configs:  # trainer=parallel: the start line's figures, as the agents run
        from rltrain.cli.preflight import budget_line

        rows.append(("agents' budget", str(budget_line(trainer, always=True)).removeprefix("budget: ")))
    for key in ("eval", "log", "checkpoint"):
        rows.append((f"{key}.every_env_steps", str(plain[key]["every_env_steps"])))
    if plain.get("max_wall_time"):
        rows.append(("max_wall_time", f"{plain['max_wall_time']} ({plain['max_wall_time_s']:.0f} s)"))
    return rows


def single_batch_rows(plain: dict, trainer) -> list[tuple[str, str]]:
    """One agent per env: envs x rollout_len (x ranks) env steps per update, the updates, PPO's minibatches."""
    size, workers, envs = trainer.update_size(), trainer.replicas(), plain["env"]["num_envs"]
    total = int(plain["total_env_steps"])
    if trainer.capabilities.agent_configs:  # trainer=parallel: the agents share the budget
        first = trainer.agent_runs()[0]  # agent 0's own sizes (its trainer.agent_overrides applied)
        size, envs = first.update_size(), first.settings.env.num_envs
        shares = [a.total_env_steps for a in trainer.agents]
        budget = (f"{total}, all {len(shares)} agents together: {' / '.join(map(str, shares))} env steps each "
                  "(agent 0's arithmetic below)")
        total = shares[0]
    else:
        budget = f"{total}, all envs and workers together"
    text = size.text if trainer.capabilities.batched_rollouts else \
        f"{envs} envs x {size.rollout_len} rollout_len" + (f" x {workers} ranks" if workers > 1 else "")
    rows = [("env.num_envs", str(envs)), ("total_env_steps", budget),
            ("env steps per update", f"{text} = {size.env_steps}"),
            ("updates", size.updates_text(total))]
    if size.num_minibatches:
        per_rank, n = size.env_steps // workers, size.num_minibatches
        rows.append(("minibatch", f"{per_rank} / {n} minibatches = {per_rank // n} samples, "
                     f"{plain['algo'].get('update_epochs', 1)} epochs"))
    return rows


def seed_rows(plain: dict, trainer: Trainer) -> list[tuple[str, str]]:
    """The seeds the run uses: one process's tree, or each worker's (``Trainer.planned_seed_trees``: a worker's
    tree hangs below the root, so the root's own env seeds are no worker's), as ``seeds.json`` will list them."""
    if plain["seed"] is None:
        return [("root seed", "null: drawn at start (recorded in seeds.json)")]
    trees = trainer.planned_seed_trees()
    if set(trees) == {"main"}:  # one process: its own tree
        tree = trees["main"]
        return [("root seed", str(tree.root)), ("torch seed", str(tree.torch_seed)),
                ("env seeds", _seed_list(tree.env_seeds)), ("eval seed", str(tree.eval_seed))]
    rows = [("root seed", f"{plain['seed']} (each worker's seeds below it)")]
    for name, tree in trees.items():
        envs = f"; envs {_seed_list(tree.env_seeds)}" if tree.env_seeds else ""
        rows.append((name, f"torch {tree.torch_seed}{envs}; eval {tree.eval_seed}"))
    return rows


def _seed_list(seeds: tuple[int, ...]) -> str:
    return ", ".join(map(str, seeds[:8])) + (" ..." if len(seeds) > 8 else "")


def show(console: Console, title: str, rows: list[tuple[str, str]]) -> None:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(escape(k), escape(v))  # values as they are: "[x]" is no style tag here
    console.print(table)


def start_checks(plain: dict, run_dir: Path, *, unread: Collection[str] = (),
                 trainer: Trainer | None = None) -> None:
    """What ``build.run`` checks at start beyond the config, without writing anything: the run dir can be
    written, no live run holds it, and a resume fits (the recorded config, the checkpoint's settings; the keys
    the run does not read, ``unread``, not compared; the process layout ``trainer`` checks, e.g. the distributed
    trainer's global batch)."""
    import fcntl
    import os
    import tempfile

    from rltrain.cli.rundir import check_fresh_run_dir, check_resume_config
    from rltrain.run.checkpoint import CheckpointManager, load_checkpoint
    from rltrain.run.lock import LOCK_FILE
    from rltrain.run.resume_rules import resume_mismatch

    existing = next((p for p in [run_dir, *run_dir.parents] if p.exists()), Path("/"))
    try:  # a probe that leaves nothing behind (os.access says yes to root, also on /proc)
        os.rmdir(tempfile.mkdtemp(prefix=".rltrain-check-", dir=existing))
    except OSError as err:
        raise ConfigError(f"hydra.run.dir={run_dir}: cannot write there ({existing}: {err.strerror or err}); "
                          "pick a writable hydra.run.dir") from None
    lock = run_dir / LOCK_FILE
    if lock.exists():
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"hydra.run.dir={run_dir}: another rltrain run is using this run dir") from None
        finally:
            os.close(fd)
    check_resume_config(plain, run_dir, unread=unread)
    check_fresh_run_dir(plain, run_dir)
    resume = plain.get("resume") or "never"
    if resume == "never":
        return
    path = CheckpointManager(run_dir / "checkpoints").latest(refuse_if_all_corrupt=True) if resume == "auto" \
        else Path(resume)
    if path is None:
        return
    state, _ = load_checkpoint(path)
    meta = state.get("meta") or {}
    error = resume_mismatch(path, meta.get("config") or {}, plain, unread=unread) or \
        (trainer.resume_layout_error(meta, path) if trainer is not None else None)
    if error:
        raise ConfigError(error)


def asks_multirun(argv: list[str]) -> bool:
    """Whether the command line asks for a multirun, as Hydra decides it for ``rltrain``: ``-m`` /
    ``--multirun``, or ``hydra.mode=MULTIRUN``. Read from what the user typed: the overrides after
    ``resolve_experiment`` may have lost an ``experiment=none`` or gained a preset, so their count says nothing."""
    if any(a in ("-m", "--multirun") for a in argv):
        return True
    modes = [o.partition("=")[2] for o in argv if o.partition("=")[0].lstrip("+~") == "hydra.mode"]
    return bool(modes) and modes[-1].upper() == "MULTIRUN"


def check(overrides: list[str], console: Console, *, multirun: bool = False, errors_to: Console | None = None) -> int:
    """Validate the run (or with ``multirun``, every job of the sweep) ``overrides`` describe; 0 or 2. A job's
    error goes to ``errors_to`` (the command line's stderr), else to ``console`` with the tables."""
    errors_to = errors_to or console
    from rltrain.cli import sweep_plan as plan
    from rltrain.cli.unread import say_unread

    # without -m a sweep value (a=1,2) is no sweep: Hydra refuses it in compose below, as it refuses `rltrain`
    jobs, sampled = [overrides], []
    if multirun:
        config, sweep = sweep_plan(overrides)
        jobs = [[*config.hydra.overrides.hydra, *job] for job in plan.jobs(sweep)]
        sampled = [a for a in sweep if a.sampled]
    errors = 0
    for num, job in enumerate(jobs):
        try:
            cfg = compose(plan.as_launched(config, job) if multirun else job)  # what the job runs with
            plain, built = validate_job(cfg, show=num == 0)  # the first job is shown in full
            start_checks(plain, Path(output_dir(cfg, job, job_num=num if multirun else None)),
                         unread=built.settings.unread_keys(), trainer=built)
        except ConfigError as err:
            # escaped: rich reads "[trainer.num_agents]" (an error's fix, a list override) as a style tag and drops it
            errors_to.print(f"[red]job {num} ({escape(' '.join(job))}): error:[/red] {escape(str(err))}",
                            highlight=False)
            errors += 1
            continue
        # what the run would say at start of the settings it leaves unread: a warning, the job stays valid
        say_unread(built, job, prefix=f"[rltrain-check] job {num}:" if multirun
                   else "[rltrain-check]")
        if num > 0:
            continue  # every job is validated; the first one is shown in full
        trainer = str(cfg.hydra.runtime.choices.get("trainer"))
        show(console, f"process layout (trainer={trainer}, start method: "
             f"{plain['trainer'].get('start_method', 'n/a')})", built.describe())
        show(console, "seeds", seed_rows(plain, built))
        algo = cfg.hydra.runtime.choices.get("algo")
        show(console, f"batch arithmetic (algo={algo})", batch_rows(plain, built))
        where = output_dir(cfg, job, job_num=0 if multirun else None)
        launcher = str(cfg.hydra.launcher.get("_target_", "")).rsplit(".", 1)[-1]
        count = f"{len(jobs)} ({launcher})" if not sampled else \
            f"{len(jobs)} checked ({launcher}); the sweeper draws its trials (hydra.sweeper.n_trials)"
        rows = [("run dir" if not multirun else "job 0 dir", where), ("jobs", count)]
        keys = ("partition", "timeout_min", "cpus_per_task", "gpus_per_node", "mem_gb", "tasks_per_node",
                "array_parallelism", "signal_delay_s", "max_num_timeout", "n_jobs")
        rows += [(f"hydra.launcher.{k}", str(cfg.hydra.launcher[k])) for k in keys if k in cfg.hydra.launcher]
        show(console, "output", rows)
    # a sampled interval's draws cannot be listed: its two ends bound them, taken together (sweep_plan.corners)
    where = "every mix of their ends" if len(sampled) <= plan.ALL_CORNERS_UP_TO else \
        "their ends: all low, all high, each alone at its other end"
    ends = f"; sampled by the sweeper, checked at {where}: " + ", ".join(
        f"{a.key} [{a.lines[0].partition('=')[2]}, {a.lines[1].partition('=')[2]}]" for a in sampled)
    console.print(f"{len(jobs) - errors}/{len(jobs)} job(s) valid{ends if sampled else ''}" if multirun else
                  ("valid" if not errors else "invalid"))
    return 2 if errors else 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = [a for a in argv if a not in ("-m", "--multirun")]
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from rltrain.cli.presets import resolve_experiment
    from rltrain.cli.train import one_line
    from rltrain.run.process import init_process

    init_process(torch_threads=1)  # as every rltrain process: each job's networks are built (and initialised)
    try:
        args, line = resolve_experiment(args)  # experiment=auto / none exactly as `rltrain` resolves them
        if line:
            print(f"[rltrain-check] {line}", flush=True)
        # soft_wrap: a line is never broken at the terminal's width (80 columns when piped), so each message stays
        # one line for grep; the tables still fit the width. Errors go to stderr, the report to stdout
        code = check(args, Console(soft_wrap=True), multirun=asks_multirun(argv),
                     errors_to=Console(stderr=True, soft_wrap=True))
    except (HydraException, OmegaConfBaseException) as err:
        print(f"rltrain-check: error: {one_line(err)}", file=sys.stderr)
        code = 2
    except ConfigError as err:
        print(f"rltrain-check: error: {err}", file=sys.stderr)
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main()
