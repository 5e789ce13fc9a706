"""User stacks kept by the BPF programs (--stacks), symbolized while their process lives.

Each address is symbolized once per mapped binary: the cache is keyed by the file (device, inode)
and the address's offset in it, so the hundred workers of one haproxy share their frames; each
binary's symbol table is read once (``fdtrace.procfs.elf``).
"""

from __future__ import annotations

import bisect
import os
import time
from collections import Counter, OrderedDict

from fdtrace.procfs import ProcFS
from fdtrace.procfs.elf import (
    BudgetSpentError,
    ElfError,
    ModuleSymbols,
    NotElfError,
    ReadBudget,
    demangled,
    read_module,
)
from fdtrace.procfs.python_frames import MAX_WALK_SECONDS, PythonStackReader, PythonStacks, WalkLimit, waiting_in
from fdtrace.procfs.reader import READ_ERRORS
from fdtrace.schema import STACK_DEPTH
from fdtrace.schema.records import Stack
from fdtrace.schema.site_names import THREAD_ENTRY_FUNCTIONS

#: Why a binary's symbols or a process's Python stacks were left unread (counted).
OVER_BUDGET = "over the round's budget"
NOT_WALKED = "not walked (the round's time was spent)"
#: Functions a thread's stack starts from: a walk that ends in one of them is whole.
OUTERMOST_FUNCTIONS = THREAD_ENTRY_FUNCTIONS


class Symbolizer:
    """Addresses of a process to "function+0xoffset [module]", cached per binary.

    The binaries are read by fdtrace's own ELF reader (``fdtrace.procfs.elf``), each opened as
    the very file the process maps (its /proc/PID/map_files entry, else its path under
    /proc/PID/root when that is still the same regular file), never by a path it could swap for
    a FIFO or another file."""

    #: Memory the symbols of the binaries kept may hold together (the least used go first), and
    #: bytes of symbol tables read from binaries each second (``begin``), across all of them: a
    #: process mapping a thousand crafted libraries costs a round this much, the rest next rounds.
    MAX_MODULE_BYTES = 256 << 20
    ROUND_READ_BYTES = 64 << 20

    def __init__(self, procfs: ProcFS | None = None, max_frames: int = 200_000, max_modules: int = 256,
                 max_module_bytes: int = MAX_MODULE_BYTES, round_read_bytes: int = ROUND_READ_BYTES) -> None:
        self._procfs = procfs or ProcFS()
        self._frames: OrderedDict[tuple[int, int, int], str] = OrderedDict()
        self._max_frames = max_frames
        self._modules: OrderedDict[tuple[int, int], ModuleSymbols | None] = OrderedDict()
        self._max_modules = max_modules
        self._max_module_bytes = max_module_bytes
        self._module_bytes = 0
        self.budget = ReadBudget(round_read_bytes)
        self._renewed = time.monotonic()
        #: Binaries whose symbols were left unread, by why: "over the round's budget" (read in a
        #: later round), "unreadable" (tables the file cannot hold: a sparse file; or a read that
        #: failed). A mapped file that is not ELF (JIT code, libffi's trampolines) has no symbols to
        #: read and is not counted.
        self.unread: Counter[str] = Counter()
        self._calls: dict[tuple[int, int, int], bool] = {}
        self._targets: dict[tuple[int, int], int | None] = {}  # (pid, return address) -> callee, this poll
        self._maps: dict[int, list[tuple[int, int, int, int, int, str]]] = {}

    def begin(self) -> None:
        """Forget the mappings read so far (call once per poll: they change with dlopen and exec),
        and renew the round's budget of symbol tables read."""
        self._maps.clear()
        self._targets.clear()
        now = time.monotonic()
        if now - self._renewed >= 1.0:  # polls come a hundred a second: the budget is a second's
            self._renewed = now
            self.budget.renew()

    def executable_maps(self, pid: int) -> list[tuple[int, int, int, int, int, str]]:
        """``pid``'s executable mappings, read once per poll (empty where unreadable)."""
        maps = self._maps.get(pid)
        if maps is None:
            try:
                maps = self._procfs.executable_maps(pid)
            except READ_ERRORS:  # gone, denied, or a read that failed
                maps = []
            self._maps[pid] = maps
        return maps

    def _mapping(self, pid: int, address: int) -> tuple[int, int, int, int, int, str] | None:
        maps = self.executable_maps(pid)
        i = bisect.bisect_right(maps, (address, 1 << 64)) - 1
        if i >= 0 and maps[i][0] <= address < maps[i][1]:
            return maps[i]
        return None

    def _module(self, pid: int, mapping: tuple[int, int, int, int, int, str]) -> ModuleSymbols | None:
        """The symbols of a mapped file, read once per (device, inode)."""
        start, end, _offset, device, inode, path = mapping
        key = (device, inode)
        if key in self._modules:
            self._modules.move_to_end(key)
            return self._modules[key]
        found = None
        failed = False
        for candidate in self._procfs.mapped_files(pid, start, end, device, inode, path):
            try:
                found = read_module(candidate, self.budget)
            except BudgetSpentError:
                self.unread[OVER_BUDGET] += 1
                return None  # not remembered: read in a later round
            except NotElfError:
                failed = False
                break
            except (OSError, ElfError):
                failed = True
                continue
            break
        if found is None and failed:
            self.unread["unreadable"] += 1
        self._modules[key] = found
        self._module_bytes += found.nbytes if found is not None else 0
        while len(self._modules) > self._max_modules or self._module_bytes > self._max_module_bytes:
            _, gone = self._modules.popitem(last=False)
            self._module_bytes -= gone.nbytes if gone is not None else 0
        return found

    def frame(self, pid: int, address: int) -> tuple[str, str | None]:
        """(the frame's text, its function or None)."""
        mapping = self._mapping(pid, address)
        if mapping is None:
            return f"{address:#x}", None
        offset = address - mapping[0] + mapping[2]
        key = (mapping[3], mapping[4], offset)
        if mapping[4]:
            text = self._frames.get(key)
            if text is not None:
                self._frames.move_to_end(key)
                return text, _function(text)
        module = self._module(pid, mapping) if mapping[4] else None
        found = module.resolve(offset) if module is not None else None
        module_name = os.path.basename(mapping[5]) if mapping[5] else None
        name = None
        if found is not None:
            name = demangled(found[0])
            text = f"{name}+{found[1]:#x}" + (f" [{module_name}]" if module_name else "")
        elif module_name:
            text = f"[{module_name}]+{offset:#x}"
        else:
            text = f"{address:#x}"
        if mapping[4]:
            self._frames[key] = text
            if len(self._frames) > self._max_frames:
                self._frames.popitem(last=False)
        return text, name

    def code_span(self, pid: int) -> tuple[int, int]:
        """The lowest and highest address of the process's executable mappings ((0, 0): none)."""
        self._mapping(pid, 0)  # reads its mappings once per poll
        maps = self._maps.get(pid) or []
        return (maps[0][0], maps[-1][1]) if maps else (0, 0)

    def executable(self, pid: int, address: int) -> bool:
        """Whether ``address`` lies in an executable mapping of the process (code, JIT code too)."""
        return self._mapping(pid, address) is not None

    def read_memory(self, pid: int, address: int, size: int) -> bytes:
        """``size`` bytes of the process's memory at ``address`` (through its ProcFS, bounded);
        fewer (or none) where unmapped or gone."""
        return self._procfs.read_memory(pid, address, size)

    def after_call(self, pid: int, address: int) -> bool:
        """Whether ``address`` in the process follows a call instruction (so it can be a return
        address): a near call ``e8 rel32``, or an indirect ``ff /2`` of 2 to 7 bytes."""
        mapping = self._mapping(pid, address)
        if mapping is None or not mapping[4]:
            return False
        key = (mapping[3], mapping[4], address - mapping[0] + mapping[2])
        known = self._calls.get(key)
        if known is not None:
            return known
        before = self.read_memory(pid, address - 7, 7)
        follows = len(before) == 7 and (before[2] == 0xE8 or any(
            before[7 - k] == 0xFF and (before[8 - k] >> 3) & 7 == 2 for k in (2, 3, 4, 6, 7)))
        self._calls[key] = follows
        if len(self._calls) > self._max_frames:
            self._calls.clear()
        return follows

    def call_target(self, pid: int, address: int) -> int | None:
        """Where the call that returns to ``address`` went, or None where the instruction does not
        say (a call through a register).

        A direct ``e8 rel32`` and a ``call *disp(%rip)`` (code built with -fno-plt) name their
        callee; a PLT stub they reach (``jmp *disp(%rip)``, after an endbr64 and a bnd prefix
        where present) is followed through the process's GOT to the function it was bound to."""
        # Kept for this poll only and this process only: its own base address and GOT are in it.
        key = (pid, address)
        if key in self._targets:
            return self._targets[key]
        target = self._targets[key] = self._call_target(pid, address)
        if len(self._targets) > self._max_frames:
            self._targets.clear()
        return target

    def _call_target(self, pid: int, address: int) -> int | None:
        before = self.read_memory(pid, address - 6, 6)
        if len(before) != 6:
            return None
        if before[1] == 0xE8:
            target = (address + int.from_bytes(before[2:], "little", signed=True)) & (1 << 64) - 1
        elif before[0] == 0xFF and before[1] == 0x15:
            slot = self.read_memory(pid, address + int.from_bytes(before[2:], "little", signed=True), 8)
            return int.from_bytes(slot, "little") if len(slot) == 8 else None
        else:
            return None
        if self._mapping(pid, target) is None:
            return target  # not code: no stub to follow (and no memory of the process read there)
        stub = self.read_memory(pid, target, 11)
        at = 4 if stub.startswith(b"\xf3\x0f\x1e\xfa") else 0  # endbr64
        at += 1 if stub[at:at + 1] == b"\xf2" else 0  # bnd
        if stub[at:at + 2] == b"\xff\x25" and len(stub) >= at + 6:
            next_instruction = target + at + 6
            displacement = int.from_bytes(stub[at + 2:at + 6], "little", signed=True)
            slot = self.read_memory(pid, next_instruction + displacement, 8)
            if len(slot) == 8:
                return int.from_bytes(slot, "little")
        return target

    def close(self) -> None:
        """Let go of the cached symbols."""
        self._modules.clear()
        self._module_bytes = 0
        self._frames.clear()


def symbolize(symbolizer: Symbolizer, stack_id: int, pid: int, scan: list[int], addresses: list[int], comm: str,
              mono_ns: int) -> Stack:
    """One kept stack as frames, with the callers a frame-pointer walk skipped put back.

    A walk that starts in a libc wrapper, which makes no frame (or keeps no frame pointer), skips
    the wrapper's caller: its return address lies in the wrapper's part of the stack, among the
    ``scan`` words from the stack pointer up. Scanning them, a word counts as a return address
    when it points into a mapped binary right after a call instruction; those found before the
    first one outside the wrapper's module are put back after the first frame."""
    frames: list[str] = []
    functions: list[str | None] = []
    astray = False
    for i, address in enumerate(addresses):
        if i and not symbolizer.executable(pid, address):
            astray = True  # a frame pointer that was not one: the rest is data, not code
            break
        text, function = symbolizer.frame(pid, address)
        frames.append(text)
        functions.append(function)
    recovered = _skipped_callers(symbolizer, pid, scan, addresses)
    frames[1:1] = [text for text, _ in recovered]
    functions[1:1] = [function for _, function in recovered]
    if astray:
        truncated: str | None = (f"the walk went astray after {frames[-1]}: code without frame pointers "
                                 "(outer frames unknown)")
    elif len(addresses) >= STACK_DEPTH:
        truncated = f"cut at {STACK_DEPTH} frames"
    elif functions and functions[-1] in OUTERMOST_FUNCTIONS:
        truncated = None
    else:
        truncated = (f"the walk stopped at {frames[-1] if frames else 'the first frame'}, not at a thread's start: "
                     "code without frame pointers")
    return Stack(stack_id, pid, comm, tuple(frames), truncated, mono_ns)


def _skipped_callers(symbolizer: Symbolizer, pid: int, scan: list[int], addresses: list[int]) -> list[tuple[str, str]]:
    if not addresses or not any(scan):
        return []
    first_text, callee = symbolizer.frame(pid, addresses[0])
    first_module = _module(first_text)
    callee_start = _function_start(first_text, addresses[0])
    following = addresses[1] if len(addresses) > 1 else None
    found: list[tuple[str, str]] = []
    for word in scan:
        if word == following:
            break  # the walk already has this caller
        caller = None if word == addresses[0] else _caller(symbolizer, pid, word, callee, callee_start)
        if caller is None:
            continue
        text, function = caller
        found.append((text, function))
        callee, callee_start = function, _function_start(text, word)
        if _module(text) != first_module or len(found) >= 4:
            break
    if found and _module(found[-1][0]) == first_module:
        return []  # nothing outside the wrapper's own module: not what the walk skipped
    return found


def _caller(symbolizer: Symbolizer, pid: int, word: int, callee: str | None,
            callee_start: int | None) -> tuple[str, str] | None:
    """(frame text, function) when a stack word is the return address of a call to ``callee``
    (or a call whose target cannot be read), else None."""
    if word < 4096 or not symbolizer.after_call(pid, word):
        return None
    text, function = symbolizer.frame(pid, word)
    if function is None or text.startswith(f"{function}+0x0 "):
        return None  # a function's own address (a pointer kept on the stack) returns nowhere
    target = symbolizer.call_target(pid, word)
    if target is not None and target != callee_start and symbolizer.frame(pid, target)[1] != callee:
        return None  # left on the stack by an earlier call to something else: not this one's caller
    return text, function


def _function_start(text: str, address: int) -> int | None:
    """The address of the start of the function a frame's text names, or None where it names none."""
    head = text.rsplit(" [", 1)[0]  # "name+0xoffset": the name may hold a "+" (C++ operator+)
    if text.startswith(("[", "0x")) or "+0x" not in head:
        return None
    return address - int(head.rsplit("+0x", 1)[1], 16)


def _module(text: str) -> str:
    return text.rsplit(" [", 1)[1] if " [" in text else ""


def _function(text: str) -> str | None:
    if text.startswith(("[", "0x")):
        return None
    return text.split("+", 1)[0]


#: How much of a blocked thread's stack is read above its stack pointer, and the frames kept.
BLOCKED_STACK_BYTES = 4096
BLOCKED_FRAMES = 16


def blocked_frames(symbolizer: Symbolizer, pid: int, pc: int, sp: int) -> list[str]:
    """The user stack of a thread blocked in a syscall, from the program counter and stack pointer
    /proc/PID/task/TID/syscall gives: the function of ``pc``, then each return address above
    ``sp`` whose call went to the frame found before it (a word left by an earlier call to
    something else is passed over), innermost first, at most BLOCKED_FRAMES."""
    if pc < 4096 or not symbolizer.executable(pid, pc):
        return []
    text, callee = symbolizer.frame(pid, pc)
    frames = [text]
    callee_start = _function_start(text, pc)
    data = symbolizer.read_memory(pid, sp, BLOCKED_STACK_BYTES)
    low, high = symbolizer.code_span(pid)
    for word in memoryview(data[:len(data) // 8 * 8]).cast("Q"):
        if not low <= word < high:
            continue  # data, not code: most of a stack's words
        caller = _caller(symbolizer, pid, word, callee, callee_start)
        if caller is None:
            continue
        text, function = caller
        frames.append(text)
        callee, callee_start = function, _function_start(text, word)
        if len(frames) >= BLOCKED_FRAMES or function in OUTERMOST_FUNCTIONS:
            break
    return frames


class BlockedCode:
    """Names the code a blocked thread waits in (``fdtrace.procfs.threads.thread_census``'s
    ``site_of``). In a CPython process, the Python function of the thread's own code it waits in
    ("hold_pipe (loader.py:12)", ``fdtrace.procfs.python_frames``); elsewhere, or for a thread with
    no Python frames, the first frame of its native stack outside the C library and the Go
    runtime's syscall plumbing ("main.holdThread"); None where every frame is theirs."""

    #: Threads whose site is remembered: one still blocked where it was costs a lookup next round.
    MAX_REMEMBERED = 65536
    #: Seconds the walks of Python stacks may take in one round, all processes together (each
    #: walk is bounded by ``python_frames.MAX_WALK_SECONDS`` too).
    ROUND_PYTHON_SECONDS = 1.0

    def __init__(self, symbolizer: Symbolizer | None = None, procfs: ProcFS | None = None) -> None:
        self.symbolizer = symbolizer or Symbolizer()
        self._procfs = procfs or ProcFS()
        self._known: OrderedDict[tuple[int, int, int], str | None] = OrderedDict()
        self._python_reader = PythonStackReader()
        self._python: dict[int, PythonStacks | None] = {}  # this round's, by pid
        self._python_until = time.monotonic() + self.ROUND_PYTHON_SECONDS
        #: Python stack walks abandoned (over their bounds) and not begun (the round's time spent).
        self.python_cut: Counter[str] = Counter()

    def begin(self) -> None:
        """Once per census round: mappings change with dlopen and exec, Python stacks with time."""
        self.symbolizer.begin()
        self._python.clear()
        self._python_until = time.monotonic() + self.ROUND_PYTHON_SECONDS

    def python_stacks(self, pid: int) -> PythonStacks | None:
        """The Python stacks of ``pid`` this round (read once a round), None if it runs no CPython."""
        if pid not in self._python:  # the mappings the symbolizer reads this round anyway
            left = self._python_until - time.monotonic()
            if left <= 0:
                self.python_cut[NOT_WALKED] += 1
                self._python[pid] = None
                return None
            try:
                threads = set(self._procfs.thread_ids(pid))
            except READ_ERRORS:
                threads = None
            limit = WalkLimit(seconds=min(MAX_WALK_SECONDS, left))
            self._python[pid] = self._python_reader.stacks(pid, self.symbolizer.executable_maps(pid), threads, limit)
            if limit.cut is not None:
                self.python_cut["abandoned"] += 1
        return self._python[pid]

    def shortfalls(self) -> list[str]:
        """What was left unread since it was made, in words (nothing: an empty list)."""
        said = []
        unread = self.symbolizer.unread
        if unread["unreadable"]:
            said.append(f"symbols of {unread['unreadable']} binaries not read (tables larger than the file holds "
                        "on disk, or unreadable)")
        if unread[OVER_BUDGET]:
            said.append(f"{unread[OVER_BUDGET]} binaries' symbols left for a later round (over the "
                        f"{self.symbolizer.budget.limit >> 20} MiB a second read)")
        if self.python_cut["abandoned"]:
            said.append(f"{self.python_cut['abandoned']} Python stack walks abandoned (over their bounds)")
        if self.python_cut[NOT_WALKED]:
            said.append(f"{self.python_cut[NOT_WALKED]} Python stack walks not "
                        "begun (the round's time for them was spent)")
        return said

    def __call__(self, pid: int, tid: int, pc: int, sp: int) -> str | None:
        from fdtrace.schema.site_names import code_site

        python = self.python_stacks(pid)
        if python is not None and python.stacks.get(tid):
            frame = waiting_in(python.stacks[tid])
            return None if frame is None else str(frame)  # read each round: one C stack serves many Python ones
        key = (pid, pc, sp)
        if key in self._known:
            self._known.move_to_end(key)
            return self._known[key]
        site = self._known[key] = code_site(blocked_frames(self.symbolizer, pid, pc, sp))
        while len(self._known) > self.MAX_REMEMBERED:
            self._known.popitem(last=False)
        return site

    def close(self) -> None:
        """Let go of the cached symbols."""
        self.symbolizer.close()
        self._known.clear()
        self._python.clear()
