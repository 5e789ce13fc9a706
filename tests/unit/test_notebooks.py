"""The notebooks run from top to bottom on the recording they ship with (their kept outputs) and
on another one given through their parameter cell, so that they neither rot nor depend on the
data they were written for."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DATA = ROOT / "tests" / "data"
#: What each notebook's outputs must show, with its parameters left as they are.
EXPECTED = {"emfile_postmortem.ipynb": ("emfile-child [15007]", "socket EMFILE", "EMFILE/ENFILE", "set it to 82"),
            "ddp_phases.ipynb": ("init_process_group", "allreduce", "checkpoint_save"),
            "fleet.ipynb": ("host-03", "-1500000000", "accept4 EMFILE", "OOM kill",
                            "RLIMIT_NOFILE of python [1001] on host-00: soft limit 1024, failed")}
#: Each notebook's parameter given another recording, and what its outputs must show then.
OTHER = {"emfile_postmortem.ipynb": (f"recording = {str(DATA / 'ddp')!r}", ("python", "No limit was approached")),
         "ddp_phases.ipynb": (f"recording = {str(DATA / 'emfile')!r}", ("This recording has no training phases",
                                                                       "emfile-child")),
         "fleet.ipynb": (f"fleet_dir = {str(DATA / 'emfile')!r}\nengine = 'duckdb'", ("vm", "emfile-child"))}


def execute(path: Path, parameters: str | None = None) -> tuple[nbformat.NotebookNode, str]:
    notebook = nbformat.read(path, as_version=4)
    if parameters is not None:
        [cell] = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
        cell.source = parameters
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return notebook, "".join(str(o.get("data", {}).get("text/plain", "")) + str(o.get("text", "")) for o in outputs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_on_its_recording_and_on_another(path: Path) -> None:
    stored = nbformat.read(path, as_version=4)
    assert all(cell.outputs for cell in stored.cells if cell.cell_type == "code"
               and "parameters" not in cell.metadata.get("tags", []))  # kept, for the project page
    _, text = execute(path)
    for expected in EXPECTED[path.name]:
        assert expected in text, expected
    parameters, shown = OTHER[path.name]
    _, text = execute(path, parameters)
    for expected in shown:
        assert expected in text, expected


def test_there_are_notebooks() -> None:
    assert {p.name for p in NOTEBOOKS} == set(EXPECTED) == set(OTHER)
