"""One rank of hoop.torch's Horovod API test (tests/test_torch.sh starts it under hooprun).

Every result is checked against a reference computed here from what every rank holds (each rank
can compute every other rank's input): allreduce for every dtype and op at odd counts, in place
and not, blocking and not; grouped allreduce; broadcast and broadcast_ from every root; allgather
with uneven first dimensions; objects; broadcast_parameters and broadcast_optimizer_state;
DistributedOptimizer against one process training on the global batch (plain, fp16, several
buckets, backward_passes_per_step 2, a parameter some ranks never use); join with uneven inputs;
and the errors. Prints one summary line per rank.
"""

import os
import sys

import torch

import hoop
import hoop.torch as hvd

# HVD_WORKER_PER_HOST=k: each k ranks report a host of their own (HOOP_HOSTNAME), as if the job ran
# on size/k hosts, to check local and cross ranks.
per_host = int(os.environ.get("HVD_WORKER_PER_HOST", "0"))
if per_host:
    os.environ["HOOP_HOSTNAME"] = "fake-host-%d" % (int(os.environ["HOOP_RANK"]) // per_host)
hvd.init()
rank, size = hvd.rank(), hvd.size()
checks = failures = 0


def check(ok, what):
    global checks, failures
    checks += 1
    if not ok:
        failures += 1
        print("rank %d FAIL: %s" % (rank, what), file=sys.stderr, flush=True)


# Horovod's local and cross ranks: the job's host layout, and hvd.cuda_built() as hoop says.
k = per_host or size
hosts = (size + k - 1) // k
want = (rank % k, min(k, size - rank // k * k), rank // k,
        hosts if rank % k < size - (hosts - 1) * k else hosts - 1)
got = (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
check(got == want, "(local_rank, local_size, cross_rank, cross_size) %s, not %s" % (got, want))
check(hvd.cuda_built() == hoop.cuda_supported(), "hvd.cuda_built() is not hoop.cuda_supported()")


def data(r, n, dtype, op):
    """Rank r's input: small values, so that sums and products are exact in every dtype."""
    i = torch.arange(n, dtype=torch.int64)
    if op == hvd.Product:
        v = torch.tensor([1, 2, 1, 3, 1])[(i + r) % 5]
    elif dtype == torch.uint8:
        v = (r * 7 + i * 3) % 5
    else:
        v = (r * 7 + i * 3) % 5 - 2
    return v.to(dtype)


def reference(n, dtype, op):
    every = torch.stack([data(r, n, dtype, op).double() for r in range(size)])
    if op == hvd.Sum:
        out = every.sum(0)
    elif op == hvd.Average:
        out = every.sum(0) / size
        if not dtype.is_floating_point:
            out = out.trunc()
    elif op == hvd.Product:
        out = every.prod(0)
    elif op == hvd.Min:
        out = every.min(0).values
    else:
        out = every.max(0).values
    return out


def close(got, want, dtype):
    tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
    return torch.allclose(got.double(), want, rtol=tol, atol=tol)


DTYPES = (torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64)
OPS = (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product)

# ---- allreduce: every dtype and op, odd counts, three ways --------------------------------------
for dtype in DTYPES:
    for op in OPS:
        for n in (1, 7, 1031):
            want = reference(n, dtype, op)
            mine = data(rank, n, dtype, op)
            out = hvd.allreduce(mine, op=op)
            check(close(out, want, dtype) and torch.equal(mine, data(rank, n, dtype, op)),
                  "allreduce %s %s n=%d: %s" % (dtype, op, n, out[:5].tolist()))
            inplace = data(rank, n, dtype, op)
            hvd.allreduce_(inplace, op=op)
            check(close(inplace, want, dtype), "allreduce_ %s %s n=%d" % (dtype, op, n))
            handle = hvd.allreduce_async(data(rank, n, dtype, op), op=op)
            out = hvd.synchronize(handle)
            check(close(out, want, dtype), "allreduce_async %s %s n=%d" % (dtype, op, n))

# average= (Horovod's older argument), scale factors, a view that is not contiguous, fp16 on the
# wire, and several handles outstanding at once completed in reverse order.
t = torch.full((5,), float(rank + 1))
check(torch.allclose(hvd.allreduce(t, average=False), torch.full((5,), size * (size + 1) / 2.0)),
      "allreduce average=False")
out = hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
check(torch.allclose(out, torch.full((5,), size * (size + 1) / 2.0)), "pre/postscale")
grid = torch.arange(12.0).reshape(3, 4) + rank
column = grid[:, 1]
hvd.allreduce_(column, op=hvd.Sum)
check(torch.allclose(grid[:, 1], torch.tensor([1.0, 5.0, 9.0]) * size + size * (size - 1) / 2),
      "allreduce_ on a strided view: %s" % grid[:, 1].tolist())
check(torch.allclose(grid[:, 0], torch.tensor([0.0, 4.0, 8.0]) + rank), "the view's neighbours")
half = hvd.allreduce(torch.full((9,), 0.5 * (rank + 1)), compression=hvd.Compression.fp16)
check(half.dtype == torch.float32 and torch.allclose(half, torch.full((9,), 0.25 * (size + 1))),
      "fp16 compression: %s %s" % (half.dtype, half[:3].tolist()))
handles = [hvd.allreduce_async(torch.full((k + 1,), float(rank)), op=hvd.Max) for k in range(6)]
for k, h in reversed(list(enumerate(handles))):
    while not hvd.poll(h):
        pass
    check(torch.equal(hvd.synchronize(h), torch.full((k + 1,), float(size - 1))), "async %d" % k)

# Grouped allreduce: one fused transfer.
group = [torch.full((k * 3 + 1,), float(rank + k)) for k in range(5)]
outs = hvd.grouped_allreduce(group, op=hvd.Sum)
check(all(torch.allclose(o, torch.full_like(o, size * k + size * (size - 1) / 2.0))
          for k, o in enumerate(outs)), "grouped_allreduce")

# ---- broadcast ----------------------------------------------------------------------------------
for root in range(size):
    for dtype in (torch.uint8, torch.float32, torch.bfloat16, torch.int64):
        mine = data(rank, 33, dtype, hvd.Sum)
        out = hvd.broadcast(mine, root)
        check(torch.equal(out, data(root, 33, dtype, hvd.Sum))
              and torch.equal(mine, data(rank, 33, dtype, hvd.Sum)),
              "broadcast %s root %d" % (dtype, root))
        hvd.broadcast_(mine, root_rank=root)
        check(torch.equal(mine, data(root, 33, dtype, hvd.Sum)), "broadcast_ %s root %d"
              % (dtype, root))

# ---- allgather: first dimensions that differ between ranks --------------------------------------
mine = torch.full((rank + 1, 3), rank, dtype=torch.int32)
out = hvd.allgather(mine)
want = torch.cat([torch.full((r + 1, 3), r, dtype=torch.int32) for r in range(size)])
check(torch.equal(out, want), "allgather uneven: %s" % out.tolist())
out = hvd.synchronize(hvd.allgather_async(torch.tensor([float(rank)] * 2)))
check(out.tolist() == [float(r) for r in range(size) for _ in range(2)], "allgather_async")

# ---- alltoall with splits, and equal shares -----------------------------------------------------
# Rank r sends (r + d) % 3 rows of [100 r + d, ...] to rank d.
splits = [(rank + d) % 3 for d in range(size)]
rows = torch.cat([torch.full((n, 2), 100 * rank + d, dtype=torch.float64)
                  for d, n in enumerate(splits)])
out, received = hvd.alltoall(rows, splits=torch.tensor(splits))
want_counts = [(q + rank) % 3 for q in range(size)]
want = torch.cat([torch.full((n, 2), 100 * q + rank, dtype=torch.float64)
                  for q, n in enumerate(want_counts)])
check(received.tolist() == want_counts and torch.equal(out, want),
      "alltoall with splits: %s, %s" % (received.tolist(), out.tolist()))
even = torch.arange(2 * size, dtype=torch.int32) + 1000 * rank
got = hvd.alltoall(even)
check(got.tolist() == [1000 * q + 2 * rank + i for q in range(size) for i in range(2)],
      "alltoall equal: %s" % got.tolist())

# ---- reducescatter: rows shared out, the first ranks one more -------------------------------------
for n_rows in (2 * size, 2 * size + 1):
    t = torch.arange(n_rows * 3, dtype=torch.float32).reshape(n_rows, 3) + rank
    got = hvd.reducescatter(t, op=hvd.Sum)
    first = sum(n_rows // size + (1 if q < n_rows % size else 0) for q in range(rank))
    mine = n_rows // size + (1 if rank < n_rows % size else 0)
    want = (torch.arange(n_rows * 3, dtype=torch.float32).reshape(n_rows, 3) * size +
            size * (size - 1) / 2)[first:first + mine]
    check(torch.equal(got, want), "reducescatter of %d rows: %s" % (n_rows, got.tolist()))
avg = hvd.reducescatter(torch.full((size, 2), float(rank)))
check(avg.tolist() == [[(size - 1) / 2] * 2], "reducescatter average: %s" % avg.tolist())
outs = hvd.grouped_reducescatter([torch.ones(size, 1), torch.full((size,), 2.0)], op=hvd.Sum)
check(outs[0].tolist() == [[float(size)]] and outs[1].tolist() == [2.0 * size],
      "grouped_reducescatter: %s" % [o.tolist() for o in outs])
gathered = hvd.grouped_allgather([torch.tensor([rank]), torch.full((1, 2), rank)])
check(gathered[0].tolist() == list(range(size)) and
      gathered[1].tolist() == [[r, r] for r in range(size)],
      "grouped_allgather: %s" % [g.tolist() for g in gathered])

# ---- process sets: the even ranks, and all but the last (sub-communicators of the job's) ---------
if size > 1:
    evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    firsts = hvd.add_process_set(hvd.ProcessSet(range(size - 1)))
    check(evens.included() == (rank % 2 == 0) and firsts.size() == size - 1,
          "process sets: %r %r" % (evens, firsts))
    if evens.included():
        t = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, process_set=evens)
        # Roots are ranks of the job, as in Horovod: the set's last member, not its index.
        last = evens.ranks[-1]
        b = hvd.broadcast(torch.tensor([rank]), root_rank=last, process_set=evens)
        o = hvd.broadcast_object("from %d" % rank, root_rank=last, process_set=evens)
        check(t.item() == sum(evens.ranks) and b.item() == last and o == "from %d" % last,
              "collectives on the even ranks: %s %s %r" % (t.tolist(), b.tolist(), o))
        try:
            hvd.broadcast(torch.tensor([rank]), root_rank=1, process_set=evens)
            check(False, "a broadcast on the even ranks from rank 1 was accepted")
        except hvd.InvalidArgument as err:
            check("not a member" in str(err), "root outside the set: %s" % err)
    else:
        try:
            hvd.allreduce(torch.ones(1), process_set=evens)
            check(False, "a call on a process set without this rank was accepted")
        except hvd.InvalidArgument as err:
            check("not in" in str(err), "outside a process set: %s" % err)
    if firsts.included():
        h = hvd.allreduce_async(torch.tensor([1.0]), op=hvd.Sum, process_set=firsts)
        g = hvd.allgather(torch.tensor([rank]), process_set=firsts)
        rs = hvd.reducescatter(torch.ones(size - 1, 2), op=hvd.Sum, process_set=firsts)
        check(hvd.synchronize(h).item() == size - 1 and g.tolist() == firsts.ranks and
              rs.tolist() == [[float(size - 1)] * 2],
              "collectives on all but the last rank: %s %s" % (g.tolist(), rs.tolist()))
    check(hvd.remove_process_set(evens) and hvd.remove_process_set(firsts) and
          not hvd.remove_process_set(evens), "remove_process_set")

# ---- SyncBatchNorm: what BatchNorm does on the global batch in one process -----------------------
torch.manual_seed(7)
full = torch.randn(4 * size, 3, 5, dtype=torch.float64)  # alike on every rank
coeff = torch.randn(4 * size, 3, 5, dtype=torch.float64)
sbn, ref = hvd.SyncBatchNorm(3).double(), torch.nn.BatchNorm1d(3).double()
for bn in (sbn, ref):
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
part = slice(4 * rank, 4 * rank + 4)
xs = full[part].clone().requires_grad_()
out_s = sbn(xs)
(out_s * coeff[part]).sum().backward()
xr = full.clone().requires_grad_()
out_ref = ref(xr)
(out_ref * coeff).sum().backward()
wgrad = hvd.allreduce(sbn.weight.grad, op=hvd.Sum)
check(torch.allclose(out_s, out_ref[part], atol=1e-12) and
      torch.allclose(xs.grad, xr.grad[part], atol=1e-9) and
      torch.allclose(sbn.running_mean, ref.running_mean, atol=1e-12) and
      torch.allclose(sbn.running_var, ref.running_var, atol=1e-12) and
      torch.allclose(wgrad, ref.weight.grad, atol=1e-9),
      "SyncBatchNorm against BatchNorm on the global batch")
sbn.eval()
check(torch.allclose(sbn(full[part]), ref.eval()(full[part]), atol=1e-12), "SyncBatchNorm eval")

# ---- objects ------------------------------------------------------------------------------------
obj = hvd.broadcast_object({"rank": rank, "t": torch.arange(3) + rank}, root_rank=size - 1)
check(obj["rank"] == size - 1 and obj["t"].tolist() == [size - 1, size, size + 1],
      "broadcast_object: %r" % obj)
check(hvd.allgather_object("x" * rank) == ["x" * r for r in range(size)], "allgather_object")

# ---- parameters and optimizer state from rank 0 -------------------------------------------------


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


model = make_model(100 + rank)  # every rank starts elsewhere
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
reference_model = make_model(100)
check(all(torch.equal(a, b) for a, b in zip(model.parameters(), reference_model.parameters())),
      "broadcast_parameters")
opt = torch.optim.Adam(model.parameters(), lr=1e-3 * (rank + 1))
if rank == 0:  # rank 0 has taken a step: it has Adam's moments
    model(torch.ones(2, 10)).sum().backward()
    opt.step()
    opt.zero_grad()
hvd.broadcast_optimizer_state(opt, root_rank=0)
state = opt.state_dict()
check(state["param_groups"][0]["lr"] == 1e-3 and len(state["state"]) == 4,
      "broadcast_optimizer_state: lr %r, %d states" % (state["param_groups"][0]["lr"],
                                                      len(state["state"])))
check(all(torch.equal(a, b) for a, b in zip(hvd.allgather_object(state)[0]["state"][0].values(),
                                            state["state"][0].values())),
      "rank 0's moments")

# ---- DistributedOptimizer against one process on the global batch ------------------------------


def global_batch(step, per_rank):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size * per_rank, 10, generator=g)
    y = torch.randint(0, 3, (size * per_rank,), generator=g)
    return x, y


def forward(model, xs, skip_bias):
    hidden = model[1](model[0](xs))
    if skip_bias:
        # The graph leaves the last bias out: its hook never runs, its gradient counts as zeros,
        # and the ranks' calls still match.
        return torch.nn.functional.linear(hidden, model[2].weight)
    return model[2](hidden)


def train(distributed, steps, compression=hvd.Compression.none, passes=1, per_rank=4,
          bucket_groups=None, skip_bias_on=()):
    """Train for steps. Distributed, each rank takes its slice of the global batch (in passes
    micro-batches per step). Alone, this process plays every rank in turn and averages their
    gradients itself: the reference."""
    model = make_model(7)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=compression, backward_passes_per_step=passes,
                                       groups=bucket_groups)
    for step in range(steps):
        x, y = global_batch(step, per_rank)
        opt.zero_grad()
        for r in ([rank] if distributed else range(size)):
            xr, yr = x[r * per_rank:(r + 1) * per_rank], y[r * per_rank:(r + 1) * per_rank]
            micro = per_rank // passes
            for k in range(passes):
                xs, ys = xr[k * micro:(k + 1) * micro], yr[k * micro:(k + 1) * micro]
                out = forward(model, xs, r in skip_bias_on)
                loss = torch.nn.functional.cross_entropy(out, ys) / passes
                (loss if distributed else loss / size).backward()
        opt.step()
    return model


def compare(name, together, alone, tol):
    worst = max((a - b).abs().max().item()
                for a, b in zip(alone.parameters(), together.parameters()))
    check(worst <= tol, "DistributedOptimizer %s: %.3g from the one-process run" % (name, worst))
    # And every rank ends with the same parameters.
    flat = torch.cat([p.detach().flatten() for p in together.parameters()])
    check(torch.equal(hvd.broadcast(flat, 0), flat), "DistributedOptimizer %s: ranks differ"
          % name)


alone = train(False, 12)
for name, kwargs, tol in (("plain", {}, 1e-5), ("several buckets", {"bucket_groups": 3}, 1e-5),
                          ("backward_passes_per_step 2", {"passes": 2}, 1e-5),
                          ("fp16", {"compression": hvd.Compression.fp16}, 2e-2)):
    compare(name, train(True, 12, **kwargs), alone, tol)

# A parameter that rank 0 never reaches: its gradient there is zeros, the others' averaged in.
if size > 1:
    compare("missing gradient", train(True, 3, skip_bias_on={0}),
            train(False, 3, skip_bias_on={0}), 1e-5)

# zero_grad between backward and step is refused, as Horovod refuses it.
if size > 1:
    model = make_model(7)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(2, 10)).sum().backward()
    try:
        opt.zero_grad()
        check(False, "zero_grad with pending allreduces was accepted")
    except AssertionError as err:
        check("zero_grad" in str(err), "zero_grad: %s" % err)
    opt.step()
    opt.zero_grad()

# ---- join: uneven inputs ------------------------------------------------------------------------
model = make_model(7)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
for step in range(rank + 1):  # rank r has r + 1 batches
    opt.zero_grad()
    model(torch.ones(2, 10) * (step + 1)).sum().backward()
    opt.step()
last = hvd.join()
check(last == size - 1, "join returned %d, not the last rank %d" % (last, size - 1))
hvd.barrier()

# ---- what hoop does not have says so ------------------------------------------------------------
for call, words in ((lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), "Adasum"),
                    (lambda: hvd.allreduce(torch.ones(2), process_set=object()),
                     "not a process set"),
                    (lambda: hvd.allreduce(torch.ones(2), process_set=hvd.ProcessSet([0])),
                     "not registered")):
    try:
        call()
        check(False, "%s was accepted" % words)
    except hvd.HoopError as err:
        check(words in str(err), "%r does not name %s" % (str(err), words))
try:
    hvd.broadcast(torch.ones(2), root_rank=size)
    check(False, "a broadcast from rank %d was accepted" % size)
except ValueError as err:
    check("root_rank" in str(err), "root_rank: %s" % err)
check(hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size, "calls after the refused ones")

print("hvd worker rank %d of %d: %d checks, %d failed" % (rank, size, checks, failures),
      flush=True)
hvd.shutdown()
sys.exit(1 if failures else 0)
