#!/usr/bin/env python3
"""How long `replay`'s jumps take on a 10 M event recording (issue 35: every jump within 1 s).

Usage:  .venv/bin/python bench/replay_jump.py [--events 10M] [--seconds 1000] [--dir /var/tmp/fdtrace-jump]
                                            [--from-start]

Writes (once; kept under --dir) a recording through fdtrace's own recording writer
(bench/fleet_data.py, one host: a haproxy, two DDP ranks and a Go worker, a checkpoint storm at
the middle with EMFILE and an OOM kill, haproxy failing accept4 with EMFILE), loads it as
`fdtrace replay` does (``ReplaySource``), builds the player's cumulative index, then times each
jump as the view takes it: the control (n, N, or a seek), the update the source hands out and
the view's state rebuilt from it (``IncidentState``: the baseline from the index, the window's
events and sampling rounds, one roll), without drawing. ``--from-start`` also times the jump the
old way, replaying every event from the start of the recording up to the target.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from fleet_data import generate_fleet  # noqa: E402

from fdtrace.sources.replay import ReplaySource, TotalsIndex  # noqa: E402
from fdtrace.tui.state import IncidentState  # noqa: E402


def count(text: str) -> int:
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


class StillClock:
    """The real clock stands still: the replay's virtual clock moves only by the jumps."""

    def __call__(self) -> int:
        return 0


def rebuild(source: ReplaySource) -> tuple[IncidentState, int]:
    """The view's state from the update a jump hands out, as the view folds it (no drawing);
    the number of events that update carried."""
    update = source.poll()
    state = IncidentState()
    if update.baseline is not None:
        state.apply_baseline(update.baseline)
    state.apply_events(update.events)
    for sample_round in update.rounds:
        state.apply_samples(sample_round.samples, sample_round.time_ns)
        if sample_round.system:
            state.apply_system(sample_round.system)
    state.roll(update.now_ns, update.losses)
    return state, int(update.events.num_rows)


def timed(name: str, jump: Any, source: ReplaySource) -> float:
    began = time.perf_counter()
    jump()
    _, events = rebuild(source)
    took = time.perf_counter() - began
    at = (source.player.now_ns - source.player.start_ns) / 1e9
    note = f"  {source.incident_note}" if source.incident_note else ""
    print(f"{name:<28} to {at:7.1f} s: {took * 1000:7.0f} ms, {events:>9,} events in its window{note}", flush=True)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", default="10M")
    parser.add_argument("--seconds", type=int, default=1000)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/fdtrace-jump"))
    parser.add_argument("--from-start", action="store_true", help="also time a jump replaying from the start")
    parser.add_argument("--write-only", action="store_true", help="write the recording, measure nothing")
    args = parser.parse_args()
    events = count(args.events)
    root = args.dir / f"{events}-{args.seconds}"
    if not (root / "written").exists():  # a recording written whole before, else written again
        began = time.perf_counter()
        [truth] = generate_fleet(root, hosts=1, events_per_host=events, seconds=args.seconds)
        (root / "written").write_text(f"{truth.events}\n")
        print(f"wrote {truth.events:,} events over {args.seconds} s in {time.perf_counter() - began:.1f} s: {root}")
    if args.write_only:
        return
    began = time.perf_counter()
    source = ReplaySource(root / "host-00", clock=StillClock())
    source.player.pause()
    loaded = time.perf_counter() - began
    print(f"loaded {source.player.events.num_rows:,} events in {loaded:.1f} s, its cumulative index "
          f"({len(source.player.totals_index().checkpoints):,} checkpoints) built with it")
    began = time.perf_counter()
    TotalsIndex(source.player.events, source.player._times)
    print(f"cumulative index: {time.perf_counter() - began:.2f} s of that (built again to time it)")
    began = time.perf_counter()
    incidents = source.player.incidents()  # the position bar's first draw asks for them
    print(f"incidents indexed in {time.perf_counter() - began:.2f} s ({len(incidents.labels)})")
    span_s = (source.player.end_ns - source.player.start_ns) / 1e9
    took = []
    for _ in range(min(len(incidents.labels), 8)):
        took.append(timed("n (next incident)", source.next_problem, source))
    took.append(timed("N (previous incident)", source.previous_problem, source))
    for share in (0.1, 0.5, 0.9, 1.0):
        target = source.player.start_ns + int(share * span_s * 1e9)
        took.append(timed(f"seek to {share:.0%}", lambda t=target: source.seek(t), source))
    took.append(timed("] (+10 s)", lambda: source.seek_by(10), source))
    took.append(timed("[ (-10 s)", lambda: source.seek_by(-10), source))
    print(f"jumps: {len(took)}, slowest {max(took) * 1000:.0f} ms, median {sorted(took)[len(took) // 2] * 1000:.0f} ms")
    if args.from_start:
        target = source.player.start_ns + int(0.9 * span_s * 1e9)

        def from_start() -> None:
            source.player.replay_until(target)
            source._shown_until = source.player.start_ns - 1  # the old seek: every round again too
            source._baseline = None
            source._reset = True
        timed("old way: from the start", from_start, source)


if __name__ == "__main__":
    main()
