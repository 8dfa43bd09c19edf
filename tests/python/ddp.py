"""DistributedDataParallel for a few steps, then all_reduce (async), all_gather, broadcast,
barrier, ZeroRedundancyOptimizer under DistributedDataParallel, torch's own DDP comm hooks, reduce, gather, scatter, isend/irecv, uneven all_to_all_single and collectives on
new_group subsets, on the backend named on the command line: tests/test_python.sh runs it with
"gloo" and with "hoop" under hooprun and requires the same lines from both. On hoop, reduce_scatter
(which 1.13's gloo lacks) is checked against its sum, and an unsupported call (a receive from any
source) must raise NotImplementedError naming it.
"""
import sys, torch, torch.distributed as dist
backend = sys.argv[1]
if backend == "hoop":
    import hoop.torch  # registers the backend
dist.init_process_group(backend)
rank, size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1 + rank)
for step in range(5):
    x = torch.randn(16, 20, generator=g); y = torch.randint(0, 4, (16,), generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    loss.backward()
    opt.step()
    l = loss.detach().clone()
    dist.all_reduce(l)
    if rank == 0: print("step %d loss %.6f" % (step, l.item() / size))
t = torch.arange(4.0) + rank
w = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True); w.wait()
outs = [torch.empty(2) for _ in range(size)]; dist.all_gather(outs, torch.full((2,), float(rank)))
b = torch.full((3,), float(rank)); dist.broadcast(b, src=size - 1); dist.barrier()
if rank == 0: print("max", t.tolist(), "gather", [o.tolist() for o in outs], "bcast", b.tolist())
params = torch.cat([p.detach().flatten() for p in model.parameters()])
if rank == 0: print("params %.8f" % params.sum().item())
# ZeroRedundancyOptimizer (optimizer state sharded across ranks) under DistributedDataParallel.
from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: E402
torch.manual_seed(0)
zmodel = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
zddp = torch.nn.parallel.DistributedDataParallel(zmodel)
zopt = ZeroRedundancyOptimizer(zddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
for step in range(4):
    x = torch.randn(16, 20, generator=g); y = torch.randint(0, 4, (16,), generator=g)
    zopt.zero_grad()
    loss = torch.nn.functional.cross_entropy(zddp(x), y)
    loss.backward()
    zopt.step()
    l = loss.detach().clone()
    dist.all_reduce(l)
    if rank == 0: print("zero step %d loss %.6f" % (step, l.item() / size))
zopt.consolidate_state_dict(to=0)
if rank == 0: print("zero params %.5f" % sum(p.sum().item() for p in zmodel.parameters()))
# torch's own DDP communication hooks (they call all_reduce(async_op=True).get_future() and chain
# on it, PowerSGD's also within its callbacks): fp16 and bf16 compression and PowerSGD, the same
# bits on both backends.
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook  # noqa: E402
for hook_name in ("fp16_compress_hook", "bf16_compress_hook", "powerSGD_hook"):
    torch.manual_seed(0)
    hmodel = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    hddp = torch.nn.parallel.DistributedDataParallel(hmodel)
    if "powerSGD" in hook_name:
        hddp.register_comm_hook(powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
            use_error_feedback=True, warm_start=True, random_seed=7),
            getattr(powerSGD_hook, hook_name))
    else:
        try:
            hddp.register_comm_hook(None, getattr(default_hooks, hook_name))
        except TypeError as err:  # torch 1.13: bf16's hook only where NCCL is (either backend)
            if rank == 0: print("hook %s refused by torch: %s" % (hook_name, err))
            continue
    hopt = torch.optim.SGD(hddp.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn(16, 20, generator=g); y = torch.randint(0, 4, (16,), generator=g)
        hopt.zero_grad()
        torch.nn.functional.cross_entropy(hddp(x), y).backward()
        hopt.step()
    if rank == 0: print("hook %s params %.8f" % (hook_name, sum(p.double().sum().item() for p in hmodel.parameters())))
# The calls of sharded, pipelined and expert-parallel training, alike on both backends.
r = torch.arange(5.0) * (rank + 1); dist.reduce(r, dst=0)
g_in = torch.full((2,), float(rank) + 0.5)
g_out = [torch.empty(2) for _ in range(size)] if rank == 0 else None
dist.gather(g_in, g_out, dst=0)
s_out = torch.empty(3)
dist.scatter(s_out, [torch.full((3,), 10.0 + i) for i in range(size)] if rank == 0 else None,
             src=0)
ring = torch.full((4,), float(rank))
got = torch.empty(4)
reqs = [dist.isend(ring, (rank + 1) % size), dist.irecv(got, (rank - 1) % size)]
for q in reqs:
    q.wait()
# Uneven all_to_all_single: rank r sends r + 1 + d rows to rank d.
send_splits = [rank + 1 + d for d in range(size)]
recv_splits = [q + 1 + rank for q in range(size)]
a_in = torch.cat([torch.full((n, 2), float(100 * rank + d)) for d, n in enumerate(send_splits)])
a_out = torch.empty(sum(recv_splits), 2)
dist.all_to_all_single(a_out, a_in, recv_splits, send_splits)
# A group of all but rank 0 (when there are more than one), and one of all, used in turn.
sub = dist.new_group(list(range(1, size))) if size > 1 else None
whole = dist.new_group(list(range(size)))
x = torch.full((2,), float(rank))
if sub is not None and rank != 0:
    dist.all_reduce(x, group=sub)
dist.all_reduce(x, group=whole)
if rank == 0:
    print("reduce", r.tolist(), "gather", [o.tolist() for o in g_out])
    print("scatter", s_out.tolist(), "ring", got.tolist())
    print("alltoall", a_out[:, 0].tolist(), "groups", x.tolist())
if backend == "hoop":
    # Not in torch 1.13's gloo: reduce-scatter, checked against its sum here.
    inputs = [torch.full((3,), float(rank + d)) for d in range(size)]
    out = torch.empty(3)
    dist.reduce_scatter(out, inputs)
    want = float(sum(q + rank for q in range(size)))
    flat_out = torch.empty(2)
    dist._reduce_scatter_base(flat_out, torch.arange(2.0 * size) + rank)
    flat_want = torch.tensor([float(sum(2 * rank + i + q for q in range(size))) for i in range(2)])
    if out.tolist() != [want] * 3 or not torch.equal(flat_out, flat_want):
        print("rank %d: reduce_scatter gave %s and %s" % (rank, out.tolist(), flat_out.tolist()))
    elif rank == 0:
        print("reduce_scatter ok")
    # What torch 2.x's C++ asks of a Python group (functional collectives, DTensor, FSDP2): the
    # coalesced calls, and the group's name both ways.
    pg = dist.distributed_c10d._get_default_group()
    ins = [torch.arange(3.0) + 10 * rank, torch.full((2, 2), float(rank))]
    outs = [torch.empty(3 * size), torch.empty(2 * size, 2)]
    pg.allgather_into_tensor_coalesced(outs, ins).wait()
    got = [torch.cat([torch.arange(3.0) + 10 * q for q in range(size)]),
           torch.cat([torch.full((2, 2), float(q)) for q in range(size)])]
    rs_out = [torch.empty(2), torch.empty(1)]
    pg.reduce_scatter_tensor_coalesced(rs_out, [torch.arange(2.0 * size), torch.ones(size)]).wait()
    rs_want = [torch.arange(2.0 * rank, 2.0 * rank + 2) * size, torch.full((1,), float(size))]
    if getattr(pg, "_hoop_group_name", None) is None:  # torch 1.13 names no group
        pg._set_group_name("hoop-test")
    named = pg.group_name == pg.getGroupName() and pg.group_name
    if not (all(torch.equal(a, b) for a, b in zip(outs + rs_out, got + rs_want)) and named):
        print("rank %d: coalesced calls gave %s, name %r" % (rank, outs + rs_out, named))
    elif rank == 0:
        print("coalesced ok")
    # PREMUL_SUM (what FSDP and DDP's hooks pass to scale gradients): each input times the factor,
    # summed; the inputs of a reduce-scatter and of a reduce elsewhere than the root unchanged.
    # Torch 1.13 keeps the factor from a Python group, and the op is refused by name; torch 2.x
    # gives it in the op's pickled state, which an op built as 2.x builds it shows on any torch.
    class Premul:
        def __init__(self, factor):
            self.factor = factor

        def __eq__(self, other):
            return other == dist.ReduceOp.PREMUL_SUM

        def __getstate__(self):
            return (dist.ReduceOp.PREMUL_SUM, self.factor)

    def premul_calls(make):
        from types import SimpleNamespace as opts
        t = torch.full((3,), float(rank + 1))
        pg.allreduce([t], opts(reduceOp=make(0.5))).wait()
        rs_in = torch.arange(2.0 * size) + rank
        rs_out = torch.empty(2)
        pg._reduce_scatter_base(rs_out, rs_in, opts(reduceOp=make(torch.tensor([2.0])))).wait()
        r_in = torch.full((2,), float(rank + 1))
        pg.reduce([r_in], opts(reduceOp=make(3.0), rootRank=0)).wait()
        want = 0.5 * sum(q + 1 for q in range(size))
        rs_want = [2.0 * sum(2 * rank + i + q for q in range(size)) for i in range(2)]
        r_want = 3.0 * sum(q + 1 for q in range(size)) if rank == 0 else float(rank + 1)
        return (t.tolist() == [want] * 3 and rs_out.tolist() == rs_want and
                torch.equal(rs_in, torch.arange(2.0 * size) + rank) and r_in.tolist() == [r_want] * 2)

    if hasattr(dist.ReduceOp, "PREMUL_SUM"):
        if not premul_calls(Premul):
            print("rank %d: premul gave wrong results (an op as torch 2.x makes it)" % rank)
        elif rank == 0:
            print("premul ok: the factor applied (an op as torch 2.x makes it)")
        try:
            if not premul_calls(dist._make_nccl_premul_sum):
                print("rank %d: premul gave wrong results (this torch's op)" % rank)
            elif rank == 0:
                print("premul ok: the factor applied (this torch's op)")
        except NotImplementedError as err:
            if rank == 0:
                print("premul ok: refused:", err)
    try:
        dist.recv(torch.empty(1))
        print("rank %d: a receive from any source did not raise" % rank)
    except NotImplementedError as err:
        if rank == 0:
            print("unsupported:", err)
dist.destroy_process_group()
