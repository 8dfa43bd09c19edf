"""torch 2.x's device-bound set-ups on the hoop backend, for a lent GPU (bench/gpu-run, step 7):
init_process_group(device_id=...), split_group (torch >= 2.9; refused by name before), new_group
with the bound device, batch_isend_irecv on CUDA tensors, and DistributedDataParallel on CUDA with
torch's fp16 and bf16 compress hooks and hoop's own (hvd.allreduce_hook, Compression.none and
.int8). Each part prints "PART ok" or "PART FAIL: ..."; the last line is "torch2 devices ok" when
every part passed. Never run on this project's CPU machines (torch 1.13 has none of these paths;
tests/python/devices_worker.py calls the group's side of them there).
Usage (under hooprun, 2 or more ranks): torch2-devices.py
"""
import sys
import traceback

import torch
import torch.distributed as dist

import hoop.torch as hvd
from hoop.torch import _devices

failures = []


def part(name, fn):
    try:
        problem = fn()
    except Exception as err:  # noqa: BLE001 (each part's error is its verdict)
        problem = "%s: %s" % (type(err).__name__, err)
        traceback.print_exc()
    if problem:
        failures.append(name)
        print("%s FAIL: %s" % (name, problem), flush=True)
    else:
        print("%s ok" % name, flush=True)


device = torch.device("cuda", 0)  # every rank shares the one GPU here
torch.cuda.set_device(device)
dist.init_process_group("hoop", device_id=device)
rank, size = dist.get_rank(), dist.get_world_size()
pg = dist.distributed_c10d._get_default_group()


def init_bound():
    t = torch.full((4,), float(rank), device=device)
    dist.all_reduce(t)
    want = float(sum(range(size)))
    if t.tolist() != [want] * 4:
        return "all_reduce after device_id gave %s" % t.tolist()
    if _devices.SPLITS and pg.bound_device_id != device:
        return "bound_device_id %r" % (pg.bound_device_id,)


def split():
    members = list(range(0, size, 2))
    if not _devices.SPLITS:
        try:
            dist.split_group(split_ranks=[members])
            return "torch %s: split_group was not refused" % torch.__version__
        except NotImplementedError as err:
            return None if "torch 2.9" in str(err) else "the refusal: %s" % err
    group = dist.split_group(split_ranks=[members])
    if rank not in members:
        return None if group is None else "a rank outside the split got %r" % (group,)
    t = torch.full((3,), float(rank), device=device)
    dist.all_reduce(t, group=group)
    if t.tolist() != [float(sum(members))] * 3:
        return "the split group's all_reduce gave %s" % t.tolist()


def new_group_bound():
    group = dist.new_group(list(range(size)))
    t = torch.ones(2, device=device)
    dist.all_reduce(t, group=group)
    return None if t.tolist() == [float(size)] * 2 else "new_group's all_reduce %s" % t.tolist()


def batch_p2p():
    send = torch.arange(6.0, device=device) + 10 * rank
    got = torch.empty(6, device=device)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % size),
           dist.P2POp(dist.irecv, got, (rank - 1) % size)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    torch.cuda.synchronize()
    want = torch.arange(6.0, device=device) + 10 * ((rank - 1) % size)
    return None if torch.equal(got, want) else "batch_isend_irecv gave %s" % got.tolist()


def ddp_hooks():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    results = {}
    for name, state, hook in (
            ("none", None, None),
            ("fp16", None, default_hooks.fp16_compress_hook),
            ("bf16", None, default_hooks.bf16_compress_hook),
            ("hoop", hvd.HookState(), hvd.allreduce_hook),
            ("hoop-int8", hvd.HookState(hvd.Compression.int8), hvd.allreduce_hook)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 8)).to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device])
        if hook is not None:
            ddp.register_comm_hook(state, hook)
        g = torch.Generator(device="cpu").manual_seed(rank)
        x = torch.randn(32, 64, generator=g).to(device)
        torch.nn.functional.mse_loss(ddp(x), torch.zeros(32, 8, device=device)).backward()
        results[name] = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
    exact = results["none"]
    scale = float(exact.abs().max())
    bounds = {"fp16": 2 ** -9, "bf16": 2 ** -6, "hoop": 2 ** -20, "hoop-int8": 2 ** -20}
    for name, bound in bounds.items():
        err = float((results[name] - exact).abs().max()) / scale
        if err > bound:  # one host: hoop's wire formats leave it exact
            return "%s hook off by %.3g of the largest gradient (bound %.3g)" % (name, err, bound)


part("init_process_group(device_id=)", init_bound)
part("split_group", split)
part("new_group with the bound device", new_group_bound)
part("batch_isend_irecv on CUDA", batch_p2p)
part("DDP comm hooks on CUDA", ddp_hooks)
dist.destroy_process_group()
if rank == 0:
    print("torch2 devices %s" % ("ok" if not failures else "FAIL: " + ", ".join(failures)))
sys.exit(1 if failures else 0)
