"""The reading of CPython's structures, on data that may be anything: line tables decoded as
CPython decodes them, and memory that lies (cycles, huge sizes) read in bounded time."""

from __future__ import annotations

import ast
import importlib
import struct
import types

from fdtrace.procfs.python_frames import (
    _DEBUG_INDEX_313,
    LAYOUTS,
    PythonFrame,
    _walk,
    debug_layout,
    line_of,
    waiting_in,
)


def all_code(code: types.CodeType) -> list[types.CodeType]:
    found = [code]
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            found.extend(all_code(constant))
    return found


def test_line_tables_decode_as_cpython_decodes_them() -> None:
    checked = 0
    for name in ("threading", "json.decoder", "asyncio.base_events", "email.message"):
        module = importlib.import_module(name)
        assert module.__file__ is not None
        source = open(module.__file__, encoding="utf-8").read()
        for code in all_code(compile(ast.parse(source), module.__file__, "exec")):
            positions = list(code.co_positions())  # one per 2-byte code unit
            for index, (line, *_rest) in enumerate(positions):
                assert line_of(code.co_linetable, code.co_firstlineno, index) == line, (code, index)
                checked += 1
    assert checked > 10_000
    assert line_of(b"", 7, 0) is None  # a table that ends first
    assert line_of(bytes([0xFF, 0x7F]), 3, 0) is None  # a varint that never ends, at the end of the table


class LyingMemory:
    """Memory where every pointer leads back into itself: thread states and frames in cycles, a
    name claiming a huge length, a line table claiming gigabytes."""

    def __init__(self, words: dict[int, int]) -> None:
        self.words = words
        self.reads = 0

    def read(self, address: int, size: int) -> bytes:
        self.reads += 1
        return b"".join(struct.pack("<Q", self.words.get(address + at, 0)) for at in range(0, size + 7, 8))[:size]

    def u64(self, address: int) -> int | None:
        return self.words.get(address, 0)

    def pointer(self, address: int) -> int | None:
        value = self.words.get(address, 0)
        return value if 4096 <= value < 1 << 47 else None

    def text(self, address: int | None, layout: object) -> str | None:
        return None if address is None else "x" * 10

    def bytes_object(self, address: int | None, limit: int, layout: object) -> bytes | None:
        return None


def test_memory_in_cycles_is_walked_once_and_ends() -> None:
    layout = LAYOUTS[3, 11]
    runtime, interpreter, thread_a, thread_b, cframe, frame_a, frame_b, code = (
        0x10000 * n for n in range(1, 9))
    words = {runtime + layout.interpreters_head: interpreter,
             interpreter + layout.interpreter_next: interpreter,  # the interpreter list loops
             interpreter + layout.threads_head: thread_a,
             thread_a + layout.thread_next: thread_b, thread_b + layout.thread_next: thread_a,  # so do threads
             thread_a + layout.native_thread_id: 11, thread_b + layout.native_thread_id: 12,
             thread_a + layout.cframe: cframe, thread_b + layout.cframe: cframe,
             cframe + layout.current_frame: frame_a,
             frame_a + layout.frame_code: code, frame_b + layout.frame_code: code,
             frame_a + layout.frame_previous: frame_b, frame_b + layout.frame_previous: frame_a,  # and frames
             frame_a + layout.frame_prev_instr: code + layout.code_instructions + 2 * 10**9,
             code + layout.code_qualname: code, code + layout.code_filename: code}
    memory = LyingMemory(words)
    stacks = _walk(memory, runtime, layout)  # type: ignore[arg-type]
    assert sorted(stacks) == [11, 12]
    assert [len(frames) for frames in stacks.values()] == [2, 2]  # each frame once; no line past the table
    assert all(frame.line is None for frames in stacks.values() for frame in frames)
    assert memory.reads < 50


def test_a_thread_waits_in_its_programs_own_code_not_in_the_standard_library() -> None:
    frames = [PythonFrame("Condition.wait", "/usr/lib/python3.11/threading.py", 320),
              PythonFrame("Queue.get", "/usr/lib/python3.11/queue.py", 171),
              PythonFrame("Pool.fetch", "/usr/lib/python3/dist-packages/pool/fetch.py", 40),
              PythonFrame("Thread.run", "/usr/lib/python3.11/threading.py", 975)]
    assert waiting_in(frames) == frames[2] and str(frames[2]) == "Pool.fetch (fetch.py:40)"
    only_library = [PythonFrame("_bootstrap", "<frozen importlib._bootstrap>", None)]
    assert waiting_in(only_library) == only_library[0]
    assert str(only_library[0]) == "_bootstrap (<frozen importlib._bootstrap>)"
    assert waiting_in([]) is None


def test_debug_offsets_are_taken_only_from_a_313_runtime_that_has_them() -> None:
    words = [0] * 71
    words[1] = 0x030D00F0  # 3.13.0 final
    for name, index in _DEBUG_INDEX_313.items():
        words[index] = 8 * index if name != "free_threaded" else 0
    header = b"xdebugpy" + struct.pack("<70Q", *words[1:])
    layout = debug_layout(header)
    assert not isinstance(layout, str)
    assert (layout.threads_head, layout.cframe, layout.current_frame, layout.owner_c_stack) == (72, None, 184, 3)
    assert layout.compact_data == layout.ascii_data + 16 == 8 * 70 + 16
    assert debug_layout(b"xdebugpx" + header[8:]) == "no debug offsets at _PyRuntime"
    assert debug_layout(header[:100]) == "no debug offsets at _PyRuntime"
    newer = bytearray(header)
    struct.pack_into("<Q", newer, 8, 0x030E00F0)
    assert debug_layout(bytes(newer)) == "debug offsets of Python 3.14"
    free = bytearray(header)
    struct.pack_into("<Q", free, 16, 1)
    assert debug_layout(bytes(free)) == "a free-threaded build"
    wild = bytearray(header)
    struct.pack_into("<Q", wild, 8 * _DEBUG_INDEX_313["threads_head"], 1 << 40)
    assert debug_layout(bytes(wild)) == "debug offsets out of range"
