"""A small PyTorch DDP job (gloo, CPU) for the phase tests: WORLD ranks train a linear model for
STEPS steps, rank 0 saves a checkpoint, and every rank prints a checksum of its parameters.

    python tests/data/ddp_train.py [--world 2] [--steps 3] [--hook] [--port 29511] [--step-sleep S]
                                   [--profile DIR] [--second-group]

Under torchrun (one process per rank, started by torchrun) it trains its own rank, from the
environment torchrun sets, instead of spawning the ranks itself.

--hook registers a communication hook of the job's own, which counts its calls; --older-torch
hides the reducer's _update_process_group, as a torch without it would (the shim then falls back); --step-sleep
waits S seconds after each step (time for a watcher to see the ranks move); --profile runs the
steps under the PyTorch profiler and writes its (Kineto) trace to DIR/trace-RANK.json;
--second-group makes a second world-sized Gloo group (new_group(backend="gloo")) and all-reduces over it
once, holding it to the end (a second full mesh of connections).
"""

import argparse
import contextlib
import os
import pickle
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel


class _ReducerOfAnOlderTorch:
    """DDP's reducer without _update_process_group, as in a torch that lacks it."""

    def __init__(self, reducer):
        self._reducer = reducer

    def __getattr__(self, name):
        if name == "_update_process_group":
            raise AttributeError(name)
        return getattr(self._reducer, name)


def train(rank, world, steps, port, hook, checkpoint, step_sleep, profile_dir, older_torch=False,
          second_group=False):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if second_group:
        group = dist.new_group(backend="gloo")
        dist.all_reduce(torch.ones(1), group=group)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                                        torch.nn.Linear(256, 8)), bucket_cap_mb=0.005)
    if older_torch:
        model.reducer = _ReducerOfAnOlderTorch(model.reducer)
    calls = {"n": 0}
    if hook:
        def counting_hook(state, bucket):
            calls["n"] += 1
            return default_hooks.allreduce_hook(state, bucket)
        model.register_comm_hook(dist.group.WORLD, counting_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    profiling = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile_dir else None
    with profiling or contextlib.nullcontext():
        for _ in range(steps):
            inputs = torch.randn(32, 64, generator=generator)
            loss = model(inputs).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(step_sleep)
    if profiling is not None:
        profiling.export_chrome_trace(os.path.join(profile_dir, f"trace-{rank}.json"))
    dist.barrier()
    if rank == 0:
        torch.save(model.module.state_dict(), checkpoint)
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    if not hook:  # (the job's hook is a local function: DDP keeps it, and it is not picklable)
        pickle.dumps(model)  # the module stays picklable under fdtrace run, and pickling is no checkpoint
    pickle.loads(pickle.dumps(model.module))
    # One write of one whole line: ranks share the pipe, and print() writes the newline apart.
    # How DDP reduced: its buckets, and the communication hook it calls (none: its built-in all-reduce).
    buckets = len(model.reducer._get_zeros_like_grad_buckets())
    comm_hook = model._get_ddp_logging_data().get("comm_hook") or "-"
    sys.stdout.write(f"rank {rank} checksum {checksum:.12f} hook_calls {calls['n']} buckets {buckets} "
                     f"comm_hook {comm_hook}\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    # Skip the interpreter's teardown: in about one run in twenty, gloo's threads crash it
    # (SIGABRT "terminate called without an active exception", SIGBUS) or hang it, after the
    # job's work is done and reported; see pytorch/pytorch#179291. Exit 0 is what spawn checks.
    os._exit(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--port", type=int, default=29511)
    parser.add_argument("--hook", action="store_true")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--older-torch", action="store_true", help="a reducer without _update_process_group")
    parser.add_argument("--second-group", action="store_true", help="a second world-sized Gloo group")
    parser.add_argument("--checkpoint", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "ddp-checkpoint.pt"))
    args = parser.parse_args()
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args.steps, int(os.environ["MASTER_PORT"]),
              args.hook, args.checkpoint, args.step_sleep, args.profile, args.older_torch, args.second_group)
    else:
        mp.spawn(train, args=(args.world, args.steps, args.port, args.hook, args.checkpoint, args.step_sleep,
                              args.profile, args.older_torch, args.second_group), nprocs=args.world)
