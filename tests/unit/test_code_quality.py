"""ruff and mypy are part of the suite: a change that breaks them fails CI."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def run_tool(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_is_clean() -> None:
    bench_scripts = [str(p.relative_to(ROOT)) for p in (ROOT / "bench").iterdir() if p.is_file() and p.suffix != ".c"]
    result = run_tool("ruff", "check", "src", "tests", *bench_scripts)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    result = run_tool("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_contracts_are_kept() -> None:
    """The layers and the bcc/Textual boundaries of pyproject.toml's [tool.importlinter]."""
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "0 broken" in result.stdout


SRC = ROOT / "src" / "fdtrace"
#: A string that is a /proc path: "/proc", or "/proc/" and no spaces (a message naming /proc is not one).
PROC_PATH = re.compile(r"/proc(/\S*)?")
#: Modules outside procfs/ that may name a /proc path, each with its reason.
PROC_EXCEPTIONS = {
    "integrations/phases/_shim/sitecustomize.py":
        "runs inside the traced job's own Python (the standard library only, never fdtrace): its own start time",
}
#: Calls that open a Parquet file, and the modules that hold them.
PARQUET_OPENERS = {"read_parquet", "to_parquet", "ParquetFile", "ParquetDataset", "ParquetWriter"}
#: The names pyarrow.parquet goes by: any call of theirs (pq.read_table, pq.write_table) opens one.
PARQUET_ALIASES = {"pq", "parquet"}
PARQUET_MODULES = {"pyarrow.parquet", "pyarrow.dataset"}
#: Where Parquet files are opened: the recording package and the engines that read recordings.
PARQUET_PLACES = ("recording/", "analysis/engines/")
#: Modules elsewhere that may open a Parquet file, each with its reason.
PARQUET_EXCEPTIONS = {
    "integrations/phases/files.py":
        "a phases file a user names (what `fdtrace run --phases-out` wrote), not a recording; the recording "
        "reader calls it, and integrations/ lies below recording/ in the layers",
}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(path.relative_to(SRC).as_posix(), ast.parse(path.read_text(), str(path)))
            for path in sorted(SRC.rglob("*.py"))]


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def proc_paths(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, text) of each string that is a /proc path, f-strings by their leading text."""
    docstrings = _docstrings(tree)
    inside = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and isinstance(head.value, str) and (
                    head.value == "/proc" or head.value.startswith("/proc/")):
                found.append((node.lineno, head.value + "{...}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings | inside:
            if PROC_PATH.fullmatch(node.value):
                found.append((node.lineno, node.value))
    return found


def parquet_openings(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) of each import of pyarrow's Parquet modules and each call of a Parquet opener."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name in PARQUET_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {f"{node.module}.{a.name}" for a in node.names} | {node.module}
            found += [(node.lineno, f"from {node.module} import ...") for _ in [0] if names & PARQUET_MODULES]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            on_parquet = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                func.value.id in PARQUET_ALIASES
            if name in PARQUET_OPENERS or on_parquet:
                found.append((node.lineno, f"{name}()"))
    return found


def test_only_procfs_names_proc_paths() -> None:
    """/proc is read through ProcFS (src/fdtrace/procfs), with its root and its bounds: no other
    module spells a /proc path, but the listed exceptions."""
    modules = _modules()
    found = {name: proc_paths(tree) for name, tree in modules if not name.startswith("procfs/")}
    offending = {name: hits for name, hits in found.items() if hits and name not in PROC_EXCEPTIONS}
    assert not offending, offending
    assert all(found.get(name) for name in PROC_EXCEPTIONS), "an exception no longer needed: remove it"
    assert proc_paths(ast.parse('x = f"/proc/{pid}/mem"\ny = "/proc/self/fd"\nz = "/proc round 1 s"\n')) == [
        (1, "/proc/{...}"), (2, "/proc/self/fd")]  # the check sees both forms, and passes prose by


def test_only_recordings_and_engines_open_parquet() -> None:
    """Parquet files are opened by recording/ and analysis/engines/ only (the one way into a
    recording), but the listed exceptions."""
    found = {name: parquet_openings(tree) for name, tree in _modules() if not name.startswith(PARQUET_PLACES)}
    offending = {name: hits for name, hits in found.items() if hits and name not in PARQUET_EXCEPTIONS}
    assert not offending, offending
    assert all(found.get(name) for name in PARQUET_EXCEPTIONS), "an exception no longer needed: remove it"
    sample = "import pyarrow.parquet as pq\nfrom pyarrow import parquet\npq.read_table(p)\npd.read_parquet(p)\n"
    assert sorted(line for line, _ in parquet_openings(ast.parse(sample))) == [1, 2, 3, 4]
