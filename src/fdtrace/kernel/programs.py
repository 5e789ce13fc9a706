"""fdtrace's BPF programs as an image: compiled once by bcc, then created and attached from the
image by libbcc_bpf's calls (bcc's small library of BPF system calls: neither bcc's Python module
nor libbcc, which brings LLVM, is loaded for that), owned here descriptor by descriptor.

bcc's clang takes 1.3 CPU seconds for the programs and 5 with --stacks, at every start. The
compiled instructions do not change from one start to the next on a host (the same source, flags,
kernel and tracepoint formats), so ``compile_image`` keeps what bcc made (each function's
instructions with its map references turned back into map indices, and each map's declaration)
and ``LoadedPrograms`` makes the maps anew, writes their descriptors into the instructions,
loads them and attaches them. ``kernel/bpf_cache.py`` keeps images between starts. Every map,
program and perf-event descriptor is closed here once, and by nobody else.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import importlib.util
import json
import os
import re
import struct
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fdtrace.errors import FdtraceError

#: The layout of an image as the cache stores it; another layout is compiled again.
IMAGE_FORMAT = 1
#: Program types (linux/bpf.h).
PROG_KPROBE, PROG_TRACEPOINT = 2, 5
#: Map types whose values the kernel keeps once per possible CPU.
_PER_CPU_TYPES = frozenset({5, 6, 10})  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH
_LD_IMM64, _PSEUDO_MAP_FD = 0x18, 1
#: Entries one batch lookup asks for at first (doubled when a hash bucket holds more).
BATCH_ENTRIES = 4096
_AUTOLOAD_PREFIX = "tracepoint__"


def _no_bcc(why: object) -> FdtraceError:
    return FdtraceError(
        f"the bcc Python module is not importable from {sys.executable} ({why}): install "
        "Debian's python3-bpfcc and run fdtrace from a virtual environment that can see it "
        "(scripts/setup.sh makes one); PyPI's 'bcc' is an unrelated package")


def bcc_module() -> Any:
    """bcc's Python module, or a one-line error saying how to get it."""
    try:
        import bcc  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise _no_bcc(exc) from None
    return bcc


def bcc_version() -> str:
    """bcc's version, read from its Python module's ``version.py`` without importing the module:
    importing it loads libbcc, LLVM's compiler with it (about 60 MB of a live view's memory),
    which a start from kept programs does not need. A one-line error where bcc is missing."""
    spec = importlib.util.find_spec("bcc")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise _no_bcc("no module named 'bcc'")
    try:
        with open(os.path.join(folders[0], "version.py"), "rb") as file:
            text = file.read(4096).decode("utf-8", "replace")
    except OSError:
        return "?"
    found = re.search(r"__version__\s*=\s*['\"]([^'\"]{1,40})['\"]", text)
    return found.group(1) if found else "?"


def _libbcc() -> Any:
    """libbcc, as bcc's Python module loads it (with errno kept), and the few calls it does not
    declare."""
    bcc_module()
    from bcc.libbcc import lib  # type: ignore[import-not-found,unused-ignore]

    if not getattr(lib, "_fdtrace_declared", False):
        declared = {
            "bpf_table_name": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_ulonglong]),
            "bpf_table_fd_id": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_ulonglong]),
            "bpf_table_key_size_id": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_ulonglong]),
            "bpf_table_leaf_size_id": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_ulonglong]),
            "bpf_table_key_desc_id": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_ulonglong]),
            "bpf_table_leaf_desc_id": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_ulonglong]),
            "bcc_create_map": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                              ctypes.c_int, ctypes.c_int]),
            "bcc_prog_load": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int,
                                             ctypes.c_char_p, ctypes.c_uint, ctypes.c_int, ctypes.c_char_p,
                                             ctypes.c_uint]),
            "bpf_attach_uprobe": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                                                 ctypes.c_ulonglong, ctypes.c_int, ctypes.c_uint32]),
            "bpf_close_perf_event_fd": (ctypes.c_int, [ctypes.c_int]),
        }
        for name, (restype, argtypes) in declared.items():
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
        lib._fdtrace_declared = True
    return lib


#: The callback type of libbcc's per-record ring buffer reader: (context, data, size) -> int.
RINGBUF_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
_BATCH_CALL = (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                              ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p])
#: The calls of libbcc_bpf (bcc's small library of BPF system calls, without its compiler) that
#: making, attaching and reading the programs of an image takes, with their C types.
_RUNTIME_CALLS: dict[str, tuple[Any, list[Any]]] = {
    "bpf_lookup_elem": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "bpf_update_elem": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong]),
    "bpf_delete_elem": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "bpf_get_next_key": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "bpf_lookup_batch": _BATCH_CALL,
    "bpf_lookup_and_delete_batch": _BATCH_CALL,
    "bcc_create_map": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_int]),
    "bcc_prog_load": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p,
                                     ctypes.c_uint, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]),
    "bpf_attach_tracepoint": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p]),
    "bpf_attach_uprobe": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.c_ulonglong, ctypes.c_int, ctypes.c_uint32]),
    "bpf_detach_uprobe": (ctypes.c_int, [ctypes.c_char_p]),
    "bpf_close_perf_event_fd": (ctypes.c_int, [ctypes.c_int]),
    "bpf_new_ringbuf": (ctypes.c_void_p, [ctypes.c_int, RINGBUF_CALLBACK, ctypes.c_void_p]),
    "bpf_consume_ringbuf": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_free_ringbuf": (None, [ctypes.c_void_p]),
}
_runtime: list[Any] = []


def _runtime_lib() -> Any:
    """libbcc_bpf, loaded once with errno kept and ``_RUNTIME_CALLS`` declared; a one-line error
    where it is missing (bcc is not installed)."""
    if not _runtime:
        try:
            lib = ctypes.CDLL("libbcc_bpf.so.0", use_errno=True)
        except OSError as exc:
            raise _no_bcc(f"its library libbcc_bpf.so.0 cannot be loaded: {exc}") from None
        for name, (restype, argtypes) in _RUNTIME_CALLS.items():
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
        _runtime.append(lib)
    return _runtime[0]


#: C type names in bcc's descriptions of map keys and values, as ctypes types.
_C_TYPES: dict[str, Any] = {
    "_Bool": ctypes.c_bool, "char": ctypes.c_char, "signed char": ctypes.c_byte, "unsigned char": ctypes.c_ubyte,
    "short": ctypes.c_short, "unsigned short": ctypes.c_ushort, "int": ctypes.c_int, "unsigned int": ctypes.c_uint,
    "long": ctypes.c_long, "unsigned long": ctypes.c_ulong, "long long": ctypes.c_longlong,
    "unsigned long long": ctypes.c_ulonglong, "float": ctypes.c_float, "double": ctypes.c_double,
    "long double": ctypes.c_longdouble, "__int128": ctypes.c_int64 * 2, "unsigned __int128": ctypes.c_uint64 * 2,
}
_AGGREGATES = ("struct", "struct_packed", "union")


def ctype_of(desc: Any) -> Any:
    """The ctypes type of a map key or value from bcc's JSON description of its C type (parsed):
    a type name, or [name, members, "struct" | "struct_packed" | "union"], each member [name,
    type], [name, type, [dimensions]] (an array), [name, type, bits] (a bit field) or a nested
    aggregate (anonymous when its name is empty). Raises ValueError on anything else."""
    if isinstance(desc, str):
        if desc not in _C_TYPES:
            raise ValueError(f"unknown C type {desc!r} in a map's description")
        return _C_TYPES[desc]
    if not isinstance(desc, list) or len(desc) < 2 or not isinstance(desc[1], list):
        raise ValueError(f"cannot read the map type description {desc!r}")
    kind = desc[2] if len(desc) > 2 else "struct"
    if kind not in _AGGREGATES:
        raise ValueError(f"cannot read the map type description {desc!r}")
    fields: list[tuple[Any, ...]] = []
    anonymous: list[str] = []
    for member in desc[1]:
        if not isinstance(member, list) or len(member) not in (2, 3):
            raise ValueError(f"cannot read the member {member!r} of a map's type")
        name = member[0]
        if len(member) == 3 and member[2] in _AGGREGATES:
            if not name:
                name = f"__anon{len(anonymous)}"
                anonymous.append(name)
            fields.append((name, ctype_of(member)))
        elif len(member) == 3 and isinstance(member[2], list):
            element = ctype_of(member[1])
            for dimension in reversed(member[2]):
                element = element * int(dimension)
            fields.append((name, element))
        elif len(member) == 3 and isinstance(member[2], int) and not isinstance(member[2], bool):
            fields.append((name, ctype_of(member[1]), member[2]))
        elif len(member) == 2:
            fields.append((name, ctype_of(member[1])))
        else:
            raise ValueError(f"cannot read the member {member!r} of a map's type")
    attributes: dict[str, Any] = {"_anonymous_": anonymous, "_fields_": fields}
    if kind == "struct_packed":
        attributes["_pack_"] = 1
    return type(str(desc[0]) or "anonymous", (ctypes.Union if kind == "union" else ctypes.Structure,), attributes)


@dataclass(frozen=True)
class MapSpec:
    """One map as the programs declare it (the JSON descriptions are bcc's, for ctypes)."""

    name: str
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    key_desc: str
    leaf_desc: str


@dataclass(frozen=True)
class FunctionImage:
    """One program's instructions, map references zeroed, and where they go: (byte offset of
    the instruction, index of the map)."""

    name: str
    instructions: bytes
    relocations: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ProgramImage:
    """Everything needed to make the programs without compiling them."""

    maps: tuple[MapSpec, ...]
    functions: tuple[FunctionImage, ...]
    license: str
    kern_version: int

    def to_json(self) -> bytes:
        """The image as the cache stores it."""
        return json.dumps({
            "format": IMAGE_FORMAT, "license": self.license, "kern_version": self.kern_version,
            "maps": [vars(spec) for spec in self.maps],
            "functions": [{"name": f.name, "instructions": base64.b64encode(f.instructions).decode(),
                           "relocations": [list(r) for r in f.relocations]} for f in self.functions],
        }, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ProgramImage:
        """An image from ``to_json``'s bytes, checked field by field; raises ValueError."""
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict) or raw.get("format") != IMAGE_FORMAT:
                raise ValueError("not an image of this format")
            maps = tuple(MapSpec(**{k: _typed(spec[k], t) for k, t in _MAP_FIELDS.items()}) for spec in raw["maps"])
            functions = []
            for item in raw["functions"]:
                code = base64.b64decode(_typed(item["instructions"], str), validate=True)
                relocations = tuple((_typed(at, int), _typed(index, int)) for at, index in item["relocations"])
                if len(code) % 8 or any(not 0 <= at <= len(code) - 16 or code[at] != _LD_IMM64
                                        or not 0 <= index < len(maps) for at, index in relocations):
                    raise ValueError(f"{item['name']}: instructions do not match their relocations")
                functions.append(FunctionImage(_typed(item["name"], str), code, relocations))
            return cls(maps, tuple(functions), _typed(raw["license"], str), _typed(raw["kern_version"], int))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a usable image ({exc})") from None


_MAP_FIELDS = {"name": str, "map_type": int, "key_size": int, "value_size": int, "max_entries": int, "flags": int,
               "key_desc": str, "leaf_desc": str}


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{value!r} is not {kind.__name__}")
    return value


def compile_image(text: bytes, cflags: list[str]) -> ProgramImage:
    """Compile the programs with bcc and keep what it made. Raises FdtraceError (one line)."""
    lib = _libbcc()
    flags = (ctypes.c_char_p * len(cflags))(*[flag.encode() for flag in cflags])
    ctypes.set_errno(0)
    module = lib.bpf_module_create_c_from_string(text, 0, flags, len(cflags), True, None)
    if not module:
        raise FdtraceError(_compile_failure(ctypes.get_errno()))
    try:
        maps, index = [], {}
        for i in range(lib.bpf_num_tables(module)):
            maps.append(MapSpec(
                lib.bpf_table_name(module, i).decode(), int(lib.bpf_table_type_id(module, i)),
                int(lib.bpf_table_key_size_id(module, i)), int(lib.bpf_table_leaf_size_id(module, i)),
                int(lib.bpf_table_max_entries_id(module, i)), int(lib.bpf_table_flags_id(module, i)),
                (lib.bpf_table_key_desc_id(module, i) or b"").decode(),
                (lib.bpf_table_leaf_desc_id(module, i) or b"").decode()))
            index[int(lib.bpf_table_fd_id(module, i))] = i
        functions = []
        for i in range(lib.bpf_num_functions(module)):
            name = lib.bpf_function_name(module, i)
            size = int(lib.bpf_function_size(module, name))
            code = bytearray(ctypes.string_at(lib.bpf_function_start(module, name), size))
            relocations = []
            for at in range(0, size - 15, 8):
                if code[at] == _LD_IMM64 and code[at + 1] >> 4 == _PSEUDO_MAP_FD:
                    fd, = struct.unpack_from("<i", code, at + 4)
                    if fd not in index:
                        raise FdtraceError(f"the compiled program {name.decode()} names a map bcc did not make")
                    relocations.append((at, index[fd]))
                    struct.pack_into("<i", code, at + 4, 0)
            functions.append(FunctionImage(name.decode(), bytes(code), tuple(relocations)))
        return ProgramImage(tuple(maps), tuple(functions), lib.bpf_module_license(module).decode(),
                            int(lib.bpf_module_kern_version(module)))
    finally:
        lib.bpf_module_destroy(module)  # closes the maps bcc made while compiling


def _compile_failure(code: int) -> str:
    if code in (errno.ENOMEM, errno.E2BIG):
        return ("the BPF maps could not be made (out of memory: a memory cgroup too small for fdtrace, or the "
                "--ring-pages/--max-* sizes too large for this host); bcc's lines above name the map")
    if code == errno.EPERM:
        return "the BPF maps could not be made (operation not permitted: needs root, or CAP_BPF and CAP_PERFMON)"
    return "the BPF programs did not compile (bcc's messages above say why)"


def possible_cpus() -> int:
    """How many CPUs the kernel keeps per-CPU map values for."""
    try:
        text = open("/sys/devices/system/cpu/possible").read().strip()
    except OSError:
        return os.cpu_count() or 1
    count = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


def _decoded_type(desc: str) -> Any:
    try:
        return ctype_of(json.loads(desc))
    except ValueError as exc:
        raise FdtraceError(f"a BPF map's type cannot be used: {exc}") from None


class BpfMap:
    """One map, by its descriptor: lookups, updates, deletions and batch reads, with bcc's ctypes
    types for its keys (``Key``) and values (``Leaf``)."""

    def __init__(self, fd: int, spec: MapSpec) -> None:
        self.map_fd = fd
        self.spec = spec
        self.Key: Any = _decoded_type(spec.key_desc) if spec.key_desc else ctypes.c_uint32  # noqa: N815 - bcc's
        self.Leaf: Any = _decoded_type(spec.leaf_desc) if spec.leaf_desc else ctypes.c_uint8  # noqa: N815
        self.per_cpu = spec.map_type in _PER_CPU_TYPES
        self._cpus = possible_cpus() if self.per_cpu else 1
        self._stride = (ctypes.sizeof(self.Leaf) + 7) // 8 * 8 if self.per_cpu else ctypes.sizeof(self.Leaf)
        self._lib = _runtime_lib()

    def _value_buffer(self, count: int = 1) -> Any:
        return (ctypes.c_char * (self._stride * self._cpus * count))()

    def _values(self, buffer: Any, at: int = 0) -> Any:
        if not self.per_cpu:
            return self.Leaf.from_buffer_copy(buffer, at * self._stride)
        base = at * self._stride * self._cpus
        values = [self.Leaf.from_buffer_copy(buffer, base + cpu * self._stride) for cpu in range(self._cpus)]
        return [getattr(v, "value", v) for v in values]

    def __getitem__(self, key: Any) -> Any:
        buffer = self._value_buffer()
        if self._lib.bpf_lookup_elem(self.map_fd, ctypes.byref(key), buffer) < 0:
            raise KeyError(key)
        return self._values(buffer)

    def __setitem__(self, key: Any, value: Any) -> None:
        if self._lib.bpf_update_elem(self.map_fd, ctypes.byref(key), ctypes.byref(value), 0) < 0:
            raise OSError(ctypes.get_errno(), f"cannot update BPF map {self.spec.name}: "
                                              f"{os.strerror(ctypes.get_errno())}")

    def __delitem__(self, key: Any) -> None:
        if self._lib.bpf_delete_elem(self.map_fd, ctypes.byref(key)) < 0:
            raise KeyError(key)

    def items(self) -> list[tuple[Any, Any]]:
        """Every entry, one lookup each (kernels without batch lookups)."""
        found = []
        key, following = self.Key(), self.Key()
        previous = None
        while self._lib.bpf_get_next_key(self.map_fd, previous, ctypes.byref(following)) == 0:
            ctypes.memmove(ctypes.byref(key), ctypes.byref(following), ctypes.sizeof(key))
            previous = ctypes.byref(key)
            try:
                found.append((self.Key.from_buffer_copy(key), self[key]))
            except KeyError:
                continue  # deleted meanwhile
        return found

    def items_lookup_batch(self) -> list[tuple[Any, Any]]:
        """Every entry, in batches (Linux 5.6+; raises OSError where the kernel has none)."""
        return list(self._batches(self._lib.bpf_lookup_batch))

    def items_lookup_and_delete_batch(self) -> list[tuple[Any, Any]]:
        """Every entry, each read and deleted in one step."""
        return list(self._batches(self._lib.bpf_lookup_and_delete_batch))

    def _batches(self, call: Callable[..., int]) -> Iterator[tuple[Any, Any]]:
        size = min(max(self.spec.max_entries, 1), BATCH_ENTRIES)
        token_in = (ctypes.c_char * max(self.spec.key_size, 8))()
        token_out = (ctypes.c_char * max(self.spec.key_size, 8))()
        first = True
        while True:
            keys = (ctypes.c_char * (ctypes.sizeof(self.Key) * size))()
            values = self._value_buffer(size)
            count = ctypes.c_uint32(size)
            result = call(self.map_fd, None if first else ctypes.cast(token_in, ctypes.POINTER(ctypes.c_uint32)),
                          ctypes.cast(token_out, ctypes.POINTER(ctypes.c_uint32)), keys, values, ctypes.byref(count))
            code = ctypes.get_errno() if result < 0 else 0
            if code == errno.ENOSPC and size < (1 << 20):  # a bucket holds more than asked for
                size *= 2
                continue
            if code not in (0, errno.ENOENT):
                raise OSError(code, f"BPF map {self.spec.name}: batch lookup: {os.strerror(code)}")
            key_size = ctypes.sizeof(self.Key)
            for i in range(count.value):
                yield self.Key.from_buffer_copy(keys, i * key_size), self._values(values, i)
            if code == errno.ENOENT or count.value == 0:
                return
            ctypes.memmove(token_in, token_out, len(token_in))
            first = False


class ProbeError(Exception):
    """A program that could not be loaded or attached (its reason, one line)."""


class LoadedPrograms:
    """The maps and programs of an image, made in this process. Programs are loaded when first
    attached; ``close()`` detaches and closes everything, once."""

    def __init__(self, image: ProgramImage) -> None:
        self._lib = _runtime_lib()
        self.image = image
        self._functions = {f.name: f for f in image.functions}
        self._map_fds: list[int] = []
        self.maps: dict[str, BpfMap] = {}
        self._programs: dict[str, int] = {}
        self.tracepoints: dict[str, int] = {}  # "category:event" -> perf event descriptor
        self.uprobes: dict[str, int] = {}  # label -> perf event descriptor
        self._uprobe_events: list[bytes] = []  # the names libbcc gave them (legacy tracefs events)
        self._ring_managers: list[tuple[Any, Any]] = []
        self.closed_elsewhere = 0  # descriptors of ours found closed at close(): must stay 0
        try:
            for spec in image.maps:
                fd = self._lib.bcc_create_map(spec.map_type, spec.name.encode()[:15], spec.key_size,
                                              spec.value_size, spec.max_entries, spec.flags)
                if fd < 0:
                    code = ctypes.get_errno()
                    raise FdtraceError(f"cannot make the BPF map {spec.name} ({spec.max_entries} entries of "
                                       f"{spec.key_size}+{spec.value_size} bytes): {os.strerror(code)}"
                                       + (": a memory cgroup too small for fdtrace, or --ring-pages/--max-* too "
                                          "large" if code == errno.ENOMEM else ""))
                self._map_fds.append(fd)
                self.maps[spec.name] = BpfMap(fd, spec)
        except BaseException:
            self.close()
            raise

    def __getitem__(self, name: str) -> BpfMap:
        return self.maps[name]

    def function_names(self) -> list[str]:
        """The programs of the image."""
        return list(self._functions)

    def program(self, name: str, prog_type: int) -> int:
        """The descriptor of a loaded program (loaded now if it was not). Raises ProbeError."""
        if name in self._programs:
            return self._programs[name]
        function = self._functions.get(name)
        if function is None:
            raise ProbeError(f"no program {name}")
        code = bytearray(function.instructions)
        for at, index in function.relocations:
            struct.pack_into("<i", code, at + 4, self._map_fds[index])
        buffer = ctypes.create_string_buffer(bytes(code), len(code))
        license = self.image.license.encode()
        fd = self._lib.bcc_prog_load(prog_type, name.encode()[:15], buffer, len(code), license,
                                     self.image.kern_version, 0, None, 0)
        if fd < 0:
            failure = os.strerror(ctypes.get_errno())
            log = ctypes.create_string_buffer(1 << 16)
            self._lib.bcc_prog_load(prog_type, name.encode()[:15], buffer, len(code), license,
                                    self.image.kern_version, 1, log, len(log))
            last = " ".join(log.value.decode("utf-8", "replace").split()[-24:])
            raise ProbeError(f"the kernel refused to load {name} ({failure}): {last}")
        self._programs[name] = fd
        return int(fd)

    def autoload_tracepoints(self) -> tuple[list[str], list[str]]:
        """Attach the programs named for their tracepoint (bcc's TRACEPOINT_PROBE), as bcc would
        at load; returns (attached, skipped with why)."""
        attached, skipped = [], []
        for name in self._functions:
            if not name.startswith(_AUTOLOAD_PREFIX):
                continue
            tracepoint = name[len(_AUTOLOAD_PREFIX):].replace("__", ":", 1)
            try:
                self.attach_tracepoint(tracepoint, name)
                attached.append(tracepoint)
            except ProbeError as exc:
                skipped.append(f"{tracepoint} ({exc})")
        return attached, skipped

    def attach_tracepoint(self, tracepoint: str, function: str) -> None:
        """Run ``function`` on every hit of ``tracepoint`` ("category:event"). Raises ProbeError."""
        fd = self.program(function, PROG_TRACEPOINT)
        category, _, event = tracepoint.partition(":")
        perf = self._lib.bpf_attach_tracepoint(fd, category.encode(), event.encode())
        if perf < 0:
            raise ProbeError(f"cannot attach to {tracepoint}: {os.strerror(ctypes.get_errno())}")
        self.tracepoints[tracepoint] = perf

    def attach_uprobe(self, path: str, offset: int, function: str, label: str) -> None:
        """Run ``function`` when any process executes the byte at ``offset`` of the file at
        ``path``. Raises ProbeError."""
        fd = self.program(function, PROG_KPROBE)
        event = f"fdtrace_{os.getpid()}_{len(self.uprobes)}".encode()
        perf = self._lib.bpf_attach_uprobe(fd, 0, event, path.encode(), offset, -1, 0)
        if perf < 0:
            raise ProbeError(f"cannot attach a uprobe to {path}: {os.strerror(ctypes.get_errno())}")
        self.uprobes[label] = perf
        self._uprobe_events.append(event)

    def open_ring(self, name: str, callback: Callable[[Any, int], None]) -> Callable[[], None]:
        """libbcc's per-record reader of a ring buffer map (where reading its memory directly is
        not safe); returns the function that consumes what is waiting."""
        def on_record(_ctx: Any, data: Any, size: int) -> int:
            callback(data, size)
            return 0

        function = RINGBUF_CALLBACK(on_record)
        manager = self._lib.bpf_new_ringbuf(self.maps[name].map_fd, function, None)
        if not manager:
            raise FdtraceError(f"cannot read the ring buffer {name}: {os.strerror(ctypes.get_errno())}")
        self._ring_managers.append((manager, function))
        return lambda: self._lib.bpf_consume_ringbuf(manager)

    def detach(self, parallel: bool = True) -> None:
        """Detach every probe. Each detach waits for an RCU grace period in the kernel (about 70 ms
        here); from threads the waits overlap (ctypes lets go of the GIL)."""
        perf_fds = list(self.tracepoints.values()) + list(self.uprobes.values())
        self.tracepoints.clear()
        self.uprobes.clear()
        if parallel and len(perf_fds) > 1:
            with ThreadPoolExecutor(max_workers=min(64, len(perf_fds)), thread_name_prefix="fdtrace-detach") as pool:
                list(pool.map(self._lib.bpf_close_perf_event_fd, perf_fds))
        else:
            for fd in perf_fds:
                self._lib.bpf_close_perf_event_fd(fd)
        for event in self._uprobe_events:
            self._lib.bpf_detach_uprobe(event)  # the tracefs event, where the kernel made one
        self._uprobe_events = []

    def close(self) -> None:
        """Detach, then close every program and map descriptor (each once)."""
        self.detach()
        for manager, _function in self._ring_managers:
            self._lib.bpf_free_ringbuf(manager)
        self._ring_managers.clear()
        programs, self._programs = list(self._programs.values()), {}
        maps, self._map_fds = self._map_fds, []
        self.maps = {}
        for fd in programs + maps:
            try:
                os.close(fd)
            except OSError:
                self.closed_elsewhere += 1  # somebody closed a descriptor of ours: counted, never fatal
