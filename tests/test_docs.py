"""The README and every page of the documentation site are followable as written.

- Every ``bash`` and ``python`` block a user would paste runs, in order, page by page in a fresh directory (a
  block may use what the blocks before it on the same page made: a run dir, a module it defined). ``rltrain``
  training runs are cut to a smoke budget (``SMOKE``), the only change made to a command.
- ``console`` blocks are transcripts: each ``$ command`` runs and the lines shown below it must appear in its
  output, in order (``...`` matches anything); an ``rltrain: error:`` line means exit code 2, else 0.
- A block marked ``<!-- docs-test: parse (why) -->`` on the line above (it needs a cluster, SLURM, Ray, a GPU,
  network or an account) is parsed only: ``bash -n``, Hydra's override parser for every ``rltrain`` command
  (also behind ``torchrun``, ``srun``, ``sbatch scripts/ray-slurm.sbatch``), ``ast.parse`` for Python.
  ``<!-- docs-test: with KEY=VALUE ... -->`` adds overrides to the block's ``rltrain`` runs (in place of the
  smoke value of the same key: a budget that must hold one update).
- ``pip install`` lines are not run (the install is CI's own first step); the extras they name must exist.
- Every repo path the pages cite in code exists, and every ``rltrain*`` command they name answers ``--help``.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (3.10 has no TOML reader built in)

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
ROOTS = ("rltrain/", "scripts/", "tests/", "docs/", ".ci/", "hydra_plugins/")
# a path relative to the package's own folder (`conf/logger/...`) is a path a reader cannot open from the clone
PACKAGE_RELATIVE = ("conf/", "cli/", "run/", "trainers/", "algos/", "envs/", "models/")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
BIN = Path(sys.executable).parent
# what a documented training run is cut to: the budget, and evaluation / logging / checkpoints to match it
SMOKE = ("total_env_steps=2048", "eval.every_env_steps=0", "eval.episodes=1", "eval.both_modes=false",
         "log.every_env_steps=512", "checkpoint.every_env_steps=1024", "logger.progress=plain",
         "logger.progress_interval_s=5")
# a multirun job's dir is named after its overrides: the smoke keys stay out of it, as resume does (train.yaml)
DIRNAME_EXCLUDED = [*yaml.safe_load((REPO / "rltrain" / "conf" / "train.yaml").read_text())["hydra"]["job"]["config"]
                    ["override_dirname"]["exclude_keys"], *(o.split("=")[0] for o in SMOKE)]
NOT_A_RUN = ("--cfg", "--help", "-h", "--info", "--hydra-help", "--shell-completion")
TIMEOUT = 300


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ---------------------------------------------------------------------------------------------------- blocks

@dataclass
class Block:
    page: Path
    line: int  # of the opening fence
    lang: str
    text: str
    mark: str = ""  # "parse (...)", "with ...", or ""

    @property
    def where(self) -> str:
        return f"{rel(self.page)}:{self.line}"

    @property
    def parse_only(self) -> bool:
        return self.mark.startswith("parse")

    @property
    def extra(self) -> list[str]:
        return self.mark.split()[1:] if self.mark.startswith("with ") else []


FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!-- docs-test: (.+?) -->$")


def blocks(text: str, page: Path = REPO / "README.md") -> list[Block]:
    """Every fenced block of a markdown text, with the ``docs-test`` mark on the line above it, if any."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        mark = MARK.match(lines[i - 1]) if i else None
        found.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n",
                           mark.group(1).strip() if mark else ""))
        i = end + 1
    return found


def shell_commands(text: str) -> list[str]:
    """The command lines of a shell block: continuations joined, comment-only lines dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line.strip() and not line.strip().startswith("#"):
            out.append(line.strip())
    return out


@dataclass
class Command:
    env: dict[str, str]
    argv: list[str]
    rltrain_at: int | None = None  # index in argv of the rltrain program whose arguments are overrides
    overrides: list[str] = field(default_factory=list)


def parse_command(line: str) -> Command:
    tokens = shlex.split(line, comments=True)
    env = {}
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    cmd = Command(env, tokens)
    for k, tok in enumerate(tokens):
        launched = tok == "rltrain" and (k == 0 or tokens[k - 1] == "-m" or tokens[0] in ("srun", "python"))
        if launched or tok.endswith("ray-slurm.sbatch"):  # the sbatch script hands its arguments to rltrain
            cmd.rltrain_at = k
            cmd.overrides = [t for t in tokens[k + 1:] if not t.startswith("-")]
            break
    return cmd


def hydra_parse(overrides: list[str]) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    OverridesParser.create().parse_overrides(overrides)


# ------------------------------------------------------------------------------------------------- running

def session_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYDRA_FULL"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env.update(extra or {})
    return env


def check_pip_install(line: str, where: str) -> None:
    for spec in re.findall(r"rltrain\[([\w,]+)\]", line):
        missing = [e for e in spec.split(",") if e not in EXTRAS]
        assert not missing, f"{where}: `{line}` names extras that do not exist: {missing}"


def run(argv: list[str], env: dict[str, str], cwd: Path, where: str, line: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, cwd=cwd, env=session_env(env), capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: `{line}` ran past {TIMEOUT} s")


def training_argv(cmd: Command, extra: list[str], *, keep_set: bool) -> list[str]:
    """The command with the smoke budget (and the block's ``with`` overrides) after the user's overrides; with
    ``keep_set`` a key the command sets itself is left as it is (a transcript shows that very run)."""
    if cmd.rltrain_at is None or cmd.argv[0] == "sbatch" or any(t in NOT_A_RUN for t in cmd.argv):
        return cmd.argv
    given = {o.split("=", 1)[0].lstrip("+~") for o in cmd.overrides}
    extra_keys = {o.split("=", 1)[0] for o in extra}  # a ``with`` override replaces the smoke value (a budget)
    smoke = [o for o in SMOKE
             if not (keep_set and o.split("=", 1)[0] in given) and o.split("=", 1)[0] not in extra_keys]
    if {"-m", "--multirun"} & set(cmd.argv):
        smoke.append(f"hydra.job.config.override_dirname.exclude_keys=[{','.join(DIRNAME_EXCLUDED)}]")
    return [*cmd.argv, *smoke, *extra]


STATEFUL = ("hydra.run.dir", "hydra.sweep.dir", "resume", "model.imports", ":", "runs/", "my_")


def ran_before(script: str, env: dict[str, str], memo: Path | None) -> Path | None:
    """The marker of a training run that another page already ran exactly so, or where to leave one. Only for
    runs that read nothing a page made and that nothing after them reads (default output dirs only)."""
    if memo is None or any(s in script for s in STATEFUL):
        return None
    key = hashlib.sha256(repr((script, sorted(env.items()))).encode()).hexdigest()[:20]
    return memo / key


def run_shell_block(block: Block, cwd: Path, memo: Path | None = None) -> None:
    for line in shell_commands(block.text):
        if line.startswith("pip install"):
            check_pip_install(line, block.where)
            continue
        cmd = parse_command(line)
        # a training run is rebuilt from its words with the smoke budget added; any other line runs as written
        script = shlex.join(training_argv(cmd, block.extra, keep_set=False)) if cmd.rltrain_at is not None else line
        marker = ran_before(script, cmd.env, memo) if cmd.rltrain_at is not None else None
        if marker is not None and marker.exists():
            continue  # the same run passed on another page: a second copy would only cost CI time
        res = run(["bash", "-c", script], cmd.env, cwd, block.where, line)
        assert res.returncode == 0, (f"{block.where}: `{line}` exited {res.returncode}\n"
                                     f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
        assert "Traceback" not in res.stderr, f"{block.where}: `{line}`\n{res.stderr[-3000:]}"
        if marker is not None:
            marker.touch()


def expected_lines_match(expected: list[str], output: str) -> str | None:
    """None when every expected line matches a whole output line, in order; else the first that does not."""
    out = [ln.strip() for ln in output.splitlines()]
    k = 0
    for want in expected:
        pattern = re.compile(".*".join(re.escape(part) for part in want.strip().split("...")))
        while k < len(out) and not pattern.fullmatch(out[k]):
            k += 1
        if k == len(out):
            return want
        k += 1
    return None


def run_console_block(block: Block, cwd: Path) -> None:
    steps: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif line.strip():
            assert steps, f"{block.where}: a console block starts with '$ command'"
            steps[-1][1].append(line)
    for line, expected in steps:
        cmd = parse_command(line)
        res = run(training_argv(cmd, block.extra, keep_set=True), cmd.env, cwd, block.where, line)
        missing = expected_lines_match(expected, res.stdout + "\n" + res.stderr)
        assert missing is None, f"{block.where}: `$ {line}` did not print\n  {missing}\nit printed:\n" \
                                f"{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        error = any(e.startswith("rltrain: error:") for e in expected)
        assert res.returncode == (2 if error else 0), f"{block.where}: `$ {line}` exited {res.returncode}"


def run_python_block(block: Block, cwd: Path) -> None:
    first = block.text.splitlines()[0]
    module = re.fullmatch(r"# ([\w/]+\.py)", first.strip())
    if module:  # a file the following blocks use: written where the user would save it
        (cwd / module.group(1)).write_text(block.text)
        return
    res = run([sys.executable, "-c", block.text], {}, cwd, block.where, "python block")
    assert res.returncode == 0, f"{block.where}: the Python block failed\n{res.stderr[-3000:]}"


def parse_block(block: Block) -> None:
    if block.lang == "python":
        ast.parse(block.text, block.where)
        return
    res = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True)
    assert res.returncode == 0, f"{block.where}: not valid bash: {res.stderr}"
    for line in shell_commands(block.text):
        if line.startswith("pip install"):
            check_pip_install(line, block.where)
            continue
        cmd = parse_command(line)
        if cmd.rltrain_at is not None:
            hydra_parse(cmd.overrides)


RUNNABLE = ("bash", "python", "console")


def page_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page.read_text(), page) if b.lang in RUNNABLE]


@pytest.mark.parametrize("page", [p for p in PAGES if page_blocks(p)], ids=rel)
def test_every_block_of_the_page_runs_as_written(page, tmp_path, tmp_path_factory):
    """The page's blocks in order, in one fresh directory that looks like a checkout where the pages run
    commands from one (``tests.helpers...`` env ids, ``scripts/``)."""
    for name in ("tests", "scripts"):
        (tmp_path / name).symlink_to(REPO / name)
    base = tmp_path_factory.getbasetemp()  # under xdist each worker's basetemp sits in the session's own dir
    memo = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "docs-runs-passed"
    memo.mkdir(exist_ok=True)
    for block in page_blocks(page):
        if block.parse_only:
            parse_block(block)
        elif block.lang == "bash":
            run_shell_block(block, tmp_path, memo)
        elif block.lang == "console":
            run_console_block(block, tmp_path)
        else:
            run_python_block(block, tmp_path)


def test_the_block_reader_sees_marks_continuations_and_commands():
    text = ("intro\n<!-- docs-test: parse (needs SLURM) -->\n```bash\nsrun --ntasks=2 rltrain a=1 \\\n"
            "    b=2   # two ranks\n# a note\n```\n```python\n# my_mod.py\nx = 1\n```\n```text\n$ x\n```\n")
    found = blocks(text)
    assert [(b.lang, b.mark, b.line) for b in found] == [("bash", "parse (needs SLURM)", 3), ("python", "", 8),
                                                        ("text", "", 12)]
    (line,) = shell_commands(found[0].text)
    cmd = parse_command(line)
    assert cmd.overrides == ["a=1", "b=2"] and cmd.argv[cmd.rltrain_at] == "rltrain"
    env_cmd = parse_command("WANDB_MODE=offline rltrain logger=wandb  # offline")
    assert env_cmd.env == {"WANDB_MODE": "offline"} and env_cmd.overrides == ["logger=wandb"]
    assert training_argv(parse_command("rltrain --cfg job algo=dqn"), [], keep_set=False)[-1] == "algo=dqn"
    capped = training_argv(parse_command("rltrain total_env_steps=100"), [], keep_set=True)
    assert "total_env_steps=2048" not in capped and "eval.episodes=1" in capped


def test_a_transcript_line_must_appear_in_order():
    out = "[rltrain] starting ...\nrltrain: error: algo.lr=nan: must be a finite number (nan and inf train nothing)\n"
    assert expected_lines_match(["rltrain: error: algo.lr=nan: must be ..."], out) is None
    assert expected_lines_match(["rltrain: error: algo.lr=nan"], out) == "rltrain: error: algo.lr=nan"
    assert expected_lines_match(["rltrain: error: ...", "[rltrain] starting ..."], out) is not None


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_parse_only_block_parses(page):
    """Also where the page test runs them: a marked block's commands must at least be valid."""
    for block in page_blocks(page):
        if block.parse_only:
            parse_block(block)


def test_the_parser_refuses_a_broken_override():
    with pytest.raises(Exception):  # noqa: B017 (Hydra's own OverrideParseException)
        hydra_parse(["trainer.ray.actor_resources={num_cpus:1"])


# ------------------------------------------------------------------------------------- paths and commands

def code_spans(text: str) -> list[str]:
    """The text of every fenced code block and every inline `code` span."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return fenced + re.findall(r"`([^`\n]+)`", rest)


def cited_paths(text: str) -> set[str]:
    """Repo paths named in code (``rltrain/x.py:42`` -> ``rltrain/x.py``); templates (``<name>``, ``*``) skipped."""
    found = set()
    for span in code_spans(text):
        for token in re.split(r"[\s()\[\],;'\"=]+", span):
            path = token.split(":", 1)[0].rstrip("/.")
            if path.startswith(ROOTS + PACKAGE_RELATIVE) and not re.search(r"[<>*{}|$]", path):
                found.add(path)
    return found


def named_commands(text: str) -> set[str]:
    """``rltrain`` and ``rltrain-<name>`` as commands in code (not ``.rltrain-key``, not ``rltrain/`` paths)."""
    found = set()
    for span in code_spans(text):
        found |= set(re.findall(r"(?<![\w./\[-])(rltrain(?:-[a-z]+)?)(?![\w./\]\[-])", span))
    return found


ALL_TEXT = "\n".join(p.read_text() for p in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_path_a_page_cites_exists(page):
    missing = sorted(p for p in cited_paths(page.read_text()) if not (REPO / p).exists())
    assert missing == []


def test_the_pages_cite_code_at_all():
    assert len(cited_paths(ALL_TEXT)) > 50  # an empty set would mean the pattern broke


def test_the_path_finder_sees_a_missing_path():
    text = ("see `rltrain/nowhere.py` and `rltrain/conf/algo/<name>.yaml`; keys in `conf/logger/wandb.yaml`\n"
            "```bash\npython scripts/absent.py --help\n```\n")
    assert cited_paths(text) == {"rltrain/nowhere.py", "conf/logger/wandb.yaml", "scripts/absent.py"}


def test_the_command_finder_skips_paths_and_files():
    text = "`rltrain-eval RUN`, `<run dir>/.rltrain-key`, `rltrain/cli/x.py`, `pip install 'rltrain[wandb]'`"
    assert named_commands(text) == {"rltrain-eval"}


def test_every_command_the_pages_name_is_installed():
    named = named_commands(ALL_TEXT)
    assert {"rltrain", "rltrain-eval", "rltrain-report", "rltrain-check", "rltrain-export"} <= named
    assert sorted(named - set(SCRIPTS)) == []


@pytest.mark.parametrize("command", sorted(named_commands(ALL_TEXT)))
def test_every_command_the_pages_name_answers_help(command, tmp_path):
    module, _, func = SCRIPTS[command].partition(":")
    code = f"import sys; sys.argv[0] = {command!r}; from {module} import {func}; {func}()"
    res = subprocess.run([sys.executable, "-c", code, "--help"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    assert command in res.stdout or "== Config ==" in res.stdout, res.stdout  # its own help, not a crash
    assert "Traceback" not in res.stderr


def test_every_page_is_in_the_site_navigation():
    nav = (REPO / "mkdocs.yml").read_text()
    pages = [rel(p).removeprefix("docs/") for p in PAGES if p.parent != REPO]
    assert sorted(p for p in pages if p not in nav) == []


def test_the_readme_is_a_front_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    linked = set(re.findall(r"\]\((docs/[\w/.-]+\.md)", readme))
    assert {"docs/getting-started.md", "docs/algorithms/index.md", "docs/scaling/index.md",
            "docs/benchmarks.md"} <= linked
    assert sorted(p for p in linked if not (REPO / p).exists()) == []
