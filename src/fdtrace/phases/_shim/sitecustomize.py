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
import os
import sys
import threading
import time

_OUT_DIR = os.environ.get("FDTRACE_PHASES_DIR")
_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_state = {"file": None, "pid": None, "step": 0, "broken": False, "patched": False}


def _rank_info():
    rank = os.environ.get("RANK")
    world = os.environ.get("WORLD_SIZE")
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    as_int = lambda v: int(v) if v is not None and str(v).lstrip("-").isdigit() else None  # noqa: E731
    return as_int(rank), as_int(os.environ.get("LOCAL_RANK")), as_int(world)


def _write(phase, start_mono, start_wall, name=None, bucket=None):
    """Append one phase record to this process's file."""
    if _OUT_DIR is None or _state["broken"]:
        return
    end_mono, end_wall = time.monotonic_ns(), time.time_ns()
    rank, local_rank, world = _rank_info()
    record = {"rank": rank, "local_rank": local_rank, "world_size": world, "pid": os.getpid(),
              "tid": threading.get_native_id(), "step": _state["step"], "phase": phase, "name": name,
              "bucket": bucket, "start_mono_ns": start_mono, "end_mono_ns": end_mono,
              "start_wall_ns": start_wall, "end_wall_ns": end_wall}
    try:
        with _lock:
            if _state["pid"] != os.getpid():  # first write, or a forked child
                _state["file"] = open(os.path.join(_OUT_DIR, f"phases-{os.getpid()}.jsonl"), "a", buffering=1)
                _state["pid"] = os.getpid()
            _state["file"].write(json.dumps(record) + "\n")
    except Exception:
        _state["broken"] = True


def _timed(phase, function, name=None):
    """``function`` with its calls recorded as ``phase``."""
    def wrapper(*args, **kwargs):
        start_mono, start_wall = time.monotonic_ns(), time.time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            _write(phase, start_mono, start_wall, name)
    wrapper.__wrapped__ = function
    wrapper._fdtrace_phase = phase
    wrapper.__name__ = getattr(function, "__name__", "wrapper")
    wrapper.__doc__ = getattr(function, "__doc__", None)
    return wrapper


def _timed_comm_hook(hook):
    """A DDP communication hook that records each bucket's all-reduce, start to completion."""
    def timed(state, bucket):
        start_mono, start_wall = time.monotonic_ns(), time.time_ns()
        index = bucket.index()
        future = hook(state, bucket)

        def done(fut):
            _write("allreduce", start_mono, start_wall, bucket=index)
            return fut.value()
        return future.then(done)
    timed.__wrapped__ = hook
    return timed


def _patch_distributed(torch):
    import torch.distributed as dist

    for name in ("init_process_group", "new_group", "barrier", "destroy_process_group"):
        original = getattr(dist, name, None)
        if original is not None and not hasattr(original, "_fdtrace_phase"):
            setattr(dist, name, _timed(name, original))


def _patch_ddp(torch):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    original_register = DistributedDataParallel.register_comm_hook
    original_forward = DistributedDataParallel.forward

    def register_comm_hook(self, state, hook):
        self._fdtrace_hooked = True
        return original_register(self, state, _timed_comm_hook(hook))

    def forward(self, *args, **kwargs):
        if not getattr(self, "_fdtrace_hooked", False):
            # No hook of the user's: the default all-reduce, timed (the same arithmetic as DDP's
            # built-in one: average by dividing, then sum).
            self._fdtrace_hooked = True
            try:
                original_register(self, None, _timed_comm_hook(default_hooks.allreduce_hook))
            except Exception:
                pass
        start_mono, start_wall = time.monotonic_ns(), time.time_ns()
        try:
            return original_forward(self, *args, **kwargs)
        finally:
            _write("forward", start_mono, start_wall)

    DistributedDataParallel.register_comm_hook = register_comm_hook
    DistributedDataParallel.forward = forward
    torch.autograd.backward = _timed("backward", torch.autograd.backward)


def _patch_optimizer(torch):
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    started = threading.local()

    def pre(optimizer, args, kwargs):
        started.value = (time.monotonic_ns(), time.time_ns())

    def post(optimizer, args, kwargs):
        start = getattr(started, "value", None)
        if start is not None:
            _write("optimizer", start[0], start[1], name=type(optimizer).__name__)
        _state["step"] += 1

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)


def _patch_checkpoints(torch):
    torch.save = _timed("checkpoint_save", torch.save)
    torch.load = _timed("checkpoint_load", torch.load)
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


try:
    if _OUT_DIR is not None:
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
