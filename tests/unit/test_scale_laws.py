"""The ledger and the projection of tests/data/ddp (a real 2-rank gloo job recorded by fdtrace
run): the laws that follow from the structure of one world size, the JSON of `fdtrace scale`, and
the report's section."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fdtrace.analysis import load
from fdtrace.analysis.rank_ledger import job_ledgers
from fdtrace.analysis.report import build, to_markdown
from fdtrace.analysis.scale import project
from tests.helpers import FDTRACE

DDP = Path(__file__).parents[1] / "data" / "ddp"


def test_one_world_size_gives_the_laws_by_its_structure() -> None:
    [job] = job_ledgers(load(DDP))
    assert job.world_size == 2 and job.store_rank == 0
    owners = job.by_owner()
    # rank 0: the store's listener and Gloo's, its own store client, both ranks' store connections, one pair
    # files and pipes: what the samples saw beside the sockets (19 and 11), and one more that each rank
    # opened and closed between two samples: the number of its close() says so
    assert owners.loc[0].to_dict() == {"store_server": 2, "store_client": 1, "pairs": 1, "listeners": 2,
                                       "other_sockets": 0, "files_pipes": 20}
    assert owners.loc[1].to_dict() == {"store_server": 0, "store_client": 1, "pairs": 1, "listeners": 1,
                                       "other_sockets": 0, "files_pipes": 12}
    assert job.ranks["fds"].tolist() == [26, 15]  # the samples saw 25 and 14
    at = project([job], 512)
    host, other = at.roles["store host"], at.roles["other ranks"]
    assert host["by_owner"]["store_server"] == 512 and host["by_owner"]["pairs"] == 511
    assert host["fds"] == 26 + 2 * 510 and other["fds"] == 15 + 510  # two more per rank on rank 0, one elsewhere
    assert {law.kind for law in at.laws if law.figure == "pairs"} == {"per peer"}
    assert at.first_limit is not None and at.first_limit.name.startswith("net.core.somaxconn")
    assert at.max_world == 4096  # the recording's somaxconn


def test_scale_json_lists_every_rank() -> None:
    out = subprocess.run([FDTRACE, "scale", str(DDP), "--world", "8", "--ranks-per-host", "4", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["world"] == 8 and [r["rank"] for r in found["ranks"]] == list(range(8))
    assert set(found["ranks"][0]) == {"rank", "fds", "sockets", "threads", "limit", "by_owner"}
    assert [r["fds"] for r in found["ranks"]] == [26 + 12] + [15 + 6] * 7
    assert set(found["first_limit"]) >= {"name", "at_world"} and found["max_world"] == found["first_limit"][
        "at_world"] - 1
    bad = subprocess.run([FDTRACE, "scale", str(DDP), "--world", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0


def test_the_report_has_the_ledger_and_the_job_at_scale() -> None:
    page = to_markdown(build(load(DDP)))
    assert "## Each rank's descriptors by owner, and the job at scale" in page
    assert "- at 512 ranks rank 0 needs 1,046 descriptors; its limit is 20,000" in page


def test_scale_says_when_the_recording_lost_events(tmp_path: Path) -> None:
    """A recording that lost events (a full ring buffer on a busy host: a CI run's projection
    counted no store connections on rank 0) is projected with a warning naming what was lost,
    never silently; the same recording without losses has none."""
    import shutil

    import pyarrow as pa

    from fdtrace.recording.writer import append_part
    from fdtrace.schema import codecs

    quiet = subprocess.run([FDTRACE, "scale", str(DDP), "--world", "8"], capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and "lost" not in quiet.stderr, quiet.stderr
    busy = tmp_path / "ddp"
    shutil.copytree(DDP, busy)
    row = codecs.loss_columns(10**18, {"ringbuf_full": 1234, "peers_full": 5}, {})
    append_part(busy, "losses", "vm", pa.table(codecs.declared_rows("losses", row, 0)))
    said = subprocess.run([FDTRACE, "scale", str(busy), "--world", "8"], capture_output=True, text=True,
                          timeout=120)
    assert said.returncode == 0, said.stderr
    assert f"warning: {busy} lost 1,239 events or connect() destinations while recording" in said.stderr
    assert said.stdout == quiet.stdout  # the same projection, said to be a floor
