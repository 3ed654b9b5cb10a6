"""The layout is the architecture (docs/architecture.md): every import in the package, function-local ones
included, must point down. A forbidden arrow fails here with the file, line and the rule it breaks."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "rltrain"
LAYERS = ("cli", "sweeps", "trainers", "algos", "models", "envs", "data", "run", "conf")
# what each layer may import from rltrain (rltrain.errors is a leaf every layer may use)
ALLOWED = {
    "cli": set(LAYERS),
    "sweeps": {"sweeps", "run", "data"},  # the CLI runs the jobs; sweeps never import it
    "trainers": {"trainers", "algos", "models", "envs", "data", "run"},
    "algos": {"algos", "models", "data"},
    "models": {"models", "data"},
    "envs": {"envs", "data"},
    "data": {"data"},
    "run": {"run", "data"},
    "conf": set(),
}
HYDRA = ("hydra", "omegaconf")


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement in the file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            if node.module == "rltrain":  # `from rltrain import cli` imports the subpackage (not __version__)
                out += [(node.lineno, f"rltrain.{a.name}") for a in node.names
                        if (PKG / a.name).is_dir() or (PKG / f"{a.name}.py").exists()]
    return out


def violations(root: Path = PKG) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        layer = rel.parts[0] if len(rel.parts) > 1 else None  # top-level modules: errors, __main__
        for line, mod in imports(path):
            where = f"rltrain/{rel}:{line} imports {mod}"
            top = mod.split(".")[0]
            if top in HYDRA and layer not in ("cli", "sweeps") and rel.name not in ("__main__.py", "api.py"):
                found.append(f"{where}: only cli/ and sweeps/ may read Hydra")
            if top != "rltrain" or layer is None:
                continue
            parts = mod.split(".")
            target = parts[1] if len(parts) > 1 else None
            if target in (None, "errors", "__main__"):
                continue
            if target not in ALLOWED.get(layer, set()):
                found.append(f"{where}: {layer}/ must not import {target}/")
    return found


def test_every_arrow_points_down():
    assert violations() == []


def test_the_checker_catches_a_forbidden_arrow(tmp_path):
    """A function-local import of the CLI from a trainer, and Hydra in algos/, are both reported."""
    (tmp_path / "trainers").mkdir()
    (tmp_path / "trainers" / "bad.py").write_text("def f():\n    from rltrain.cli.build import run\n")
    (tmp_path / "algos").mkdir()
    (tmp_path / "algos" / "worse.py").write_text("import omegaconf\nfrom rltrain.trainers import loop\n")
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "up.py").write_text("from rltrain import api\n")
    found = violations(tmp_path)
    assert any("trainers/bad.py:2 imports rltrain.cli.build: trainers/ must not import cli/" in v for v in found)
    assert any("algos/worse.py:1 imports omegaconf: only cli/ and sweeps/ may read Hydra" in v for v in found)
    assert any("algos/worse.py:2 imports rltrain.trainers: algos/ must not import trainers/" in v for v in found)
    assert any("cli/up.py:1 imports rltrain.api: cli/ must not import api/" in v for v in found)  # nothing -> api


def test_every_module_is_in_a_room_and_short():
    """No flat room of modules: only errors.py, the entry points and the Python API (api.py, at the command
    lines' level: it may import cli/, and no layer may import it) sit at the top; modules stay readable."""
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "api.py", "errors.py"]
    long = [f"{p.relative_to(PKG)}: {n}" for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400]
    assert long == []


def module_rule_breaks(root: Path) -> list[str]:
    """docs/architecture.md's rules for the modules under ``root``: at most 400 lines, no ``utils.py`` (a module
    is named after its role), and no two modules in one folder whose names differ by a suffix (``bench.py``
    beside ``bench_table.py`` or ``bench2.py``: one role split in two, or two roles under one name)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent)
        if (n := len(path.read_text().splitlines())) > 400:
            found.append(f"{where}: {n} lines (at most 400)")
        if path.name == "utils.py":
            found.append(f"{where}: no utils.py (name the module after its role)")
    for folder in sorted({p.parent for p in root.rglob("*.py")}):
        stems = sorted(p.stem for p in folder.glob("*.py"))
        for a in stems:
            for b in stems:
                if b != a and b.startswith(a) and (b[len(a)] == "_" or b[len(a):].isdigit()):
                    found.append(f"{(folder / b).relative_to(root.parent)}.py beside {a}.py: names that differ by "
                                 "a suffix")
    return found


@pytest.mark.parametrize("root", [PKG, PKG.parent / "scripts", PKG.parent / "hydra_plugins"],
                         ids=["rltrain", "scripts", "hydra_plugins"])
def test_every_module_is_short_and_named_after_one_role(root):
    """The benchmarks under scripts/ too: bench_throughput.py had grown to 427 lines."""
    assert module_rule_breaks(root) == []


def test_the_module_rules_catch_a_long_module_a_utils_and_a_suffix(tmp_path):
    root = tmp_path / "scripts"
    root.mkdir()
    (root / "bench.py").write_text("x = 1\n" * 401)
    (root / "bench_table.py").write_text("")
    (root / "bench2.py").write_text("")
    (root / "utils.py").write_text("")
    (root / "benchmarks.py").write_text("")  # another word that starts alike: no suffix
    assert module_rule_breaks(root) == [
        "scripts/bench.py: 401 lines (at most 400)", "scripts/utils.py: no utils.py (name the module after its role)",
        "scripts/bench2.py beside bench.py: names that differ by a suffix",
        "scripts/bench_table.py beside bench.py: names that differ by a suffix"]


@pytest.mark.parametrize("module", ["rltrain.trainers.loop", "rltrain.trainers.parallel",
                                    "rltrain.trainers.distributed", "rltrain.trainers.actors.learner"])
def test_trainers_load_without_hydra(module):
    """Importing a trainer (what a spawned worker does) pulls in neither Hydra nor the CLI layer."""
    code = (f"import sys, {module}; bad = [m for m in sys.modules if m.split('.')[0] in ('hydra', 'omegaconf') "
            "or m.startswith('rltrain.cli')]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def import_graph(root: Path = PKG) -> dict[str, set[str]]:
    """Module -> the rltrain modules it imports at any depth (``if TYPE_CHECKING:`` blocks aside: annotations
    only). The package root is left out: it holds ``__version__`` and lazy re-exports of the Python API."""
    def name(path: Path) -> str:
        parts = ["rltrain", *path.relative_to(root).with_suffix("").parts]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name(p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for stmt in node.body for n in ast.walk(stmt)}
        deps = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names}
        graph[mod] = {d for d in deps if d in modules and d not in (mod, "rltrain")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_checker_finds_a_cycle(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "a.py").write_text("from rltrain.models.b import x\n")
    (tmp_path / "models" / "b.py").write_text("def f():\n    from rltrain.models import a\n")
    (tmp_path / "models" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                              "    from rltrain.models.a import y\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["rltrain.models.a", "rltrain.models.b"]]
    assert graph["rltrain.models.c"] == set()
