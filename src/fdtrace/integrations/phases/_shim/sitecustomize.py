"""fdtrace's phase shim, put on PYTHONPATH by `fdtrace run`: marks PyTorch training phases
(process groups, forward, backward, gradient all-reduce buckets, optimizer steps, checkpoints)
in every Python process of the job, with no edit to the training script.

Standard library and torch only, Python 3.9+: the job's Python is usually not fdtrace's. It
must never change what the job computes nor make it fail: every hook is wrapped so that an error
of the shim disables the shim, never the job.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import json
import mmap
import os
import struct
import sys
import threading
import time
import weakref

_OUT_DIR = os.environ.get("FDTRACE_PHASES_DIR")
# Phases not to mark (comma-separated), e.g. "allreduce": DDP then keeps its built-in all-reduce.
_SKIP = frozenset(p.strip() for p in os.environ.get("FDTRACE_PHASES_SKIP", "").split(",") if p.strip())
_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_state = {"file": None, "pid": None, "step": 0, "broken": False, "patched": False, "ranks": None}
# Marks of these phases, several per step, are written out with the step's optimizer mark (or
# any other): a rank killed mid-step loses at most that step's marks, and a step costs one write.
_BUFFERED = ("forward", "backward", "allreduce")
# The live state file that `fdtrace top` reads: the phase this process is in now. Its layout is
# fdtrace.integrations.phases.live.STATE_FORMAT (this file cannot import fdtrace: the job's Python is not ours).
_STATE_FORMAT = "<4sIiiiiqqqq24s40s"
_STATE_SIZE = struct.calcsize(_STATE_FORMAT)
_live = {"map": None, "pid": None, "sequence": 0, "open": [], "start_ticks": 0, "next_token": 0,
         "broken": False}


def _rank_info():
    """(rank, local rank, world size); fixed once the default process group exists, so cached
    from then on (until it is destroyed)."""
    if _state.get("ranks") is not None:
        return _state["ranks"]
    rank = os.environ.get("RANK")
    world = os.environ.get("WORLD_SIZE")
    initialized = False
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
            initialized = True
    except Exception:
        pass
    as_int = lambda v: int(v) if v is not None and str(v).lstrip("-").isdigit() else None  # noqa: E731
    ranks = (as_int(rank), as_int(os.environ.get("LOCAL_RANK")), as_int(world))
    if initialized:
        _state["ranks"] = ranks
    return ranks


def _state_map():
    """This process's state file, mapped (made on first use, and again in a forked child)."""
    if _live["pid"] != os.getpid():
        path = os.path.join(_OUT_DIR, f"state-{os.getpid()}.bin")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, _STATE_SIZE)
            _live["map"] = mmap.mmap(fd, _STATE_SIZE)
        finally:
            os.close(fd)
        with open("/proc/self/stat") as stat:
            text = stat.read()
        _live["start_ticks"] = int(text[text.rfind(")") + 2:].split()[19])
        _live["pid"], _live["open"], _live["sequence"] = os.getpid(), [], 0
    return _live["map"]


def _publish(since_wall):
    """Rewrite the state file: the innermost open phase, or none since ``since_wall``. The
    sequence number is odd while the record is written, so a reader never takes half of it."""
    state = _state_map()
    phase, name, since = "", "", since_wall
    if _live["open"]:
        _, phase, name, since = _live["open"][-1]
    rank, local_rank, world = _rank_info()
    as_field = lambda v: -1 if v is None else v  # noqa: E731
    _live["sequence"] += 1
    struct.pack_into(_STATE_FORMAT, state, 0, b"FDTP", _live["sequence"], os.getpid(), as_field(rank),
                     as_field(local_rank), as_field(world), _live["start_ticks"], _state["step"], since,
                     time.monotonic_ns(), phase.encode()[:24], (name or "").encode()[:40])
    _live["sequence"] += 1
    struct.pack_into("<I", state, 4, _live["sequence"])


def _begin(phase, name=None):
    """A phase begins: show it live. Returns the token that ends it (None when not shown)."""
    if _OUT_DIR is None or _live["broken"]:
        return None
    try:
        with _lock:
            _state_map()
            _live["next_token"] += 1
            token = _live["next_token"]
            _live["open"].append((token, phase, name, time.time_ns()))
            _publish(_live["open"][-1][3])
            return token
    except Exception:
        _live["broken"] = True
        return None


def _end(token, end_wall):
    """The phase of ``token`` ended: show the one around it, if any."""
    if token is None or _live["broken"]:
        return
    try:
        with _lock:
            if _live["pid"] != os.getpid():
                return
            _live["open"] = [entry for entry in _live["open"] if entry[0] != token]
            _publish(end_wall)
    except Exception:
        _live["broken"] = True


def _write(phase, start_mono, start_wall, name=None, bucket=None, token=None, source=None, step=None):
    """Append one phase record to this process's file (and end its live state); ``step``: the
    step the phase began in, when that is not the current one."""
    if _OUT_DIR is None:
        return
    end_mono, end_wall = time.monotonic_ns(), time.time_ns()
    _end(token, end_wall)
    if _state["broken"]:
        return
    rank, local_rank, world = _rank_info()
    record = {"rank": rank, "local_rank": local_rank, "world_size": world, "pid": os.getpid(),
              "tid": threading.get_native_id(), "step": _state["step"] if step is None else step,
              "phase": phase, "name": name,
              "bucket": bucket, "start_mono_ns": start_mono, "end_mono_ns": end_mono,
              "start_wall_ns": start_wall, "end_wall_ns": end_wall, "source": source or "shim"}
    try:
        with _lock:
            if _state["pid"] != os.getpid():  # first write, or a forked child
                _state["file"] = open(os.path.join(_OUT_DIR, f"phases-{os.getpid()}.jsonl"), "a",
                                      buffering=1 << 16)
                _state["pid"] = os.getpid()
            _state["file"].write(json.dumps(record) + "\n")
            if phase not in _BUFFERED:
                _state["file"].flush()
        if phase == "destroy_process_group":
            _state["ranks"] = None  # a new process group may give other ranks
    except Exception as exc:
        if not _state.get("broken"):  # say it once: marks lost without a word are worse than none
            sys.stderr.write(f"fdtrace: process {os.getpid()} cannot write its phase marks to {_OUT_DIR} "
                             f"({exc}); a job that runs as another user needs fdtrace run as that user\n")
        _state["broken"] = True


def _timed(phase, function, name=None):
    """``function`` with its calls recorded as ``phase``."""
    def wrapper(*args, **kwargs):
        token = _begin(phase, name)
        start_mono, start_wall = time.monotonic_ns(), time.time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            _write(phase, start_mono, start_wall, name, token=token)
    wrapper.__wrapped__ = function
    wrapper._fdtrace_phase = phase
    wrapper.__name__ = getattr(function, "__name__", "wrapper")
    wrapper.__doc__ = getattr(function, "__doc__", None)
    return wrapper


class _TimedCommHook:
    """A DDP communication hook that records each bucket's all-reduce, start to completion. A
    class, not a closure: DDP keeps its hook, and a DDP module must stay picklable."""

    def __init__(self, hook):
        self.__wrapped__ = hook
        # DDP checks the hook by its __name__ and logs it by its __qualname__
        self.__name__ = getattr(hook, "__name__", type(hook).__name__)
        self.__qualname__ = "fdtrace." + getattr(hook, "__qualname__", self.__name__)

    def __call__(self, state, bucket):
        index = bucket.index()
        token = _begin("allreduce", f"bucket {index}")
        start_mono, start_wall = time.monotonic_ns(), time.time_ns()
        future = self.__wrapped__(state, bucket)

        def done(fut):
            _write("allreduce", start_mono, start_wall, bucket=index, token=token)
            return fut.value()
        return future.then(done)


def _rendezvous(kwargs):
    """The rendezvous store's address that init_process_group is given: its init_method's
    tcp://HOST:PORT, else the environment's MASTER_ADDR:MASTER_PORT (None when neither says);
    fdtrace's ledger tells the store's connections from the collectives' by it."""
    method = kwargs.get("init_method")
    if isinstance(method, str) and method.startswith("tcp://"):
        return method[len("tcp://"):].split("?")[0][:40]
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port and (method is None or method == "env://"):
        return f"{addr}:{port}"[:40]
    return None


def _timed_init(function):
    """init_process_group, recorded with the rendezvous address as its name."""
    def wrapper(*args, **kwargs):
        name = None
        try:
            name = _rendezvous(kwargs)
        except Exception:
            pass
        token = _begin("init_process_group", name)
        start_mono, start_wall = time.monotonic_ns(), time.time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            _write("init_process_group", start_mono, start_wall, name, token=token)
    wrapper.__wrapped__ = function
    wrapper._fdtrace_phase = "init_process_group"
    wrapper.__name__ = getattr(function, "__name__", "wrapper")
    wrapper.__doc__ = getattr(function, "__doc__", None)
    return wrapper


def _patch_distributed(torch):
    import torch.distributed as dist

    for name in ("init_process_group", "new_group", "barrier", "destroy_process_group"):
        original = getattr(dist, name, None)
        if original is not None and not hasattr(original, "_fdtrace_phase"):
            setattr(dist, name, _timed_init(original) if name == "init_process_group" else _timed(name, original))


# DDP module -> the timed process group its reducer was given.
_TIMED_GROUPS = weakref.WeakKeyDictionary()


def _timed_group(torch, group):
    """A process group that is ``group`` for every call but all-reduce, whose calls (each bucket
    of gradients DDP's reducer sends) it times, start to completion. Given to the reducer only,
    it keeps DDP's built-in all-reduce: the averaging stays folded into the gradient copy."""
    import torch.distributed as dist

    base = dist.ProcessGroup

    class _TimedWork(dist.Work):
        """An all-reduce whose future completes once its end is written: the reducer, which
        waits on that future, never runs ahead of the mark."""

        def __init__(self, future):
            super().__init__()
            self._future = future

        def get_future(self):
            return self._future

        def wait(self, timeout=None):
            self._future.wait()
            return True

    class _TimedGroup(base):
        def __init__(self):
            super().__init__(group.rank(), group.size())
            self.bucket = 0  # buckets are sent in order: the n-th all-reduce of a step is bucket n

        def allreduce(self, tensors, *args):
            timing = None
            try:
                # The map of used parameters (find_unused_parameters) is all-reduced too; it is
                # integer, and not a bucket.
                if tensors and tensors[0].is_floating_point():
                    index, self.bucket = self.bucket, self.bucket + 1
                    timing = (index, _begin("allreduce", f"bucket {index}"), time.monotonic_ns(), time.time_ns(),
                              _state["step"])
            except Exception:
                timing = None
            try:
                work = group.allreduce(tensors, *args)
            except BaseException:
                if timing is not None:
                    _end(timing[1], time.time_ns())  # the job's own error: the bucket is not left open
                raise
            if timing is None:
                return work
            index, token, start_mono, start_wall, step = timing

            def done(fut):
                _write("allreduce", start_mono, start_wall, bucket=index, token=token, step=step)
                return fut.value()
            try:
                return _TimedWork(work.get_future().then(done))
            except Exception:
                _end(token, time.time_ns())
                return work

    timed = _TimedGroup()
    types = base.BackendType
    registered = 0
    for device in ("cpu", "cuda", "xpu", "hpu", "mtia"):
        try:
            backend = group._get_backend(torch.device(device))
        except Exception:
            continue
        name = str(backend.name()).upper().replace("PROCESSGROUP", "")
        timed._register_backend(torch.device(device), getattr(types, name, types.CUSTOM), backend)
        registered += 1
    if not registered:
        raise RuntimeError("no backend")
    default = str(group._get_backend_name()).upper()
    if hasattr(types, default):
        timed._set_default_backend(getattr(types, default))
    return timed


def _time_buckets(torch, model, hook_fallback):
    """Time each all-reduce bucket of ``model`` (a DDP module the job gave no hook): the reducer
    gets a timed view of its process group; where this torch lacks what that needs, a timed copy
    of DDP's default hook (which averages in a pass of its own) is registered instead."""
    try:
        timed = _timed_group(torch, model.process_group)
        model.reducer._update_process_group(timed)
        # The reducer holds the C++ side only: the Python one is kept alive here, not on the
        # module, which must stay picklable and deep-copyable.
        _TIMED_GROUPS[model] = timed
        return
    except Exception:
        pass
    try:
        hook_fallback()
    except Exception:
        pass


def _patch_ddp(torch):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    original_register = DistributedDataParallel.register_comm_hook
    original_forward = DistributedDataParallel.forward

    def register_comm_hook(self, state, hook):
        self._fdtrace_hooked = True
        return original_register(self, state, hook if "allreduce" in _SKIP else _TimedCommHook(hook))

    def forward(self, *args, **kwargs):
        if not getattr(self, "_fdtrace_hooked", False) and "allreduce" not in _SKIP:
            self._fdtrace_hooked = True
            _time_buckets(torch, self,
                          lambda: original_register(self, None, _TimedCommHook(default_hooks.allreduce_hook)))
        group = _TIMED_GROUPS.get(self)
        if group is not None:
            group.bucket = 0
        if "forward" in _SKIP:
            return original_forward(self, *args, **kwargs)
        token = _begin("forward")
        start_mono, start_wall = time.monotonic_ns(), time.time_ns()
        try:
            return original_forward(self, *args, **kwargs)
        finally:
            _write("forward", start_mono, start_wall, token=token)

    DistributedDataParallel.register_comm_hook = register_comm_hook
    DistributedDataParallel.forward = forward
    if "backward" not in _SKIP:
        torch.autograd.backward = _timed("backward", torch.autograd.backward)


def _patch_optimizer(torch):
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    started = threading.local()

    def pre(optimizer, args, kwargs):
        token = _begin("optimizer", type(optimizer).__name__)
        started.value = (time.monotonic_ns(), time.time_ns(), token)

    def post(optimizer, args, kwargs):
        start = getattr(started, "value", None)
        if start is not None:
            _write("optimizer", start[0], start[1], name=type(optimizer).__name__)
        _state["step"] += 1
        if start is not None:
            _end(start[2], time.time_ns())  # shown live with the step it starts

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)


def _unless_pickling(timed):
    """``timed``, but for the calls torch makes itself to pickle a tensor's storage (pickle,
    deepcopy and multiprocessing of tensors go through torch.save and torch.load): those are
    not checkpoints."""
    original = timed.__wrapped__

    def wrapper(*args, **kwargs):
        caller = sys._getframe(1).f_code
        if caller.co_name.startswith(("__reduce", "_load_from_bytes")) and "torch" in caller.co_filename:
            return original(*args, **kwargs)
        return timed(*args, **kwargs)
    for name in ("__wrapped__", "_fdtrace_phase", "__name__", "__doc__"):
        setattr(wrapper, name, getattr(timed, name))
    return wrapper


def _patch_checkpoints(torch):
    torch.save = _unless_pickling(_timed("checkpoint_save", torch.save))
    torch.load = _unless_pickling(_timed("checkpoint_load", torch.load))
    try:
        import torch.distributed.checkpoint as dcp

        for name, phase in (("save", "checkpoint_save"), ("load", "checkpoint_load"),
                            ("save_state_dict", "checkpoint_save"), ("load_state_dict", "checkpoint_load")):
            if hasattr(dcp, name):
                setattr(dcp, name, _timed(phase, getattr(dcp, name), name="torch.distributed.checkpoint." + name))
    except Exception:
        pass


def _patch(torch):
    if _state["patched"]:
        return
    _state["patched"] = True
    for patch in (_patch_distributed, _patch_ddp, _patch_optimizer, _patch_checkpoints):
        try:
            patch(torch)
        except Exception:
            pass  # that part is not marked; the job is not touched


class _PatchAfterImport(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        try:
            _patch(module)
        except Exception:
            pass


class _TorchFinder(importlib.abc.MetaPathFinder):
    """Patches torch once `import torch` has finished."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch" or _state["patched"]:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchAfterImport(spec.loader)
                return spec
        return None


def _chain_user_sitecustomize():
    """Run the sitecustomize this one hides, if there is one further along sys.path."""
    others = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None and os.path.dirname(spec.origin or "") != _HERE:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _flush_at_exit():
    try:
        if _state["file"] is not None and _state["pid"] == os.getpid():
            _state["file"].flush()
    except Exception:
        pass


try:
    if _OUT_DIR is not None:
        import atexit

        atexit.register(_flush_at_exit)
        if "torch" in sys.modules:
            _patch(sys.modules["torch"])
        else:
            sys.meta_path.insert(0, _TorchFinder())
except Exception:
    pass
try:
    _chain_user_sitecustomize()
except Exception:
    pass
