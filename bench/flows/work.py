"""The work every launcher runs, identically: import torch, form the group, one all-reduce
(launch); a DDP loop on random data (ddp); a state dict of a given size (artifact); a rank that
dies before the rendezvous or inside a collective (fail).

Times are seconds since the Metaflow task process of the step was created
(BENCH_TASK_CREATED, set by the step), so launchers compare on one clock."""

import json
import os
import signal
import sys
import time

import psutil


def created(pid="self"):
    """When process `pid` (this one by default) was created (time.time() scale). psutil's
    create_time adds the boot time, which /proc/stat gives in whole seconds: on Linux, count
    back from /proc/uptime instead, which is exact to 10 ms."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return psutil.Process(None if pid == "self" else pid).create_time()
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def task_created():
    """Creation time of the Metaflow task process: the zero of every time reported. Under
    @torch_distributed rank 0 is a process the task starts, whose parent is the task: forked
    (the same command line), or under the start method exec a spin-step of it; elsewhere the
    task is this process."""
    me = psutil.Process()
    parent = me.parent()
    mine = me.cmdline()
    if parent is not None and (parent.cmdline() == mine or (
            "spin-step" in mine and "step" in parent.cmdline())):
        return created(parent.pid)
    return created()


def since(t0):
    return round(time.time() - t0, 4)


def _init(world_size):
    import torch.distributed as dist

    if world_size == 1 and "MASTER_PORT" not in os.environ:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group("gloo")  # env://, from whatever launched this rank
    return dist


def launch(t0, world_size):
    """import torch, init the group, one all-reduce: the phases, in seconds since t0."""
    times = {"proc": round(created() - t0, 4), "body": since(t0),
             "torch_preloaded": "torch" in sys.modules}
    import torch

    times["import"] = since(t0)
    dist = _init(world_size)
    times["init"] = since(t0)
    t = torch.ones(1)
    dist.all_reduce(t)
    times["collective"] = since(t0)
    assert int(t.item()) == world_size, (t.item(), world_size)
    dist.destroy_process_group()
    mark_dir = os.environ.get("BENCH_MARK_DIR")
    if mark_dir:  # every rank's phases, for the profile
        write(os.path.join(mark_dir, "rank-%s.json" % os.environ.get("RANK", "0")), times)
    return times


def ddp(world_size, steps, warmup=10):
    """Steps per second of a small DDP model on random data, after `warmup` steps."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)  # the same for every launcher, whatever their defaults
    dist = _init(world_size)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    rank = dist.get_rank()
    for i in range(steps + warmup):
        if i == warmup:
            dist.barrier()
            started = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print("rank %d step %d loss %.4f" % (rank, i, loss.item()), flush=True)  # log pumping
    dist.barrier()
    elapsed = time.perf_counter() - started
    dist.destroy_process_group()
    return {"steps_per_s": steps / elapsed, "steps": steps, "seconds": elapsed}


def state_dict(megabytes):
    """A state dict of `megabytes` MB of float32 random weights (incompressible, like real ones)."""
    import torch

    g = torch.Generator().manual_seed(0)
    per_tensor = 4 * 1024 * 1024  # 16 MB tensors
    n = int(megabytes * 1024 * 1024 / 4)
    out, i = {}, 0
    while n > 0:
        k = min(per_tensor, n)
        out["layer%d.weight" % i] = torch.randn(k, generator=g)
        n -= k
        i += 1
    return out


def artifact(world_size, megabytes):
    """The ranks form their group and synchronise once, as training would, before rank 0's
    state dict is saved."""
    dist = _init(world_size)
    dist.barrier()
    dist.destroy_process_group()
    return {"megabytes": megabytes}


def fail(world_size, fail_rank, when, mark_dir):
    """Every rank forms the group and all-reduces; `fail_rank` is SIGKILLed before the
    rendezvous or once its peers are blocked in the all-reduce. Writes the time of death."""
    import torch

    rank = int(os.environ["RANK"])

    def die():
        with open(os.path.join(mark_dir, "failed-at"), "w") as f:
            f.write(repr(time.time()))
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    if rank == fail_rank and when == "before_init":
        die()
    dist = _init(world_size)
    if rank == fail_rank:
        time.sleep(1.0)  # the peers are inside the all-reduce now
        die()
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"survived": True}


def run(t0):
    """The work named by BENCH_KIND with the settings the bench driver put in the environment:
    (result, state dict or None)."""
    env = os.environ
    world = int(env["BENCH_WORLD"])
    kind = env["BENCH_KIND"]
    if kind == "launch":
        return launch(t0, world), None
    if kind == "ddp":
        return ddp(world, int(env["BENCH_STEPS"])), None
    if kind == "artifact":
        return artifact(world, float(env["BENCH_MB"])), state_dict(float(env["BENCH_MB"]))
    if kind == "fail":
        return fail(world, int(env["BENCH_FAIL_RANK"]), env["BENCH_FAIL_WHEN"],
                    env["BENCH_MARK_DIR"]), None
    raise ValueError("unknown BENCH_KIND %r" % kind)


def write(path, result):
    with open(path, "w") as f:
        json.dump(result, f)
