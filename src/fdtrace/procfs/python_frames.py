"""The Python stack of each thread of a CPython process, read from its memory as sampling
profilers do (py-spy, austin): from the interpreter's ``_PyRuntime`` to its thread states, each
thread's current frame, the frames below it, and each frame's code object (function, file, line).

Only what a census needs: which Python function a blocked thread waits in. The layouts are those
of CPython 3.11 and 3.12 on 64-bit little-endian machines (``LAYOUTS``) and what 3.13 says of
itself; the version is read from the process (``Py_Version``), never assumed, and any other
version is named as not read. The
process's memory is data another user controls: every read is bounded in size and count, every
pointer checked, and nothing found there can make the reader loop, allocate without bound, or
raise past ``python_stacks``.
"""

from __future__ import annotations

import os
import re
import struct
import time
from dataclasses import dataclass

from fdtrace.procfs.elf import ElfError, ElfFile
from fdtrace.procfs.reader import READ_ERRORS, ProcessMemory, ProcFS

#: Thread states walked per process (all its interpreters together), frames per thread,
#: interpreters per process, at most.
MAX_THREADS = 4096
MAX_FRAMES = 128
MAX_INTERPRETERS = 16
#: What one process's walk may cost at most, whatever its memory says: frames read (all threads
#: together), bytes of line tables read, and seconds. Past any of them the walk is abandoned and
#: says so (``PythonStacks.unread``); the threads read by then keep their stacks.
MAX_WALK_FRAMES = 32768
MAX_WALK_LINETABLE_BYTES = 16 << 20
MAX_WALK_SECONDS = 0.5
#: Characters of a name or file read at most, and bytes of a code object's line table.
MAX_NAME_CHARS = 1024
MAX_LINETABLE_BYTES = 1 << 20

#: A file the interpreter lives in: python3.11, libpython3.12.so.1.0, libpython3.11d.so.
_INTERPRETER_FILE = re.compile(r"^(?:lib)?python(\d)\.(\d+)[a-z]*(?:\.so[.\d]*)?$")
_USER_SPACE_END = 1 << 47


@dataclass(frozen=True)
class PythonLayout:
    """Offsets (bytes) of the fields walked, for one CPython minor version."""

    interpreters_head: int  # _PyRuntimeState.interpreters.head
    interpreter_next: int  # PyInterpreterState.next
    threads_head: int  # PyInterpreterState.threads.head
    thread_next: int  # PyThreadState.next
    native_thread_id: int  # PyThreadState.native_thread_id
    cframe: int | None  # PyThreadState.cframe (3.11, 3.12); None: current_frame is the thread state's
    current_frame: int  # _PyCFrame.current_frame, or PyThreadState.current_frame (3.13)
    frame_code: int  # _PyInterpreterFrame.f_code
    frame_previous: int  # _PyInterpreterFrame.previous
    frame_prev_instr: int  # _PyInterpreterFrame.prev_instr
    frame_owner: int  # _PyInterpreterFrame.owner
    owner_c_stack: int | None  # FRAME_OWNED_BY_CSTACK: an entry frame of no code of its own
    code_filename: int
    code_qualname: int
    code_linetable: int
    code_firstlineno: int
    code_instructions: int  # offsetof(PyCodeObject, co_code_adaptive)
    ascii_data: int  # where a compact ASCII string's characters start
    compact_data: int  # where any other compact string's characters start
    string_length: int = 16  # PyASCIIObject.length
    string_state: int = 32  # PyASCIIObject.state (kind, compact, ascii bits)
    bytes_size: int = 16  # PyBytesObject.ob_size
    bytes_data: int = 32  # PyBytesObject.ob_sval


#: Checked against the real interpreters (tests/bpf/test_python_frames.py): Debian's 3.11 and a
#: 3.12 build, by reading a child's blocked threads and comparing with what it says of itself.
#: 3.13 describes itself (``_Py_DebugOffsets`` at the start of ``_PyRuntime``: ``debug_layout``).
LAYOUTS: dict[tuple[int, int], PythonLayout] = {
    (3, 11): PythonLayout(
        interpreters_head=40, interpreter_next=0, threads_head=16, thread_next=8, native_thread_id=160,
        cframe=56, current_frame=8, frame_code=32, frame_previous=48, frame_prev_instr=56, frame_owner=69,
        owner_c_stack=None, code_filename=112, code_qualname=128, code_linetable=136, code_firstlineno=72,
        code_instructions=184, ascii_data=48, compact_data=72),
    (3, 12): PythonLayout(
        interpreters_head=40, interpreter_next=0, threads_head=72, thread_next=8, native_thread_id=144,
        cframe=56, current_frame=0, frame_code=0, frame_previous=8, frame_prev_instr=56, frame_owner=70,
        owner_c_stack=3, code_filename=112, code_qualname=128, code_linetable=136, code_firstlineno=68,
        code_instructions=192, ascii_data=40, compact_data=56),
}


#: ``_Py_DebugOffsets`` of CPython 3.13: the index (in 8-byte words) of each offset fdtrace uses.
#: 3.14 changed the structure; its version field says which one a runtime holds.
_DEBUG_COOKIE = b"xdebugpy"
_DEBUG_WORDS_313 = 71
_DEBUG_INDEX_313 = {
    "free_threaded": 2, "interpreters_head": 5, "interpreter_next": 8, "threads_head": 9, "thread_next": 21,
    "current_frame": 23, "native_thread_id": 25, "frame_previous": 29, "frame_code": 30, "frame_prev_instr": 31,
    "frame_owner": 33, "code_filename": 35, "code_qualname": 37, "code_linetable": 38, "code_firstlineno": 39,
    "code_instructions": 43, "bytes_size": 65, "bytes_data": 66, "string_state": 68, "string_length": 69,
    "ascii_size": 70}


def debug_layout(header: bytes) -> PythonLayout | str:
    """The layout a CPython 3.13 runtime gives of itself in the ``_Py_DebugOffsets`` at its start
    (``header``: that many bytes of ``_PyRuntime``), or why not (another version's, a
    free-threaded build, not a debug offsets structure)."""
    if len(header) < _DEBUG_WORDS_313 * 8 or not header.startswith(_DEBUG_COOKIE):
        return "no debug offsets at _PyRuntime"
    words = struct.unpack_from(f"<{_DEBUG_WORDS_313}Q", header)
    version = (words[1] >> 24, (words[1] >> 16) & 0xFF)
    if version != (3, 13):
        return f"debug offsets of Python {version[0]}.{version[1]}"
    at = {name: words[index] for name, index in _DEBUG_INDEX_313.items()}
    if at["free_threaded"]:
        return "a free-threaded build"
    if any(value > 1 << 20 for value in at.values()):
        return "debug offsets out of range"
    return PythonLayout(
        interpreters_head=at["interpreters_head"], interpreter_next=at["interpreter_next"],
        threads_head=at["threads_head"], thread_next=at["thread_next"], native_thread_id=at["native_thread_id"],
        cframe=None, current_frame=at["current_frame"], frame_code=at["frame_code"],
        frame_previous=at["frame_previous"], frame_prev_instr=at["frame_prev_instr"], frame_owner=at["frame_owner"],
        owner_c_stack=3, code_filename=at["code_filename"], code_qualname=at["code_qualname"],
        code_linetable=at["code_linetable"], code_firstlineno=at["code_firstlineno"],
        code_instructions=at["code_instructions"], ascii_data=at["ascii_size"], compact_data=at["ascii_size"] + 16,
        string_length=at["string_length"], string_state=at["string_state"], bytes_size=at["bytes_size"],
        bytes_data=at["bytes_data"])


@dataclass(frozen=True)
class PythonFrame:
    """One Python frame: its function's qualified name, its file and the line it is at (None
    where the code has no line there)."""

    function: str
    file: str
    line: int | None

    def __str__(self) -> str:
        where = os.path.basename(self.file) + (f":{self.line}" if self.line is not None else "")
        return f"{self.function} ({where})"


@dataclass(frozen=True)
class PythonStacks:
    """A process's Python threads: ``version`` (3, 11); ``stacks``, native thread id to its
    frames, innermost first; ``unread``, why the stacks were not read (an unknown version,
    unreadable memory), else None."""

    version: tuple[int, int] | None
    stacks: dict[int, list[PythonFrame]]
    unread: str | None = None


class WalkLimit:
    """What a walk may still spend (see MAX_WALK_FRAMES); ``cut`` says why it stopped early."""

    def __init__(self, seconds: float = MAX_WALK_SECONDS, frames: int = MAX_WALK_FRAMES,
                 linetable_bytes: int = MAX_WALK_LINETABLE_BYTES, threads: int = MAX_THREADS) -> None:
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.frames = frames
        self.linetable_bytes = linetable_bytes
        self.threads = threads
        self.cut: str | None = None
        self._steps = 0

    def spent(self) -> bool:
        """Whether the walk must stop now (checked at each thread state and frame)."""
        if self.cut is not None:
            return True
        self._steps += 1
        if self.frames <= 0:
            self.cut = f"more than {MAX_WALK_FRAMES} frames"
        elif self.threads <= 0:
            self.cut = f"more than {MAX_THREADS} thread states"
        elif self._steps % 64 == 0 and time.monotonic() > self.deadline:
            self.cut = f"over {self.seconds:g} s"
        return self.cut is not None


@dataclass(frozen=True)
class _Runtime:
    address: int  # of _PyRuntime, loaded
    version: tuple[int, int] | None  # from Py_Version; None: older than 3.11 (no Py_Version)
    file_version: tuple[int, int]  # from the file's name


class PythonStackReader:
    """Reads the Python stacks of processes; where each one's interpreter lies is found once per
    mapped file (its ELF's exported ``_PyRuntime`` and ``Py_Version``)."""

    #: Interpreter files remembered.
    MAX_FILES = 256

    def __init__(self, procfs: ProcFS | None = None) -> None:
        self._procfs = procfs or ProcFS()
        self._symbols: dict[tuple[int, int], tuple[int, int, int] | None] = {}

    def stacks(self, pid: int, maps: list[tuple[int, int, int, int, int, str]] | None = None,
               threads: set[int] | None = None, limit: WalkLimit | None = None) -> PythonStacks | None:
        """The Python stacks of ``pid``'s threads; None if no CPython interpreter is mapped in it.
        ``maps``: its executable mappings when the caller read them this round already
        (``ProcFS.executable_maps``); ``threads``: its thread ids, when only the thread states of
        these are to be followed to their frames (a state naming no thread of the process costs
        no frame read); ``limit``: what the walk may cost (WalkLimit's defaults when None).
        Raises nothing for what the process holds: a process that ends or whose memory makes no
        sense gives stacks left out or ``unread`` (an abandoned walk says so there, with the
        stacks read by then)."""
        try:
            runtime = self._runtime(pid, maps)
        except READ_ERRORS:  # gone (it may end while its threads are counted), denied
            return None
        if runtime is None:
            return None
        major, minor = runtime.version or runtime.file_version
        try:
            memory = _Memory(self._procfs.memory(pid))
        except OSError as exc:
            return PythonStacks((major, minor), {}, f"memory unreadable: {exc.strerror or exc}")
        try:
            layout = LAYOUTS.get((major, minor))
            if layout is None and (major, minor) == (3, 13):
                found = debug_layout(memory.read(runtime.address, _DEBUG_WORDS_313 * 8))
                if isinstance(found, str):
                    return PythonStacks((major, minor), {}, f"Python 3.13: frames not read ({found})")
                layout = found
            if layout is None:
                return PythonStacks((major, minor), {}, f"Python {major}.{minor}: frames not read (fdtrace reads "
                                                        "3.11, 3.12 and 3.13)")
            limit = limit or WalkLimit()
            walked = _walk(memory, runtime.address, layout, threads, limit)
            unread = None if limit.cut is None else (
                f"walk abandoned after {len(walked)} threads' stacks ({limit.cut}): the process's memory "
                "holds more thread states or frames than fdtrace reads")
            return PythonStacks((major, minor), walked, unread)
        finally:
            memory.close()

    def _runtime(self, pid: int, maps: list[tuple[int, int, int, int, int, str]] | None) -> _Runtime | None:
        for start, end, offset, device, inode, path in self._procfs.executable_maps(pid) if maps is None else maps:
            match = _INTERPRETER_FILE.match(os.path.basename(path))
            if match is None or not inode:
                continue
            symbols = self._file_symbols(pid, start, end, device, inode, path)
            if symbols is None:
                continue
            runtime, version, exec_offset_vaddr = symbols
            bias = start - (exec_offset_vaddr + offset)
            return _Runtime(runtime + bias, self._version(pid, version + bias) if version else None,
                            (int(match.group(1)), int(match.group(2))))
        return None

    def _file_symbols(self, pid: int, start: int, end: int, device: int, inode: int,
                      path: str) -> tuple[int, int, int] | None:
        """(``_PyRuntime``, ``Py_Version`` or 0, the executable segment's address less its file
        offset) of a mapped file, opened as the very file the process maps."""
        key = (device, inode)
        if key in self._symbols:
            return self._symbols[key]
        found = None
        for candidate in self._procfs.mapped_files(pid, start, end, device, inode, path):
            try:
                with ElfFile.open(candidate) as elf:
                    runtime = elf.object_address("_PyRuntime", dynamic=True) or elf.object_address("_PyRuntime")
                    version = elf.object_address("Py_Version", dynamic=True) or 0
                    segment = next((s for s in elf.segments if s.flags & 1), None)  # PF_X: what is mapped here
            except (OSError, ElfError):
                continue
            if runtime and segment is not None:
                found = (runtime, version, segment.vaddr - segment.offset)
            break
        if len(self._symbols) >= self.MAX_FILES:
            self._symbols.pop(next(iter(self._symbols)))
        self._symbols[key] = found
        return found

    def _version(self, pid: int, address: int) -> tuple[int, int] | None:
        raw = self._procfs.read_memory(pid, address, 8) if 4096 <= address < _USER_SPACE_END else b""
        word = struct.unpack("<Q", raw)[0] if len(raw) == 8 else None
        if word is None:
            return None
        hexversion = word & 0xFFFFFFFF  # PY_VERSION_HEX: 0x030B02F0 is 3.11.2 final
        return hexversion >> 24, (hexversion >> 16) & 0xFF


class _Memory:
    """Bounded reads of a process's memory (``ProcFS.memory``), user-space addresses only; a
    read that fails gives None (or b"")."""

    def __init__(self, memory: ProcessMemory) -> None:
        self._memory = memory

    def close(self) -> None:
        self._memory.close()

    def read(self, address: int, size: int) -> bytes:
        if not 4096 <= address < _USER_SPACE_END or size <= 0:
            return b""
        return self._memory.read(address, size)

    def u64(self, address: int) -> int | None:
        raw = self.read(address, 8)
        return struct.unpack("<Q", raw)[0] if len(raw) == 8 else None

    def pointer(self, address: int) -> int | None:
        value = self.u64(address)
        return value if value is not None and 4096 <= value < _USER_SPACE_END else None

    def text(self, address: int | None, layout: PythonLayout) -> str | None:
        """A compact str object's characters (what code objects hold), None for anything else."""
        if address is None:
            return None
        size = max(layout.string_length, layout.string_state) + 8
        header = self.read(address, size)
        if len(header) < size:
            return None
        length = struct.unpack_from("<q", header, layout.string_length)[0]
        state = struct.unpack_from("<I", header, layout.string_state)[0]
        kind, compact, ascii_only = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or not 0 <= length <= MAX_NAME_CHARS:
            return None
        data = self.read(address + (layout.ascii_data if ascii_only else layout.compact_data), length * kind)
        if len(data) != length * kind:
            return None
        return data.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], errors="replace")

    def bytes_object(self, address: int | None, limit: int, layout: PythonLayout) -> bytes | None:
        """A bytes object's contents, if at most ``limit`` long."""
        if address is None:
            return None
        size = self.u64(address + layout.bytes_size)
        if size is None or size > limit:
            return None
        data = self.read(address + layout.bytes_data, size)
        return data if len(data) == size else None


@dataclass(frozen=True)
class _Code:
    qualname: str
    filename: str
    first_line: int
    linetable: bytes


def _walk(memory: _Memory, runtime: int, layout: PythonLayout, threads: set[int] | None = None,
          limit: WalkLimit | None = None) -> dict[int, list[PythonFrame]]:
    """Every thread state of every interpreter, to the frames of each (of those in ``threads``
    when given), until ``limit`` is spent."""
    limit = limit or WalkLimit()
    codes: dict[int, _Code | None] = {}
    lines: dict[tuple[int, int], int | None] = {}  # (code, instruction): many threads wait at one
    stacks: dict[int, list[PythonFrame]] = {}
    interpreter = memory.pointer(runtime + layout.interpreters_head)
    seen: set[int] = set()
    for _ in range(MAX_INTERPRETERS):
        if interpreter is None or interpreter in seen:
            break
        seen.add(interpreter)
        thread = memory.pointer(interpreter + layout.threads_head)
        while thread is not None and thread not in seen:
            if limit.spent():
                return stacks
            limit.threads -= 1
            seen.add(thread)
            frame_at = layout.current_frame if layout.cframe is None else layout.cframe
            size = max(layout.native_thread_id, frame_at, layout.thread_next) + 8
            state = memory.read(thread, size)
            if len(state) < size:
                break
            native_id, frame_word, thread_next = (struct.unpack_from("<Q", state, at)[0] for at in
                                                  (layout.native_thread_id, frame_at, layout.thread_next))
            if layout.cframe is None:
                frame = frame_word if 4096 <= frame_word < _USER_SPACE_END else None
            else:
                frame = memory.pointer(frame_word + layout.current_frame)
            if native_id and native_id not in stacks and (threads is None or native_id in threads):
                stacks[native_id] = _frames(memory, frame, layout, codes, lines, limit)
            thread = thread_next if 4096 <= thread_next < _USER_SPACE_END else None
        interpreter = memory.pointer(interpreter + layout.interpreter_next)
    return stacks


def _frames(memory: _Memory, frame: int | None, layout: PythonLayout, codes: dict[int, _Code | None],
            lines: dict[tuple[int, int], int | None], limit: WalkLimit) -> list[PythonFrame]:
    frames: list[PythonFrame] = []
    seen: set[int] = set()
    while frame is not None and frame not in seen and len(frames) < MAX_FRAMES and not limit.spent():
        limit.frames -= 1
        seen.add(frame)
        raw = memory.read(frame, max(layout.frame_owner + 1, layout.frame_prev_instr + 8, layout.frame_code + 8,
                                     layout.frame_previous + 8))
        if len(raw) <= layout.frame_owner:
            break
        code_address = struct.unpack_from("<Q", raw, layout.frame_code)[0]
        prev_instr = struct.unpack_from("<Q", raw, layout.frame_prev_instr)[0]
        owner = raw[layout.frame_owner]
        if owner != layout.owner_c_stack:
            if code_address not in codes:
                codes[code_address] = _code(memory, code_address, layout, limit)
            code = codes[code_address]
            if code is not None:
                index = (prev_instr - code_address - layout.code_instructions) // 2
                if (code_address, index) not in lines:
                    lines[code_address, index] = line_of(code.linetable, code.first_line, index) if index >= 0 else None
                frames.append(PythonFrame(code.qualname, code.filename, lines[code_address, index]))
        previous = struct.unpack_from("<Q", raw, layout.frame_previous)[0]
        frame = previous if 4096 <= previous < _USER_SPACE_END else None
    return frames


def _code(memory: _Memory, address: int, layout: PythonLayout, limit: WalkLimit) -> _Code | None:
    size = max(layout.code_filename, layout.code_qualname, layout.code_linetable, layout.code_firstlineno) + 8
    raw = memory.read(address, size)
    if len(raw) < size:
        return None

    def pointer_at(offset: int) -> int | None:
        value = struct.unpack_from("<Q", raw, offset)[0]
        return value if 4096 <= value < _USER_SPACE_END else None

    qualname = memory.text(pointer_at(layout.code_qualname), layout)
    filename = memory.text(pointer_at(layout.code_filename), layout)
    linetable = memory.bytes_object(pointer_at(layout.code_linetable),
                                    min(MAX_LINETABLE_BYTES, max(limit.linetable_bytes, 0)), layout)
    limit.linetable_bytes -= len(linetable or b"")
    if qualname is None or filename is None:
        return None
    first_line = struct.unpack_from("<i", raw, layout.code_firstlineno)[0]
    return _Code(qualname, filename, first_line, linetable or b"")


def line_of(linetable: bytes, first_line: int, index: int) -> int | None:
    """The line of the instruction at ``index`` (in 2-byte code units) by a code object's location
    table (``co_linetable`` of CPython 3.11 and 3.12, Objects/locations.md); None where it has no
    line or the table ends before it."""
    line, address, at = first_line, 0, 0
    while at < len(linetable):
        head = linetable[at]
        at += 1
        kind, length = (head >> 3) & 15, (head & 7) + 1
        delta: int | None = 0
        if kind == 15:
            delta = None  # no location
        elif kind == 14:  # long form: line delta, end line delta, column, end column
            delta, at = _signed_varint(linetable, at)
            for _ in range(3):
                _, at = _varint(linetable, at)
        elif kind == 13:  # no column
            delta, at = _signed_varint(linetable, at)
        elif kind >= 10:  # one line: delta is kind - 10, then start and end column
            delta = kind - 10
            at += 2
        else:  # short form: same line, one byte of columns
            at += 1
        if delta is not None:
            line += delta
        if address <= index < address + length:
            return line if delta is not None else None
        address += length
    return None


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while at < len(data):
        byte = data[at]
        at += 1
        value |= (byte & 63) << shift
        shift += 6
        if not byte & 64 or shift > 60:
            break
    return value, at


def _signed_varint(data: bytes, at: int) -> tuple[int, int]:
    value, at = _varint(data, at)
    return (-(value >> 1) if value & 1 else value >> 1), at


#: Frames of the interpreter's own library, passed over when naming where a thread waits.
_STANDARD_LIBRARY = re.compile(r"(^<frozen |/lib(?:64)?/python\d\.\d+/(?!(?:site|dist)-packages/))")


def waiting_in(frames: list[PythonFrame]) -> PythonFrame | None:
    """The frame a thread waits in, as its program's own: the innermost outside Python's standard
    library (threading's ``run``, queue's ``get``), else the innermost."""
    for frame in frames:
        if not _STANDARD_LIBRARY.search(frame.file):
            return frame
    return frames[0] if frames else None
