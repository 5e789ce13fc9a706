"""The notebooks run from top to bottom (so they cannot rot)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))
#: What each notebook's outputs must show.
EXPECTED = {"emfile_postmortem.ipynb": ("emfile-child", "socket EMFILE", "set it to at least 77"),
            "ddp_phases.ipynb": ("init_process_group", "allreduce", "checkpoint_save"),
            "fleet.ipynb": ("host-03", "-1500000000", "accept4 EMFILE", "OOM kill",
                            "RLIMIT_NOFILE of python [1001] on host-00: peak 1024 open of a soft limit of 1024;")}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(str(o.get("data", {}).get("text/plain", "")) + str(o.get("text", "")) for o in outputs)
    for expected in EXPECTED[path.name]:
        assert expected in text, expected


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS
