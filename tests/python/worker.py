"""One rank of the Python package's test (tests/test_python.sh starts it under hooprun).

Every dtype and op through hoop.Communicator, at odd counts, in place and out of place, blocking
and non-blocking (posted together, completed in reverse order), broadcast from every root,
allgather, barrier; each result against a reference computed here in Python; and the errors:
bad arguments raise InvalidArgument with libhoop's message. Prints one summary line per rank.
"""

import struct
import sys

import hoop

comm = hoop.init()
rank, size = comm.rank, comm.size
checks = failures = 0

# struct codes; bfloat16 travels as its 16 bits (the top half of a float32).
CODES = {"int8": "b", "uint8": "B", "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q",
         "float16": "e", "bfloat16": "H", "float32": "f", "float64": "d", "int16": "h",
         "uint16": "H", "bool": "?"}
BITS = {"int8": 8, "uint8": 8, "int32": 32, "uint32": 32, "int64": 64, "uint64": 64}
FLOATS = ("float16", "bfloat16", "float32", "float64")
BITWISE = ("band", "bor", "bxor")


def refused(dtype, op):
    """What libhoop refuses: bitwise ops on float dtypes, and bool's average."""
    return (dtype in FLOATS and op in BITWISE) or (dtype == "bool" and op == "avg")


def fail(what):
    global failures
    failures += 1
    print("rank %d FAIL: %s" % (rank, what), file=sys.stderr)


def encode(dtype, values):
    code = CODES[dtype]
    if dtype == "bfloat16":
        values = [struct.unpack("<I", struct.pack("<f", v))[0] >> 16 for v in values]
    return bytearray(struct.pack("<%d%s" % (len(values), code), *values))


def decode(dtype, data):
    code = CODES[dtype]
    n = len(data) // struct.calcsize(code)
    values = list(struct.unpack("<%d%s" % (n, code), bytes(data)))
    if dtype == "bfloat16":
        values = [struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in values]
    return values


def value(dtype, op, r, i):
    """Rank r's element i: small, so that sums and products are exact in every dtype."""
    if dtype == "bool":
        return (r * 5 + i * 3) % 3 != 0
    if op in BITWISE:  # bits that differ across ranks, negative for the signed types
        return (r * 37 + i * 11) % 251 - (0 if dtype.startswith("uint") else 125)
    if op == "prod":
        pick = (1, 2, 1, 1, 3) if dtype.startswith("uint") else (1, 2, 1, -1, 1)
        v = pick[(r + i) % 5]
    elif dtype.startswith("uint"):
        v = (r * 7 + i * 3) % 5
    else:
        v = (r * 7 + i * 3) % 5 - 2
    return float(v) if dtype in FLOATS else v


def reference(dtype, op, i):
    vals = [value(dtype, op, r, i) for r in range(size)]
    if dtype == "bool":  # sum and max are or, prod and min and
        if op in ("sum", "max", "bor"):
            return any(vals)
        if op == "bxor":
            return sum(vals) % 2 == 1
        return all(vals)
    if op in BITWISE:
        out = vals[0]
        for v in vals[1:]:
            out = out & v if op == "band" else out | v if op == "bor" else out ^ v
        return out
    if op in ("sum", "avg"):
        total = sum(vals)
        if op == "avg":
            if dtype in FLOATS:
                return total / size
            return int(total / size)  # toward zero
        return total
    if op == "prod":
        out = 1
        for v in vals:
            out *= v
        return out
    return min(vals) if op == "min" else max(vals)


def close(dtype, got, want):
    if dtype in ("float16", "bfloat16"):
        return abs(got - want) <= 1e-2 * max(1.0, abs(want))
    if dtype in FLOATS:
        return abs(got - want) <= 1e-6 * max(1.0, abs(want))
    return got == want


def check_allreduce(dtype, op, count, in_place, blocking=True):
    global checks
    if refused(dtype, op):
        checks += 1
        try:
            comm.allreduce(bytearray(16), op=op, dtype=dtype)
            fail("allreduce %s %s did not raise" % (dtype, op))
        except hoop.InvalidArgument as err:
            if op not in str(err):
                fail("allreduce %s %s: the error does not name the op: %s" % (dtype, op, err))
        return None
    send = encode(dtype, [value(dtype, op, rank, i) for i in range(count)])
    recv = send if in_place else bytearray(len(send))
    if blocking:
        comm.allreduce(send, None if in_place else recv, op=op, dtype=dtype)
        return finish_allreduce(dtype, op, count, recv)
    req = comm.iallreduce(send, None if in_place else recv, op=op, dtype=dtype)
    return (req, dtype, op, count, recv)


def finish_allreduce(dtype, op, count, recv):
    global checks
    got = decode(dtype, recv)
    checks += 1
    for i in range(count):
        want = reference(dtype, op, i)
        if not close(dtype, got[i], want):
            fail("allreduce %s %s count %d element %d: got %r, expected %r"
                 % (dtype, op, count, i, got[i], want))
            return


counts = (0, 1, 7, 1031)
for dtype in CODES:
    for op in hoop.OPS:
        for count in counts:
            for in_place in (False, True):
                check_allreduce(dtype, op, count, in_place)

# Non-blocking: a batch posted at once, completed in reverse order (test loops and waits).
posted = []
for n, dtype in enumerate(CODES):
    for op in hoop.OPS:
        if not refused(dtype, op):
            posted.append(check_allreduce(dtype, op, 97 + n, n % 2 == 0, blocking=False))
for k, (req, dtype, op, count, recv) in enumerate(reversed(posted)):
    if k % 2:
        while not req.test():
            pass
    else:
        req.wait()
    finish_allreduce(dtype, op, count, recv)

# Broadcast from every root, blocking and not.
for root in range(size):
    for dtype in ("uint8", "float32", "bfloat16", "int64"):
        data = encode(dtype, [value(dtype, "sum", root, i) if rank == root else 0
                              for i in range(33)])
        if root % 2:
            comm.ibroadcast(data, root=root, dtype=dtype).wait()
        else:
            comm.broadcast(data, root=root, dtype=dtype)
        checks += 1
        want = [value(dtype, "sum", root, i) for i in range(33)]
        if decode(dtype, data) != want:
            fail("broadcast %s root %d: got %r" % (dtype, root, decode(dtype, data)[:5]))

# Allgather, blocking and not.
for dtype in ("int8", "float64", "float16"):
    mine = encode(dtype, [value(dtype, "sum", rank, i) for i in range(5)])
    every = bytearray(len(mine) * size)
    comm.allgather(mine, every, dtype=dtype)
    other = bytearray(len(mine) * size)
    comm.iallgather(bytes(mine), other, dtype=dtype).wait()  # a read-only sendbuf
    want = [value(dtype, "sum", r, i) for r in range(size) for i in range(5)]
    for name, data in (("allgather", every), ("iallgather", other)):
        checks += 1
        if decode(dtype, data) != want:
            fail("%s %s: got %r" % (name, dtype, decode(dtype, data)[:8]))

# Reduce-scatter: rank r gets block r of the sum over ranks; alltoall(v): blocks by rank.
for dtype, op in (("float32", "sum"), ("int32", "max"), ("bfloat16", "avg")):
    block = 6
    data = encode(dtype, [value(dtype, op, rank, i) for i in range(block * size)])
    got = bytearray(len(data) // size)
    comm.reduce_scatter(data, got, op=op, dtype=dtype)
    other = bytearray(len(got))
    comm.ireduce_scatter(bytes(data), other, op=op, dtype=dtype).wait()
    for name, out in (("reduce_scatter", got), ("ireduce_scatter", other)):
        checks += 1
        values = decode(dtype, out)
        for i in range(block):
            want = reference(dtype, op, rank * block + i)
            if not close(dtype, values[i], want):
                fail("%s %s %s element %d: got %r, expected %r"
                     % (name, dtype, op, i, values[i], want))
                break
mine = encode("int32", [rank * 1000 + j for j in range(3 * size)])
got = bytearray(len(mine))
comm.alltoall(mine, got, dtype="int32")
checks += 1
if decode("int32", got) != [r * 1000 + rank * 3 + i for r in range(size) for i in range(3)]:
    fail("alltoall: got %r" % decode("int32", got)[:9])
sendcounts = [(rank + j) % 3 for j in range(size)]
recvcounts = [(i + rank) % 3 for i in range(size)]
mine = encode("int64", [rank * 100 + j * 10 + k for j in range(size) for k in range(sendcounts[j])])
got = bytearray(8 * sum(recvcounts))
comm.ialltoallv(mine, sendcounts, got, recvcounts, dtype="int64").wait()
checks += 1
want = [i * 100 + rank * 10 + k for i in range(size) for k in range(recvcounts[i])]
if decode("int64", got) != want:
    fail("alltoallv: got %r, expected %r" % (decode("int64", got), want))

# Reduce, gather, scatter at every root.
for root in range(size):
    mine = encode("int32", [rank * 10 + i for i in range(4)])
    out = bytearray(len(mine)) if rank == root else None
    comm.reduce(mine, out, root=root, op="sum", dtype="int32")
    if rank == root:
        checks += 1
        want = [sum(r * 10 + i for r in range(size)) for i in range(4)]
        if decode("int32", out) != want:
            fail("reduce root %d: got %r, expected %r" % (root, decode("int32", out), want))
    every = bytearray(len(mine) * size) if rank == root else None
    comm.igather(bytes(mine), every, root=root, dtype="int32").wait()
    if rank == root:
        checks += 1
        want = [r * 10 + i for r in range(size) for i in range(4)]
        if decode("int32", every) != want:
            fail("gather root %d: got %r" % (root, decode("int32", every)))
    blocks = encode("float64", [r * 1.5 + i for r in range(size) for i in range(3)]) \
        if rank == root else None
    got = bytearray(24)
    comm.scatter(blocks, got, root=root, dtype="float64")
    checks += 1
    if decode("float64", got) != [rank * 1.5 + i for i in range(3)]:
        fail("scatter root %d: got %r" % (root, decode("float64", got)))

# Point-to-point: a ring shift posted both ways at once, then a blocking ping-pong of ranks 0, 1.
if size > 1:
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    out = encode("float64", [rank * 10.0 + i for i in range(7)])
    got = bytearray(len(out))
    reqs = [comm.irecv(got, prv, tag=3, dtype="float64"),
            comm.isend(bytes(out), nxt, tag=3, dtype="float64")]
    for req in reversed(reqs):
        req.wait()
    checks += 1
    if decode("float64", got) != [prv * 10.0 + i for i in range(7)]:
        fail("isend/irecv ring: got %r" % decode("float64", got))
    if rank < 2:
        ping = encode("int32", [rank + 1] * 5)
        pong = bytearray(len(ping))
        if rank == 0:
            comm.send(ping, 1, dtype="int32")
            comm.recv(pong, 1, dtype="int32")
        else:
            comm.recv(pong, 0, dtype="int32")
            comm.send(ping, 0, dtype="int32")
        checks += 1
        if decode("int32", pong) != [2 - rank] * 5:
            fail("send/recv: got %r" % decode("int32", pong))

comm.barrier()
comm.ibarrier().wait()

# Errors raise the class of their code, with libhoop's message; nothing is lost.
errors = [
    (lambda: comm.allreduce(bytearray(8), op="median", dtype="float32"), hoop.InvalidArgument,
     "unknown op"),
    (lambda: comm.broadcast(bytearray(4), root=size, dtype="int32"), hoop.InvalidArgument, "root"),
    (lambda: comm.allgather(bytearray(4), bytearray(4 * size + 1), dtype="uint8"),
     hoop.InvalidArgument, "recvbuf"),
    (lambda: comm.allreduce(b"abcd", dtype="uint8"), hoop.InvalidArgument, "read-only"),
    (lambda: comm.allreduce(object()), hoop.InvalidArgument, "buffer protocol"),
    (lambda: comm.reduce_scatter(bytearray(8 * size + 4), bytearray(8), dtype="float32"),
     hoop.InvalidArgument, "sendbuf must hold"),
    (lambda: comm.alltoallv(bytearray(4), [2] * size, bytearray(4), [2] * size, dtype="int32"),
     hoop.InvalidArgument, "do not fit"),
    (lambda: comm.send(bytearray(4), rank, dtype="int32"), hoop.InvalidArgument, "this rank"),
    (lambda: comm.recv(bytearray(4), size, dtype="int32"), hoop.InvalidArgument, "not a rank"),
]
for call, cls, words in errors:
    checks += 1
    try:
        call()
        fail("expected %s (%s)" % (cls.__name__, words))
    except cls as err:
        if words not in str(err):
            fail("%s: %r does not say %r" % (cls.__name__, str(err), words))
# The communicator still works after them.
data = encode("int32", [rank])
comm.allreduce(data, dtype="int32")
checks += 1
if decode("int32", data) != [size * (size - 1) // 2]:
    fail("allreduce after the refused calls: %r" % decode("int32", data))

# Sub-communicators: even and odd ranks (keys reversing the order), the last rank left out of a
# second split; each checked with an allreduce of the members' ranks.
if size > 1:
    half = comm.split(rank % 2, key=-rank)
    members = [r for r in range(size) if r % 2 == rank % 2]
    checks += 1
    if half.size != len(members) or half.rank != len(members) - 1 - members.index(rank):
        fail("split: rank %d of %d in its half, want %d of %d"
             % (half.rank, half.size, len(members) - 1 - members.index(rank), len(members)))
    data = encode("int64", [rank, 1])
    half.allreduce(data, dtype="int64")
    checks += 1
    if decode("int64", data) != [sum(members), len(members)]:
        fail("allreduce on a half: %r" % decode("int64", data))
    rest = comm.split(None if rank == size - 1 else 0)
    checks += 1
    if (rest is None) != (rank == size - 1) or (rest is not None and rest.size != size - 1):
        fail("split with None: %r" % rest)
    # The job's communicator refuses to finalize while its sub-communicators live.
    try:
        comm.finalize()
        fail("finalize with sub-communicators alive was accepted")
    except hoop.InvalidArgument as err:
        checks += 1
        if "sub-communicator" not in str(err):
            fail("finalize with sub-communicators alive: %s" % err)
    if rest is not None:
        rest.finalize()
    half.finalize()
    # The odd ranks alone, the last first (create_group: the even ones take no part).
    if rank % 2 == 1:
        odd = [r for r in range(size) if r % 2 == 1][::-1]
        group = comm.create_group(odd)
        data = encode("int64", [rank])
        group.allreduce(data, dtype="int64")
        checks += 1
        if group.rank != odd.index(rank) or decode("int64", data) != [sum(odd)]:
            fail("create_group: rank %d, allreduce %r" % (group.rank, decode("int64", data)))
        group.finalize()

# CPU torch tensors, where torch is installed (Debian's python3-torch): every dtype torch and hoop
# share, in place and not, blocking and not; a view that is not contiguous is refused.
try:
    import torch
except ImportError:
    torch = None
    if rank == 0:
        print("python worker: no torch here, its cases skipped")
if torch is not None:
    for dt in (torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
               torch.float32, torch.float64):
        t = torch.arange(11, dtype=dt) + rank
        want = (torch.arange(11, dtype=torch.float64) * size + size * (size - 1) // 2).to(dt)
        comm.allreduce(t)
        checks += 1
        if not torch.equal(t, want):
            fail("torch allreduce %s: %s" % (dt, t.tolist()))
        out = torch.empty_like(t)
        comm.iallreduce(torch.arange(11, dtype=dt) + rank, out, op="max").wait()
        checks += 1
        if not torch.equal(out, (torch.arange(11, dtype=torch.float64) + size - 1).to(dt)):
            fail("torch iallreduce max %s: %s" % (dt, out.tolist()))
    b = torch.full((6,), float(rank))
    comm.broadcast(b, root=size - 1)
    g = torch.empty(3 * size, dtype=torch.int32)
    comm.allgather(torch.full((3,), rank, dtype=torch.int32), g)
    checks += 2
    if b.tolist() != [float(size - 1)] * 6:
        fail("torch broadcast: %s" % b.tolist())
    if g.tolist() != [r for r in range(size) for _ in range(3)]:
        fail("torch allgather: %s" % g.tolist())
    checks += 1
    try:
        comm.allreduce(torch.zeros(8)[::2])
        fail("a tensor that is not contiguous was accepted")
    except hoop.InvalidArgument as err:
        if "contiguous" not in str(err):
            fail("non-contiguous tensor: %s" % err)

print("python worker rank %d of %d: %d checks, %d failed (libhoop %s)"
      % (rank, size, checks, failures, hoop.library_version()))
comm.finalize()
sys.exit(1 if failures else 0)
