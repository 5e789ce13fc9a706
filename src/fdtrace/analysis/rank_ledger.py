"""Each rank's descriptors by owner: what a distributed job's processes hold them for.

A rank is a process the phases table names (``fdtrace run --record``). Its sockets are followed
through its own events (socket, accept, connect, close: each descriptor's maker, thread, peer and
port); every other descriptor (files,
pipes, eventfds, ...) is what its /proc samples counted beside its sockets. The moment is the
rank's last sample with the most sockets (its sockets are followed to that sample's time), or,
where no sample saw its sockets, when its calls held the most of them (its other descriptors are
then the peak less those sockets). Owners:

- ``store_server``: connections the rendezvous store accepted, on the rank that hosts it (its
  accepting thread is TCPStore's, ``pt_tcpstore*``);
- ``store_client``: the rank's connections to the rendezvous address (the init_process_group
  phase's name, MASTER_ADDR:MASTER_PORT; in recordings without it, the port every rank of the
  job connected to);
- ``pairs``: the collectives' connections (Gloo's full mesh, NCCL's bootstrap and proxy): made or
  accepted inside init_process_group or new_group, or by a Gloo or NCCL thread;
- ``listeners``: sockets that neither connected nor were accepted (the store's and each
  collective group's listening sockets);
- ``other_sockets``: every other socket (Unix sockets, connections made outside the groups);
- ``files_pipes``: descriptors that are no socket (files, pipes, eventfds, epoll): fdtrace traces
  their failures only, so they are counted, not split. The peak above that moment counts here too:
  the samples' most, or a descriptor open between two samples only (a file an import reads) that
  shows by its number in the rank's calls: the kernel gives the lowest free number, so every one
  below it was open then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from fdtrace.analysis.engines.dataset import engine_for, select_events
from fdtrace.schema.owners import CONNECTED_ERRNOS, OWNERS, STORE_THREADS, owner_of

#: The losses that cost the ledger what it counts from: events (a full ring buffer) and the
#: destinations of connect() calls (the table of calls in flight full).
EVENT_LOSSES = ("ringbuf_full", "peers_full")

if TYPE_CHECKING:
    from fdtrace.analysis.engines.dataset import Dataset

LEDGER_COLUMNS = ["host", "job", "world_size", "rank", "pid", "owner", "side", "phase", "thread", "descriptors"]
RANK_COLUMNS = ["host", "job", "world_size", "rank", "pid", "fds", "sockets", "threads", "fd_limit", "connects",
                "store_host"]
_EVENT_COLUMNS = ("host", "ts_ns", "pid", "tid", "comm", "kind", "ret", "errno", "fd", "family", "peer_addr",
                  "peer_port")


@dataclass
class JobLedger:
    """One job's ledger: its ranks' descriptors by owner and their totals.

    Attributes:
        job: the job's name (``HOST:PORT/N``: its rendezvous address and world size).
        world_size: ranks in the job.
        rendezvous: the store's address (``ADDR:PORT``), as the shim saw it or as inferred.
        store_port: the store's port (None: not found).
        store_rank: the rank whose process hosts the store (None: another process does, torchrun's agent).
        owners: one row per (rank, owner, side, phase, thread): LEDGER_COLUMNS.
        ranks: one row per rank: RANK_COLUMNS (fds: the most it held; fd_limit: its soft RLIMIT_NOFILE).
        system: the host limits the recording saw (somaxconn, threads_max, file_max).
        source: the recording it came from.
        events_lost: events the recording lost (``schema.STATS``: a full ring buffer, ...): sockets
            made by lost calls are counted as other sockets (unseen), so the owners may be low.
    """

    job: str
    world_size: int
    rendezvous: str | None
    store_port: int | None
    store_rank: int | None
    owners: pd.DataFrame
    ranks: pd.DataFrame
    system: dict[str, int] = field(default_factory=dict)
    source: str = ""
    events_lost: int = 0

    def by_owner(self) -> pd.DataFrame:
        """Descriptors per rank (rows) and owner (columns, every owner)."""
        table = self.owners.pivot_table(index="rank", columns="owner", values="descriptors", aggfunc="sum",
                                        fill_value=0)
        return table.reindex(columns=list(OWNERS), fill_value=0).reindex(self.ranks["rank"].tolist(),
                                                                          fill_value=0).astype("int64")


def _ranks_of(phases: pd.DataFrame) -> pd.DataFrame:
    """The ranks' processes: one row per (host, pid) with rank, world size, its init_process_group
    span and the rendezvous address its name gives."""
    if phases is None or phases.empty or "rank" not in phases.columns:
        return pd.DataFrame(columns=["host", "pid", "rank", "world_size", "init_start", "init_end", "rendezvous"])
    marked = phases[phases["rank"].notna() & phases["world_size"].notna()].copy()
    if "host" not in marked.columns:
        marked["host"] = ""
    marked["host"] = marked["host"].astype(str)
    inits = marked[marked["phase"] == "init_process_group"]
    rows = []
    for (host, pid), mine in inits.groupby(["host", "pid"], sort=False):
        for init in mine.sort_values("start_mono_ns").itertuples():
            name = init.name if isinstance(init.name, str) and ":" in init.name else None
            end = init.end_mono_ns if pd.notna(init.end_mono_ns) else init.start_mono_ns
            rows.append({"host": host, "pid": int(pid), "rank": int(init.rank), "world_size": int(init.world_size),
                         "init_start": int(init.start_mono_ns), "init_end": int(end), "rendezvous": name})
    return pd.DataFrame(rows, columns=["host", "pid", "rank", "world_size", "init_start", "init_end", "rendezvous"])


def _jobs(ranks: pd.DataFrame) -> list[pd.DataFrame]:
    """The ranks grouped into jobs: one host's ranks of one world size whose init_process_group
    spans overlap (its ranks wait for each other there), or that name one rendezvous."""
    jobs: list[pd.DataFrame] = []
    for (_host, _world, _name), same in ranks.groupby(["host", "world_size", ranks["rendezvous"].fillna("")],
                                                       sort=False):
        same = same.sort_values("init_start")
        group: list[int] = []
        end = None
        for index, row in same.iterrows():
            if group and (end is None or row["init_start"] > end or len(group) >= int(row["world_size"])):
                jobs.append(same.loc[group])
                group, end = [], None
            group.append(index)
            end = row["init_end"] if end is None else max(end, row["init_end"])
        if group:
            jobs.append(same.loc[group])
    return sorted(jobs, key=lambda job: int(job["init_start"].min()))  # in the order they ran


def _innermost(phases: pd.DataFrame, pid: int, ts: int) -> str | None:
    """The innermost phase of ``pid`` around ``ts`` (the shortest span that holds it)."""
    mine = phases[(phases["pid"] == pid) & (phases["start_mono_ns"] <= ts) &
                  (phases["end_mono_ns"].fillna(phases["start_mono_ns"]) >= ts)]
    if mine.empty:
        return None
    return str(mine.assign(length=mine["end_mono_ns"] - mine["start_mono_ns"]).sort_values("length")["phase"].iloc[0])


def _open_at_peak(events: pd.DataFrame, at_ns: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """A process's sockets open at ``at_ns`` (its sample with the most descriptors), or when it
    held the most of them, followed through its events; and how many of them it connected. A
    socket whose connect failed is left out from then on: it is a lookup's retry, closed at once."""
    open_now: dict[int, dict[str, Any]] = {}
    best: list[dict[str, Any]] = []
    for ev in events.itertuples(index=False):
        if at_ns is not None and ev.ts_ns > at_ns:
            break
        fd = int(ev.fd) if pd.notna(ev.fd) else None
        errno = ev.errno if isinstance(ev.errno, str) else ""
        if ev.kind in ("socket", "accept"):
            if fd is None or errno or (pd.notna(ev.ret) and ev.ret < 0):
                continue
            open_now[fd] = {"ts": int(ev.ts_ns), "tid": int(ev.tid), "thread": str(ev.comm),
                            "side": "accepted" if ev.kind == "accept" else "unconnected",
                            "family": ev.family if isinstance(ev.family, str) else None,
                            "peer_port": int(ev.peer_port) if pd.notna(ev.peer_port) else None}
        elif ev.kind == "connect":
            if fd in open_now and errno not in CONNECTED_ERRNOS:
                open_now.pop(fd)  # a failed connect (the name service cache's absent socket): closed next
            elif fd in open_now:
                open_now[fd].update(side="connected", family=ev.family if isinstance(ev.family, str) else None,
                                    peer_port=int(ev.peer_port) if pd.notna(ev.peer_port) else None,
                                    connect_tid=int(ev.tid), connect_thread=str(ev.comm))
        elif ev.kind == "close":
            if fd is not None and not errno:
                open_now.pop(fd, None)
        if at_ns is None and len(open_now) > len(best):
            best = [dict(v) for v in open_now.values()]
    if at_ns is not None:
        best = list(open_now.values())
    return best, sum(1 for s in best if s["side"] == "connected")


def _store_port(ranks: pd.DataFrame, events: pd.DataFrame) -> int | None:
    """The store's port: the rendezvous name's, else the TCP port every rank of the job connected
    to inside init_process_group (each rank is a client of the store; a collective pair's
    listener port is one rank's)."""
    for name in ranks["rendezvous"].dropna():
        port = str(name).rsplit(":", 1)[-1]
        if port.isdigit():
            return int(port)
    seen: dict[int, set[int]] = {}
    for row in ranks.itertuples():
        mine = events[(events["pid"] == row.pid) & (events["kind"] == "connect") &
                      events["errno"].isin(["", "EINPROGRESS"]) & events["peer_port"].notna() &
                      events["ts_ns"].between(row.init_start, row.init_end)]
        for port in set(mine["peer_port"].astype(int)):
            seen.setdefault(port, set()).add(row.pid)
    everyone = [p for p, pids in seen.items() if len(pids) == len(ranks)]
    return everyone[0] if len(everyone) == 1 else None


def job_ledgers(recording: Dataset, source: str = "") -> list[JobLedger]:
    """The ledger of every distributed job in a recording (one per job the phases table names).

    Args:
        recording: a recording of ``fdtrace run --record`` (its phases name the ranks).
        source: the recording's name, kept for messages.
    """
    phases = recording.phases
    ranks = _ranks_of(phases)
    if ranks.empty:
        return []
    phases = phases[phases["pid"].isin(ranks["pid"])]
    pids = ", ".join(str(int(p)) for p in sorted(set(ranks["pid"])))
    with engine_for(recording) as engine:
        events = select_events(engine, f"pid IN ({pids}) AND kind IN ('socket', 'accept', 'connect', 'close')",
                               _EVENT_COLUMNS)
        samples = engine.query(f"SELECT host, pid, ts_ns, open_fds, sockets, threads, fd_soft_limit FROM samples "
                               f"WHERE pid IN ({pids})")
        system = engine.query("SELECT max(somaxconn) AS somaxconn, max(threads_max) AS threads_max, "
                              "max(file_max) AS file_max FROM system")
        lost_columns = [name for name in EVENT_LOSSES if name in engine.columns("losses")]
        lost = engine.query(f"SELECT {' + '.join(f'coalesce(sum({c}), 0)' for c in lost_columns)} AS n "
                            "FROM losses") if lost_columns else None
    for column in ("kind", "errno", "comm", "family"):
        if column in events.columns:
            events[column] = events[column].astype(object)
    events["errno"] = events["errno"].fillna("")
    if "host" in events.columns:
        events["host"] = events["host"].astype(str)
    samples["host"] = samples["host"].astype(str)
    limits = {k: int(v) for k, v in system.iloc[0].items() if pd.notna(v)} if len(system) else {}
    found = []
    events_lost = int(lost["n"].iloc[0]) if lost is not None and len(lost) and pd.notna(lost["n"].iloc[0]) else 0
    for job in _jobs(ranks):
        found.append(_ledger_of(job, events, samples, phases, limits, source))
        found[-1].events_lost = events_lost
    return found


def _ledger_of(job: pd.DataFrame, events: pd.DataFrame, samples: pd.DataFrame, phases: pd.DataFrame,
               limits: dict[str, int], source: str) -> JobLedger:
    host = str(job["host"].iloc[0])
    world = int(job["world_size"].iloc[0])
    mine = events[events["pid"].isin(job["pid"]) & ((events["host"] == host) if "host" in events.columns else True)]
    store_port = _store_port(job, mine)
    names = job["rendezvous"].dropna()
    rendezvous = str(names.iloc[0]) if len(names) else (f"?:{store_port}" if store_port is not None else None)
    label = f"{rendezvous or '?'}/{world}"
    store_tids = set(mine[(mine["kind"] == "accept") &
                          mine["comm"].astype(str).str.startswith(STORE_THREADS)]["tid"].astype(int))
    owner_rows: list[dict[str, Any]] = []
    rank_rows: list[dict[str, Any]] = []
    store_rank = None
    for row in job.sort_values("rank").itertuples():
        evs = mine[mine["pid"] == row.pid].sort_values("ts_ns", kind="stable")
        own = samples[(samples["pid"] == row.pid) & (samples["host"] == host)]
        # The moment: the last sample with the most sockets (a round's time is taken before /proc is
        # read, so a rank's first such sample may precede the calls that made them: one still in init).
        # Without a sample that saw its sockets (the recorder's rounds can stall on a busy host), the
        # moment is when its calls held the most sockets.
        saw = own[own["sockets"].fillna(0) > 0]
        top = saw.sort_values(["sockets", "ts_ns"], ascending=False).iloc[0] if len(saw) else None
        at_ns = None if top is None else int(top["ts_ns"])
        # The peak: the samples' most, or more where a descriptor was open between two samples only
        # (a file an import reads): the kernel gives the lowest free number, so all below the
        # highest number the rank's calls name were open then.
        numbered = evs[evs["kind"].isin(["socket", "accept", "close"]) & (evs["errno"] == "") & evs["fd"].notna()]
        highest = int(numbered["fd"].astype("int64").max()) + 1 if len(numbered) else 0
        sockets, connects = _open_at_peak(evs, at_ns)
        counted: dict[tuple[str, str, str | None, str], int] = {}
        # Without the store's port (a recording without peers): TCPStore's client connects first.
        first_client = None if store_port is not None else min(
            (s["ts"] for s in sockets if s["side"] == "connected" and s["family"] != "AF_UNIX"
             and _innermost(phases, row.pid, s["ts"]) == "init_process_group"), default=None)
        for sock in sockets:
            phase = _innermost(phases, row.pid, sock["ts"])
            if first_client is not None and sock["ts"] == first_client and sock["side"] == "connected":
                key = ("store_client", sock["side"], phase, sock["thread"])
                counted[key] = counted.get(key, 0) + 1
                continue
            owner = owner_of(sock["side"], sock["family"], sock["peer_port"],
                             (sock["thread"], sock.get("connect_thread", "")), phase, store_port,
                             sock["tid"] in store_tids)
            key = (owner, sock["side"], phase, sock["thread"])
            counted[key] = counted.get(key, 0) + 1
        peak_fds = max(int(own["open_fds"].max()) if len(own) else 0, highest)
        if top is not None:
            seen_sockets = int(top["sockets"])
            # files and pipes: beside the sockets then, and what the peak holds above that moment
            non_sockets = max(int(top["open_fds"]) - seen_sockets, 0) + max(peak_fds - int(top["open_fds"]), 0)
            unseen = max(seen_sockets - len(sockets), 0)  # sockets from before tracing, or lost events
        else:
            non_sockets, unseen = max(peak_fds - len(sockets), 0), 0
        threads = int(own["threads"].max()) if len(own) else 0
        soft = own["fd_soft_limit"].dropna()
        fd_limit = int(soft.min()) if len(soft) else None
        if unseen:
            counted[("other_sockets", "unseen", None, "")] = unseen
        counted[("files_pipes", "", None, "")] = non_sockets
        for (owner, side, phase, thread), n in counted.items():
            owner_rows.append({"host": host, "job": label, "world_size": world, "rank": int(row.rank),
                               "pid": int(row.pid), "owner": owner, "side": side, "phase": phase, "thread": thread,
                               "descriptors": n})
        hosts_store = any(k[0] == "store_server" for k in counted)
        if hosts_store and store_rank is None:
            store_rank = int(row.rank)
        total_sockets = len(sockets) + unseen
        rank_rows.append({"host": host, "job": label, "world_size": world, "rank": int(row.rank),
                          "pid": int(row.pid), "fds": max(peak_fds, total_sockets + non_sockets),
                          "sockets": total_sockets, "threads": threads, "fd_limit": fd_limit, "connects": connects,
                          "store_host": hosts_store})
    owners = pd.DataFrame(owner_rows, columns=LEDGER_COLUMNS)
    return JobLedger(label, world, rendezvous, store_port, store_rank, owners,
                     pd.DataFrame(rank_rows, columns=RANK_COLUMNS), limits, source)


def ledger_frame(jobs: list[JobLedger]) -> pd.DataFrame:
    """The jobs' ledgers as one frame (LEDGER_COLUMNS), ranks in order."""
    frames = [j.owners for j in jobs if not j.owners.empty]
    if not frames:
        return pd.DataFrame(columns=LEDGER_COLUMNS)
    return pd.concat(frames, ignore_index=True)
