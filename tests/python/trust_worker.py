"""One rank of hoop.torch's trust and naming cases, on 3 ranks (tests/test_torch.sh starts it under
hooprun, over shared memory and over TCP). Each case ends with a barrier; each rank prints
"PASS <case>" or "FAIL <case>: why", and "trust worker: N cases, M failed" at the end.

    plain      values of every kind hoop.torch sends without pickle (tensors of every dtype, NaN,
               infinities, bytes, tuples, dicts with int keys, nesting) arrive bit for bit through
               its broadcast and allgather; ObjectState refuses an attribute that is no such
               value, naming it; bytes that are no value fail naming the rank
    allgather  rank 2, a member turned attacker, answers hvd.allgather's shape exchange with a
               pickle that would run a command when unpickled: ranks 0 and 1 raise
               hoop.ProtocolError naming rank 2, and the command never runs
    params     the same against broadcast_parameters' check that the models agree
    optimizer  rank 0, the root, sends such a pickle as broadcast_optimizer_state's state
    sync       rank 0 sends it as hvd.elastic.ObjectState.sync's attributes
    names      Horovod's named calls posted in another order: rank 0 posts allreduce_async of
               "grad.a" then "grad.b", ranks 1 and 2 the other order, same shapes: every rank
               raises hoop.Mismatch naming both names, where hoop matched by order and mixed the
               two tensors before; the same calls in the same order give the right sums

The payload is checked to be live first: unpickled here, it runs its command (the proof file).
"""

import math
import os
import pickle
import sys

import torch

import hoop
import hoop.torch as hvd
from hoop.torch import _plain
from hoop.torch._params import _check_same, _optimizer_entries

hvd.init()
rank, size = hvd.rank(), hvd.size()
comm = hvd._job._live("trust_worker")
assert size == 3, "trust_worker.py runs on 3 ranks"
work = sys.argv[1]
failed = []


class _Evil:
    """Unpickled, runs `touch path`."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, ("touch %s" % self.path,))


def payload(tag):
    return pickle.dumps(_Evil(os.path.join(work, "ran-%s-on-%d" % (tag, rank))), protocol=2)


def ran(tag):
    """Whether any rank's copy of the payload ran (the files it would have made)."""
    return [f for f in os.listdir(work) if f.startswith("ran-%s-" % tag)]


def report(case, ok, why=""):
    print("%s %s: rank %d%s" % ("PASS" if ok else "FAIL", case, rank, (": " + why) if why else ""),
          flush=True)
    if not ok:
        failed.append(case)
    hvd.barrier()


def expect_refusal(case, attacker, call):
    """Run call (the honest ranks' side); it must raise ProtocolError naming the attacker, and
    no payload may have run."""
    try:
        call()
    except hoop.ProtocolError as err:
        ok = ("rank %d" % attacker) in str(err) and not ran(case)
        return report(case, ok, "%s%s" % (err, "; the payload ran" if ran(case) else ""))
    except Exception as err:  # noqa: BLE001 - the case reports whatever else happened
        return report(case, False, "%s: %s" % (type(err).__name__, err))
    report(case, False, "no error")


# The payload is live: unpickling it runs its command.
proof = os.path.join(work, "proof-%d" % rank)
pickle.loads(pickle.dumps(_Evil(proof), protocol=2))
if not os.path.exists(proof):
    report("payload", False, "the payload did not run when unpickled: the cases prove nothing")

# ---- plain ------------------------------------------------------------------------------------
dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
          torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool]
gen = torch.Generator().manual_seed(7 + rank)
tensors = [(torch.randn(3, 5, generator=gen) * 1e3).to(d) for d in dtypes]
value = {0: {"step": 11 + rank, "exp_avg": tensors, "none": None},
         "lr": 1e-3 / 3, "betas": (0.9, 0.999), "flags": [True, False], "nan": math.nan,
         "inf": (-math.inf, math.inf), "raw": bytes(range(256)), "text": "grad.\u00e9\n",
         "empty": torch.empty(0, 4), "scalar": torch.tensor(2.5, dtype=torch.float64),
         "big": 2 ** 70 + rank, "deep": [[[[("x", rank)]]]]}


def same(a, b):
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and
                torch.equal(a.reshape(-1).view(torch.uint8) if a.numel() else a,
                            b.reshape(-1).view(torch.uint8) if b.numel() else b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b) and
                all(same(a[k], b[k]) for k in a))
    return type(a) is type(b) and a == b


def values_of(r):
    g = torch.Generator().manual_seed(7 + r)
    t = [(torch.randn(3, 5, generator=g) * 1e3).to(d) for d in dtypes]
    v = dict(value)
    v[0] = {"step": 11 + r, "exp_avg": t, "none": None}
    v["big"], v["deep"] = 2 ** 70 + r, [[[[("x", r)]]]]
    return v


try:
    got = _plain.broadcast(value if rank == 1 else None, 1, comm, "test")
    every = _plain.allgather(value, comm, "test")
    ok = same(got, values_of(1)) and all(same(every[r], values_of(r)) for r in range(size))
    why = "" if ok else "a value came back changed"
    try:
        hvd.elastic.ObjectState(thing=object()).sync()
        ok, why = False, "ObjectState synced an object() without pickle"
    except TypeError as err:
        ok = ok and "ObjectState.sync" in str(err) and (
            "type object" in str(err) if rank == 0 else "rank 0 could not send" in str(err))
        why = why or str(err)
    try:
        _plain.decode(b"hoopval1" + (5).to_bytes(8, "big") + b'{"x":', "test", 2)
        ok, why = False, "a broken header decoded"
    except hoop.ProtocolError as err:
        ok = ok and "rank 2" in str(err)
    report("plain", ok, why)
except Exception as err:  # noqa: BLE001
    report("plain", False, "%s: %s" % (type(err).__name__, err))

# ---- allgather: rank 2 answers the shape exchange with a pickle -------------------------------
if rank == 2:
    evil = bytearray(payload("allgather").ljust(8 * 35, b"."))
    comm.allgather(torch.frombuffer(evil, dtype=torch.int64), torch.empty(35 * size,
                                                                          dtype=torch.int64))
    report("allgather", True, "attacker")
else:
    expect_refusal("allgather", 2, lambda: hvd.allgather(torch.arange(6.0).reshape(3, 2)))

# ---- params: rank 2 answers the models' check with a pickle -----------------------------------
model = torch.nn.Linear(4, 3)
if rank == 2:
    every = torch.empty(32 * size, dtype=torch.uint8)
    comm.allgather(torch.zeros(32, dtype=torch.uint8), every)  # a digest that differs
    evil = payload("params")
    lengths = torch.empty(size, dtype=torch.int64)
    comm.allgather(torch.tensor([len(evil)], dtype=torch.int64), lengths)
    widest = int(lengths.max())
    comm.allgather(bytearray(evil.ljust(widest, b".")), bytearray(widest * size), dtype="uint8")
    report("params", True, "attacker")
else:
    expect_refusal("params", 2, lambda: hvd.broadcast_parameters(model.state_dict(), 0))

# ---- optimizer and sync: rank 0, the root, sends a pickle as the state ------------------------
def root_sends(tag):
    evil = payload(tag)
    comm.broadcast(torch.tensor([len(evil)], dtype=torch.int64), root=0)
    comm.broadcast(bytearray(evil), root=0, dtype="uint8")


optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
if rank == 0:
    _check_same(_optimizer_entries(optimizer), comm, "attacker")  # agrees, honestly
    root_sends("optimizer")
    report("optimizer", True, "attacker")
else:
    expect_refusal("optimizer", 0, lambda: hvd.broadcast_optimizer_state(optimizer, 0))

if rank == 0:
    root_sends("sync")
    report("sync", True, "attacker")
else:
    expect_refusal("sync", 0, lambda: hvd.elastic.ObjectState(epoch=3, batch=4).sync())

# ---- names -------------------------------------------------------------------------------------
a = torch.full((3,), 1.0 + rank)          # sums 6
b = torch.full((3,), 100.0 + rank)        # sums 303
# Named, in the same order everywhere: the right sums.
outs = [hvd.synchronize(h) for h in [hvd.allreduce_async(a, name="grad.a", op=hvd.Sum),
                                     hvd.allreduce_async(b, name="grad.b", op=hvd.Sum)]]
in_order = (torch.equal(outs[0], torch.full((3,), 6.0)) and
            torch.equal(outs[1], torch.full((3,), 303.0)))
print("%s names-in-order: rank %d: sums %s" % ("PASS" if in_order else "FAIL", rank,
                                                [o.tolist() for o in outs]), flush=True)
if not in_order:
    failed.append("names-in-order")
# Named, in another order on rank 0: a mismatch on every rank, naming both (the communicator is
# failed after it: this case comes last). The barrier between the cases is inside the try: a rank
# may still be finishing it (waiting for a peer's last word) when the ranks that left it find the
# mismatch and fail the communicator, and then the barrier itself fails with the mismatch.
order = [("grad.a", a), ("grad.b", b)] if rank == 0 else [("grad.b", b), ("grad.a", a)]
ok, why = True, ""
try:
    hvd.barrier()
    handles = [hvd.allreduce_async(t, name=n, op=hvd.Sum) for n, t in order]
except (hoop.Mismatch, hoop.Failed) as err:
    handles = []
    ok = '"grad.a"' in str(err) and '"grad.b"' in str(err)
    why = "before posting: %s" % err
for h in handles:
    try:
        hvd.synchronize(h)
        ok, why = False, "a reordered call completed"
    except (hoop.Mismatch, hoop.Failed) as err:
        # The first fails as a mismatch (or refused, a peer's notice having come first); the
        # second is refused, the communicator having failed.
        # A rank told of the failure by a peer whose connection was reset as it closed may
        # have lost the peer's words (TCP), and says so; tests/test_torch.sh wants the names on
        # at least one rank.
        ok = ok and ('"grad.a"' in str(err) and '"grad.b"' in str(err) or
                     "did not arrive" in str(err))
        why = why or str(err)
    except Exception as err:  # noqa: BLE001
        ok, why = False, "%s: %s" % (type(err).__name__, err)
        break
print("%s names: rank %d: %s" % ("PASS" if ok else "FAIL", rank, why), flush=True)
if not ok:
    failed.append("names")

print("trust worker: %d cases, %d failed%s" % (7, len(failed),
                                               (" (" + ", ".join(failed) + ")") if failed else ""),
      flush=True)
sys.exit(1 if failed else 0)
