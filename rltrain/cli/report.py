"""``rltrain-report <multirun dir | run dirs ...>``: final returns grouped by configuration, seeds aggregated.

A run is any directory with a ``summary.json`` (a sweep job, a single run, or an ``agent_<k>/`` of a parallel
run: a run dir with agent subdirs is reported per agent). Runs are grouped by the config keys that differ
between them, leaving out the seed (and other keys that do not change the experiment: resume, logging), so a
sweep ``algo=ppo,a2c seed=1,2,3`` gives two rows of three seeds. Per group: mean, median, IQM and a bootstrap
95% CI of the mean of the final eval return (Agarwal et al. 2021: with few seeds, report intervals and robust
statistics), wall time, and how many runs failed. An interval from fewer than 5 seeds is marked ``(n<5)`` and
a warning line says so. A run stopped before its budget (``max_wall_time``, a signal) has no final return: its
last eval goes into a row of its own, marked ``(interrupted: last eval)``, with a warning line. A run that ended
before writing its ``config.yaml`` is grouped by what Hydra composed for it (``.hydra/config.yaml``). A PNG of
learning curves (one subplot per configuration and env, each with its own y axis; each run thin, the group mean
with its band) is drawn from the runs' ``metrics.csv`` where asked: ``--plot PATH``, or beside ``--out``'s
markdown. The report only reads run dirs; it writes nothing it was not asked for.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from rltrain.cli.args import OneLineParser
from rltrain.run.plots import MIN_SEEDS_FOR_CI, plot_learning_curves, read_curve
from rltrain.run.stats import aggregate

IGNORED = ("seed", "seed_drawn", "resume", "logger.", "allow_nested_processes", "max_wall_time", "hydra.")
SKIP_DIRS = {".submitit", "checkpoints", "tensorboard", ".hydra"}


def warn(message: str) -> None:
    print(f"rltrain-report: warning: {message}", file=sys.stderr)


def find_runs(paths: list[Path]) -> list[Path]:
    """Run dirs under ``paths`` (a parallel run's ``agent_<k>/`` replace their parent), sorted, unique.

    Each real directory is visited once: a symlink loop (a link to an ancestor) ends the walk there."""
    runs: list[Path] = []
    seen: set[tuple[int, int]] = set()

    def visit(d: Path) -> None:
        try:
            st = d.stat()
        except OSError:
            return  # a dangling link, a dir removed meanwhile
        if (st.st_dev, st.st_ino) in seen:
            return
        seen.add((st.st_dev, st.st_ino))
        try:
            agents = sorted(p for p in d.glob("agent_*") if (p / "summary.json").exists())
            if agents:
                runs.extend(agents)
            elif (d / "summary.json").exists():
                runs.append(d)
            else:
                for child in sorted(p for p in d.iterdir() if p.is_dir() and p.name not in SKIP_DIRS):
                    visit(child)
        except OSError as err:  # unreadable dir
            warn(f"skipping {d}: {err.strerror or err}")

    for p in paths:
        if not Path(p).is_dir():
            raise SystemExit(f"rltrain-report: error: {p} is not a directory")
        visit(Path(p))
    return sorted(dict.fromkeys(runs))


def flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v) if isinstance(v, list) else v
    return out


def load_run(run: Path) -> dict | None:
    """The run's summary, config and overrides; None (with one warning) when a file is malformed."""
    try:
        summary = json.loads((run / "summary.json").read_text())
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
        cfg = run_config(run)
        if not isinstance(cfg or {}, dict):
            raise ValueError("config.yaml is not a mapping")
        overrides = typed_overrides(run)
    except (OSError, ValueError, yaml.YAMLError) as err:  # UnicodeDecodeError and JSONDecodeError included
        warn(f"skipping {run}: a malformed file ({type(err).__name__}: {str(err).splitlines()[0][:200]})")
        return None
    for key in ("final_eval_return", "wall_time_s"):  # numbers or nothing: a string here is a malformed file
        if not _number(summary.get(key)):
            summary[key] = None
    return {"dir": run, "summary": summary, "config": flatten(cfg or {}), "overrides": overrides}


def run_config(run: Path) -> object:
    """The run's ``config.yaml``; for a run that ended before writing it (refused at start, a bad swept value),
    what Hydra composed for it before the task (``.hydra/config.yaml``), with the launch dir as ``env.search_path``
    as the run records it (``cli.train.prepare_job``): grouped and labelled with the runs of its configuration,
    not as a run of no algorithm on no env."""
    if (run / "config.yaml").exists():
        return yaml.safe_load((run / "config.yaml").read_text())
    composed, hydra = run / ".hydra" / "config.yaml", run / ".hydra" / "hydra.yaml"
    cfg = yaml.safe_load(composed.read_text()) if composed.exists() else {}
    env = cfg.get("env") if isinstance(cfg, dict) else None
    if isinstance(env, dict) and not env.get("search_path") and hydra.exists():
        runtime = ((yaml.safe_load(hydra.read_text()) or {}).get("hydra") or {}).get("runtime") or {}
        env["search_path"] = runtime.get("cwd")
    return cfg


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def typed_overrides(run: Path) -> dict[str, str] | None:
    """The job's command-line overrides as the user typed them (``.hydra/overrides.yaml``; a parallel
    run's agents share their parent's): {"algo": "ppo", "seed": "1"}; None when Hydra wrote none."""
    for d in (run, run.parent):
        path = d / ".hydra" / "overrides.yaml"
        if path.exists():
            items = yaml.safe_load(path.read_text()) or []
            if not isinstance(items, list):
                raise ValueError(f"{path} is not a list of overrides")
            return {k.lstrip("+~"): v for k, _, v in (str(o).partition("=") for o in items)}
    return None


def group_runs(runs: list[dict]) -> dict[str, list[dict]]:
    """{label: runs}; the label names the config keys (minus seed & co.) that vary across all runs."""
    keys = sorted({k for r in runs for k in r["config"]})
    varying = [k for k in keys if not _ignored(k) and len({repr(r["config"].get(k)) for r in runs}) > 1]
    groups: dict[str, list[dict]] = {}
    for r in runs:
        label = ",".join(f"{k}={r['config'].get(k)}" for k in varying) or "all runs"
        groups.setdefault(label, []).append(r)
    typed = _typed_labels(groups)
    if typed:
        named = _name_what_differs(typed, groups)
        if len(set(named.values())) == len(named):
            return {named[label]: members for label, members in groups.items()}
    return groups


def _ignored(key: str) -> bool:
    return key.startswith(IGNORED) or key in IGNORED


def _typed_labels(groups: dict[str, list[dict]]) -> dict[str, str] | None:
    """{resolved label: the overrides that differ between groups, as typed (``algo=ppo``)}, or None when some
    run has no overrides file or the typed overrides do not tell the groups apart (e.g. agent_overrides)."""
    runs = [r for members in groups.values() for r in members]
    if len(groups) < 2 or any(r["overrides"] is None for r in runs):
        return None
    keys = dict.fromkeys(k for r in runs for k in r["overrides"] if not _ignored(k))
    varying = [k for k in keys if len({r["overrides"].get(k) for r in runs}) > 1]
    labels = {}
    for label, members in groups.items():
        first = members[0]["overrides"]
        labels[label] = " ".join(f"{k}={first[k]}" for k in varying if k in first) or "defaults"
    return labels if len(set(labels.values())) == len(labels) else None


# what a row must name wherever runs differ in it, typed or not: (config key, how the label spells it)
_ALWAYS_NAMED = (("algo._target_", "algo"), ("env.id", "env.id"))


def _name_what_differs(labels: dict[str, str], groups: dict[str, list[dict]]) -> dict[str, str]:
    """The labels with the algorithm and the env id added where the runs differ in them and a label does not
    say it (a sweep over env=... next to one over algo=... typed neither for the other's runs): a table that
    compares a SAC row on Pendulum with PPO rows on CartPole says so."""
    runs = [r for members in groups.values() for r in members]
    out = dict(labels)
    for key, spelled in _ALWAYS_NAMED:
        if len({str(r["config"].get(key)) for r in runs}) < 2:
            continue
        for label, members in groups.items():
            value = str(members[0]["config"].get(key))
            value = value.rpartition(".")[2].lower() if key == "algo._target_" else value
            if f"{spelled}=" not in out[label]:
                out[label] = f"{out[label]} {spelled}={value}" if out[label] != "defaults" else f"{spelled}={value}"
    return out


INTERRUPTED_ROW = "(interrupted: last eval)"


def summarize(groups: dict[str, list[dict]]) -> list[dict]:
    """One row per group over its completed runs' final returns; after it, where some of its runs were stopped
    before their budget with an eval done, a row marked ``INTERRUPTED_ROW`` over their last evals (taken at
    fewer env steps: mixed in, they would pull a final mean down)."""
    rows = []
    for label, runs in groups.items():
        done = [r for r in runs if r["summary"].get("status") == "completed"]
        stopped = [r for r in runs if r["summary"].get("status") == "interrupted"]
        returns = [r["summary"].get("final_eval_return") for r in done]
        # a run's whole time, so over completed runs only (a failed or live one has a part of it, or none)
        walls = [float(r["summary"]["wall_time_s"]) for r in done if r["summary"].get("wall_time_s") is not None]
        stats = aggregate([float(v) for v in returns if v is not None])
        rows.append({"group": label, "runs": len(runs), "completed": len(done),
                     "failed": sum(r["summary"].get("status") == "failed" for r in runs),
                     "interrupted": len(stopped), "returns": "final",
                     "wall_time_s": sum(walls) / len(walls) if walls else None, **stats})
        lasts = [float(v) for v in (r["summary"].get("final_eval_return") for r in stopped) if v is not None]
        if lasts:
            rows.append({"group": f"{label} {INTERRUPTED_ROW}", "runs": len(stopped), "completed": 0, "failed": None,
                         "interrupted": len(stopped), "returns": "last eval of interrupted runs",
                         "wall_time_s": None, **aggregate(lasts)})
    return rows


def _f(v: object, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


HEADER = ["group", "n", "mean", "median", "IQM", "95% CI (mean)", "wall s", "failed"]


def table_cells(row: dict) -> list[str]:
    ci = row.get("ci95_mean") if row["n"] > 1 else None  # one run has no interval ([x, x] would claim one)
    few = f" (n<{MIN_SEEDS_FOR_CI})" if row["n"] < MIN_SEEDS_FOR_CI else ""
    return [row["group"], f"{row['n']}/{row['runs']}", _f(row["mean"]), _f(row["median"]), _f(row["iqm"]),
            f"[{ci[0]:.1f}, {ci[1]:.1f}]{few}" if ci else "-", _f(row["wall_time_s"]), _f(row["failed"])]


def unfinished_lines(runs: list[dict]) -> list[str]:
    """One warning per run that is not finished: live, or recorded ``running`` by a process of this host that
    is gone (killed without a word: it left no result; resume it). Read only: nothing is written."""
    import socket

    from rltrain.sweeps.jobs import process_alive

    lines = []
    for run in runs:
        s = run["summary"]
        if s.get("status") != "running":
            continue
        pid, host = s.get("pid"), s.get("host")
        here = host == socket.gethostname() and isinstance(pid, int)
        if here and not process_alive(pid):
            lines.append(f"rltrain-report: warning: {run['dir']} says running, but its process (pid {pid}) is gone: "
                         "killed from outside or crashed, no result; resume it with resume=auto")
        else:
            where = f" (pid {pid} on {host})" if pid else ""
            lines.append(f"rltrain-report: warning: {run['dir']} is still running{where}: not counted in n")
    return lines


def interrupted_warning(runs: list[dict]) -> str | None:
    """One line on the runs stopped before their budget, by why (``max_wall_time``, a signal), or None."""
    stopped = [r["summary"] for r in runs if r["summary"].get("status") == "interrupted"]
    if not stopped:
        return None
    reasons: dict[str, int] = {}
    for s in stopped:  # the reason may name the phase it landed in ("SIGTERM during the final evaluation")
        why = str(s.get("stop_reason") or "unknown").split(" ", 1)[0]
        reasons[why] = reasons.get(why, 0) + 1
    counts = ", ".join(f"{why}: {n}" for why, n in sorted(reasons.items()))
    evaluated = sum(s.get("final_eval_return") is not None for s in stopped)
    whose = "their" if evaluated == len(stopped) else f"the last evals of {evaluated} of them"
    where = (f"{whose} last evals, at fewer env steps than a final return, are in the rows marked {INTERRUPTED_ROW} "
             "and not in n" if evaluated else "none had evaluated yet, so none is in the table")
    if 0 < evaluated < len(stopped):
        where = where.replace(f"{whose} last evals", whose) + "; the others had not evaluated yet"
    plural = "s" if len(stopped) > 1 else ""
    return (f"rltrain-report: warning: {len(stopped)} run{plural} stopped before their total_env_steps ({counts}): "
            f"{where}; resume=auto continues {'them' if plural else 'it'}")


def few_seeds_warning(rows: list[dict]) -> str | None:
    """One line naming the groups whose interval rests on fewer than ``MIN_SEEDS_FOR_CI`` seeds, or None. A group
    of one run has no interval (``table_cells``): nothing to warn about."""
    few = [f"{r['group']} (n={r['n']})" for r in rows if 1 < r["n"] < MIN_SEEDS_FOR_CI]
    if not few:
        return None
    return (f"rltrain-report: warning: 95% intervals from fewer than {MIN_SEEDS_FOR_CI} seeds are rough: "
            f"{', '.join(few)}; run more seeds (seed=1,2,3,4,5) before comparing")


def no_figure_warning(runs: list[dict], column: str) -> str:
    """Why a figure asked for is not written: no run has a value in ``column``; the columns it may have meant."""
    import csv
    import difflib
    from contextlib import suppress

    columns: set[str] = set()
    for run in runs:  # the header of each metrics.csv; one missing or unreadable names no column
        with suppress(OSError, UnicodeDecodeError, csv.Error):
            columns.update(next(csv.reader((run["dir"] / "metrics.csv").read_text().splitlines()[:1]), []))
    close = difflib.get_close_matches(column, sorted(columns - {"env_steps"}), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    return (f"rltrain-report: warning: no figure written: no run's metrics.csv has a value in column {column!r} "
            f"(--column){hint}")


def markdown(rows: list[dict], title: str) -> str:
    lines = [f"# {title}", "", "Final eval return per configuration (seeds aggregated; n = completed/runs).", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in table_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for i, h in enumerate(HEADER):
        table.add_column(h, justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        table.add_row(*map(escape, table_cells(r)))  # a group's overrides as typed: "[x]" is no style tag
    Console().print(table)


def _run_label(run: dict) -> str:
    name = run["dir"].name
    short = name if name.startswith("agent_") else name.split("_", 1)[0]
    return f"{short} (seed {run['summary'].get('seed')})"


def _curve(run: dict, column: str):
    """One run's curve; a malformed metrics.csv gives an empty one and a warning, not a traceback."""
    import csv

    import numpy as np

    try:
        return read_curve(run["dir"] / "metrics.csv", column)
    except (OSError, ValueError, KeyError, TypeError, csv.Error) as err:
        warn(f"no curve for {run['dir']}: metrics.csv is malformed ({type(err).__name__}: {err})")
        return np.zeros(0), np.zeros(0)


def panel_title(label: str, runs: list[dict]) -> str:
    """The group's label, with the env named when the label does not already (one env per subplot)."""
    envs = sorted({str(r["config"].get("env.id")) for r in runs if r["config"].get("env.id")})
    named = [e for e in envs if e not in label]
    return f"{', '.join(named)}: {label}" if named else label


def plot(groups: dict[str, list[dict]], out: Path, column: str) -> Path | None:
    # grouped by env first, so one env's configurations sit side by side
    order = sorted(groups, key=lambda label: (str(groups[label][0]["config"].get("env.id")), list(groups).index(label)))
    panels = {panel_title(label, groups[label]): {_run_label(r): _curve(r, column) for r in groups[label]}
              for label in order}
    if not any(len(x) for runs in panels.values() for x, _ in runs.values()):
        return None
    return plot_learning_curves(panels, out, title=column)


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="rltrain-report", description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path, help="a multirun dir, run dirs, or parallel-trainer run dirs")
    ap.add_argument("--out", type=Path, help="write the table as markdown to this file (the PNG goes next to it)")
    ap.add_argument("--plot", type=Path, help="write the learning curves to this PNG (default: next to --out, "
                    "else none)")
    ap.add_argument("--column", default="rollout/episode_return", help="metrics.csv column to plot")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = ap.parse_args(argv)
    runs = [run for run in map(load_run, find_runs(args.paths)) if run is not None]
    if not runs:
        where = " ".join(map(str, args.paths))
        raise SystemExit(f"rltrain-report: error: no run dirs (with summary.json) under {where}")
    groups = group_runs(runs)
    rows = summarize(groups)
    title = f"{len(runs)} runs in {len(groups)} configuration(s)"
    if args.json:
        print(json.dumps(rows, indent=2, default=float))
    else:
        print_table(rows, title)
    for line in unfinished_lines(runs):
        print(line, file=sys.stderr)
    warnings = [w for w in (interrupted_warning(runs), few_seeds_warning(rows)) if w]
    for warning in warnings:
        print(warning, file=sys.stderr)
    # a figure only where asked: the paths are run dirs (records of runs) or a sweep's, not the report's output
    png = args.plot or (args.out.with_suffix(".png") if args.out else None)
    written = plot(groups, png, args.column) if png else None
    if png and not written:  # a figure was asked for: say why there is none, rather than end as if it were written
        warnings.append(no_figure_warning(runs, args.column))
        print(warnings[-1], file=sys.stderr)
    if args.out:
        text = markdown(rows, title) + "".join(f"\n> {warning.split(': ', 2)[2]}\n" for warning in warnings)
        link = os.path.relpath(png, args.out.parent) if written else ""  # --plot may put it elsewhere
        text += f"\n![learning curves]({link})\n" if written else ""
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    if written:
        print(f"wrote {written}", file=sys.stderr)


if __name__ == "__main__":
    main()
