"""ruff and mypy are part of the suite: a change that breaks them fails CI."""

from __future__ import annotations

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
