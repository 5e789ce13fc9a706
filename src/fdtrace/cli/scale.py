"""`fdtrace scale`: what a distributed job will need at a world size it has not run at."""

from __future__ import annotations

import json

import click

from fdtrace.cli.common import fail, note, open_recordings, say
from fdtrace.errors import FdtraceError


@click.command()
@click.argument("recordings", nargs=-1, required=True, type=click.Path())
@click.option("--world", "world", type=click.IntRange(min=1), required=True,
              help="The world size (ranks) to project the job to.")
@click.option("--ranks-per-host", type=click.IntRange(min=1), default=None,
              help="Ranks on each host (default: the most one recording's host held).")
@click.option("--json", "as_json", is_flag=True, help="Print the projection as JSON.")
def scale(recordings: tuple[str, ...], world: int, ranks_per_host: int | None, as_json: bool) -> None:
    """Project a DDP job to WORLD ranks from recordings of it at smaller world sizes.

    Each RECORDING is an `fdtrace run --record` recording of the same job (one or more runs of
    it). Each rank's descriptors are counted by owner (the rendezvous store, the collectives'
    pairs, listeners, files and pipes); each owner's growth with the world size is fitted from two
    or more world sizes, or follows from the structure of one. Prints each rank's descriptors,
    sockets and threads at WORLD ranks, the busiest host's connections, the limit that breaks
    first and the largest world size that fits every limit.
    """
    from fdtrace.analysis.rank_ledger import job_ledgers
    from fdtrace.analysis.scale import project

    jobs = []
    for path in recordings:
        with open_recordings((path,), "auto", None, None) as recording:
            try:
                found = job_ledgers(recording, source=path)
            except FdtraceError as error:
                fail(error)
        if not found:
            fail(FdtraceError(f"{path}: no distributed job recorded (no rank in its phases: record the job with "
                              "fdtrace run --record)"))
        jobs += found
    try:
        projection = project(jobs, world, ranks_per_host)
    except FdtraceError as error:
        fail(error)
    for source in dict.fromkeys(job.source for job in jobs if job.events_lost):
        lost = max(job.events_lost for job in jobs if job.source == source)
        note(f"warning: {source} lost {lost:,} events or connect() destinations while recording (a full ring "
             "buffer: a busy host): the ranks' sockets made by lost calls count as other sockets, so the "
             "owners' laws may be low; record the job again on a quieter host")
    if as_json:
        say(json.dumps(projection.to_json(), indent=1))
        return
    say(render(projection))


def render(projection: object) -> str:
    """The projection in lines, for a terminal."""
    from fdtrace.analysis.scale import HOST, Projection
    from fdtrace.schema.owners import OWNERS

    assert isinstance(projection, Projection)
    p = projection
    lines = [f"at {p.world:,} ranks ({p.ranks_per_host} to a host), from world sizes "
             f"{', '.join(map(str, p.seen))}:"]
    for role, figures in p.roles.items():
        who = f"rank {p.store_rank} (hosts the store)" if role == HOST else "every other rank"
        limit = "unknown" if figures["limit"] is None else f"{figures['limit']:,}"
        lines.append(f"  {who}: {figures['fds']:,} descriptors ({figures['sockets']:,} sockets), "
                     f"{figures['threads']:,} threads; its limit {limit}")
        for owner, label in OWNERS.items():
            count = figures["by_owner"][owner]
            law = next(law for law in p.laws if law.role == role and law.figure == owner)
            if count or law.per:
                lines.append(f"    {label:32} {count:>8,}   {law.kind}: {law.words()}")
    for name, host in p.hosts.items():
        lines.append(f"  the {name}: {host['connections']:,} TCP connections, {host['ephemeral_ports']:,} "
                     f"ephemeral ports of {host['ephemeral_range']:,}, {host['fds']:,} descriptors, "
                     f"{host['threads']:,} threads")
    lines.append("limits:")
    for lim in p.limits:
        breaks = "never (below 10,000,000 ranks)" if lim.at_world is None else f"breaks at {lim.at_world:,} ranks"
        lines.append(f"  {lim.name}: {lim.value:,}; needs {lim.need(p.world):,}; {breaks}")
    if p.first_limit is None:
        lines.append("no limit breaks: max_world unbounded")
    else:
        lines.append(f"first limit to break: {p.first_limit.name} at {p.first_limit.at_world:,} ranks; "
                     f"max_world {p.max_world:,}")
    lines += [f"change: {line}" for line in p.advice if not line.startswith("the first limit")]
    return "\n".join(lines)
