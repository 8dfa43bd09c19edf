"""One rank of the CUDA-tensor test (tests/test_cuda.sh starts it where torch has CUDA and libhoop
takes CUDA buffers): hoop.torch's allreduce, broadcast and allgather, and torch.distributed's
backend "hoop", on tensors on the GPU, every dtype and op, each against a reference computed on
the CPU; a DistributedOptimizer step on a model on the GPU against the same step on the CPU.
"""
import sys

import torch

import hoop
import hoop.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
checks = failures = 0


def check(ok, what):
    global checks, failures
    checks += 1
    if not ok:
        failures += 1
        print("rank %d FAIL: %s" % (rank, what), file=sys.stderr, flush=True)


if not hoop.cuda_supported() or not torch.cuda.is_available():
    print("cuda worker: no CUDA here (hoop %s, torch %s)"
          % (hoop.cuda_supported(), torch.cuda.is_available()))
    sys.exit(77)
device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
torch.cuda.set_device(device)

for dtype in (torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
              torch.float32, torch.float64):
    for op in (hvd.Sum, hvd.Min, hvd.Max, hvd.Product, hvd.Average):
        n = 1031
        every = [((torch.arange(n) * 3 + r * 7) % 5 - (0 if dtype == torch.uint8 else 2))
                 .to(dtype) for r in range(size)]
        if op == hvd.Product:
            every = [torch.tensor([1, 2, 1, 3, 1])[(torch.arange(n) + r) % 5].to(dtype)
                     for r in range(size)]
        stack = torch.stack([t.double() for t in every])
        want = {hvd.Sum: stack.sum(0), hvd.Min: stack.min(0).values, hvd.Max: stack.max(0).values,
                hvd.Product: stack.prod(0), hvd.Average: stack.sum(0) / size}[op]
        if op == hvd.Average and not dtype.is_floating_point:
            want = want.trunc()
        got = hvd.allreduce(every[rank].to(device), op=op)
        check(got.device == device and torch.allclose(got.double().cpu(), want, atol=1e-2),
              "allreduce %s %s on %s" % (dtype, op, device))
t = torch.full((33,), float(rank), device=device)
hvd.broadcast_(t, root_rank=size - 1)
check(torch.equal(t.cpu(), torch.full((33,), float(size - 1))), "broadcast_ on the GPU")
g = hvd.allgather(torch.full((rank + 1, 2), rank, device=device))
check(g.device == device and g[:, 0].tolist() == [r for r in range(size) for _ in range(r + 1)],
      "allgather on the GPU")

# DistributedOptimizer: the same step on the GPU and on the CPU.
torch.manual_seed(0)
cpu_model = torch.nn.Linear(16, 4)
gpu_model = torch.nn.Linear(16, 4).to(device)
gpu_model.load_state_dict(cpu_model.state_dict())
x = torch.randn(8, 16) + rank
for model, data in ((cpu_model, x), (gpu_model, x.to(device))):
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    opt.zero_grad()
    model(data).sum().backward()
    opt.step()
check(torch.allclose(gpu_model.weight.detach().cpu(), cpu_model.weight.detach(), atol=1e-6),
      "DistributedOptimizer on the GPU and on the CPU")

import torch.distributed as dist  # noqa: E402
dist.init_process_group("hoop")
t = torch.ones(5, device=device) * (rank + 1)
dist.all_reduce(t)
check(t.cpu().tolist() == [size * (size + 1) / 2.0] * 5, "dist.all_reduce on the GPU")
print("cuda worker rank %d of %d: %d checks, %d failed" % (rank, size, checks, failures),
      flush=True)
dist.destroy_process_group()
sys.exit(1 if failures else 0)
