"""One rank of hoop.torch's failure cases (tests/test_torch.sh starts it under hooprun).

    fail_worker.py raise   the last rank raises ZeroDivisionError, uncaught, while the others run
                           hvd.allreduce in a loop: each of them must raise hoop.Aborted naming
                           that rank and the exception within 2 s
    fail_worker.py dist    the same under torch.distributed's backend "hoop" (dist.all_reduce)
    fail_worker.py model   rank 1's model has another shape: broadcast_parameters and
                           DistributedOptimizer must raise hoop.Mismatch on every rank, naming
                           the first difference and the ranks, within 5 s
    fail_worker.py kill    the last rank SIGKILLs itself mid-training: each other rank must raise
                           hoop.PeerLost (or Aborted) naming it
    fail_worker.py order   two DistributedOptimizers, rank 0 stepping them in the other order:
                           every rank must raise naming both buckets within 5 s

Each rank that sees what it must prints "PASS <mode>: ..."; anything else prints "FAIL".
"""

import os
import signal
import sys
import time

import torch

import hoop
import hoop.torch as hvd

mode = sys.argv[1]
# hooprun sends SIGTERM to the other ranks as soon as the culprit exits: the witnesses ignore it so
# that they report what they saw (SIGKILL follows 3 s later, long after the 2 s they have).
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "dist":
    import torch.distributed as dist
    dist.init_process_group("hoop")
    rank, size = dist.get_rank(), dist.get_world_size()
else:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
culprit = size - 1


def verdict(ok, what):
    print("%s %s: rank %d: %s" % ("PASS" if ok else "FAIL", mode, rank, what), flush=True)
    sys.exit(0 if ok else 1)


if mode in ("raise", "dist"):
    if mode == "dist":
        dist.barrier()
    else:
        hvd.barrier()
    start = time.monotonic()
    if rank == culprit:
        time.sleep(0.5)
        print(1 / 0)  # uncaught: this rank ends, and tells the others first
    try:
        while time.monotonic() - start < 30:
            t = torch.ones(1000)
            if mode == "dist":
                dist.all_reduce(t)
            else:
                hvd.allreduce(t)
        verdict(False, "no error within 30 s")
    except (hoop.HoopError, RuntimeError) as err:
        took = time.monotonic() - start - 0.5
        text = str(err)
        ok = ("aborted by rank %d" % culprit in text and "ZeroDivisionError" in text
              and took < 2.0)
        verdict(ok, "%s after %.2f s: %s" % (type(err).__name__, took, text))

elif mode == "model":
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6 if rank != 1 else 7), torch.nn.ReLU(),
                                torch.nn.Linear(6 if rank != 1 else 7, 2))
    start = time.monotonic()
    said = []
    try:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    except hoop.Mismatch as err:
        said.append(str(err))
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters())
    except hoop.Mismatch as err:
        said.append(str(err))
    took = time.monotonic() - start
    ok = (len(said) == 2 and took < 5.0
          and all("rank 0" in s and "rank 1" in s and ("'0.bias'" in s or "'0.weight'" in s)
                  for s in said))
    verdict(ok, "%.2f s: %s" % (took, " | ".join(said) or "no Mismatch raised"))

elif mode == "kill":
    model = torch.nn.Linear(100, 10)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    start = time.monotonic()
    try:
        for step in range(100000):
            if rank == culprit and step == 20:
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            model(torch.randn(16, 100)).sum().backward()
            opt.step()
        verdict(False, "no error")
    except (hoop.PeerLost, hoop.Aborted, hoop.Timeout) as err:
        text = str(err)
        verdict("rank %d" % culprit in text, "%s after %.2f s: %s"
                % (type(err).__name__, time.monotonic() - start, text))
elif mode == "order":
    # Two optimizers of models of one shape (a GAN's generator and discriminator), their
    # backward passes made in another order on rank 0: only the buckets' names tell the calls
    # apart, and without them hoop added one model's gradients to the other's.
    torch.manual_seed(0)
    models = {"gen": torch.nn.Linear(4, 4), "disc": torch.nn.Linear(4, 4)}
    opts = {k: hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                        named_parameters=[(k + "." + n, p)
                                                          for n, p in m.named_parameters()])
            for k, m in models.items()}
    order = ["gen", "disc"] if rank == 0 else ["disc", "gen"]
    hvd.barrier()
    start = time.monotonic()
    try:
        for k in order:
            opts[k].zero_grad()
            models[k](torch.ones(2, 4)).sum().backward()  # the hooks post the bucket
        for k in order:
            opts[k].step()
        verdict(False, "no error: the buckets were matched by their order")
    except Exception as err:  # noqa: BLE001 (raised in a hook: whatever autograd makes of it)
        took, text = time.monotonic() - start, str(err)
        named = '"allreduce.gen.bias+1"' in text and '"allreduce.disc.bias+1"' in text
        # A rank told by a peer whose last words TCP lost says so (as trust_worker.py allows).
        ok = took < 5.0 and (named or ("did not arrive" in text and rank != 0))
        verdict(ok, "%s after %.2f s: %s" % (type(err).__name__, took, text))
else:
    sys.exit("unknown mode %r" % mode)
