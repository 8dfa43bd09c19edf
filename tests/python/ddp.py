"""DistributedDataParallel for a few steps, then all_reduce (async), all_gather, broadcast and
barrier, on the backend named on the command line: tests/test_python.sh runs it with "gloo" and
with "hoop" under hooprun and requires the same lines from both. On hoop, an unsupported call
must raise NotImplementedError naming it.
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
if backend == "hoop":
    try:
        dist.reduce(t, dst=0)
        print("rank %d: dist.reduce did not raise" % rank)
    except NotImplementedError as err:
        if rank == 0:
            print("unsupported:", err)
dist.destroy_process_group()
