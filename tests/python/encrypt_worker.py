"""HOOP_ENCRYPT from Python, for tests/test_encrypt.sh. Rounds of a float32 allreduce of 300,000
elements and a broadcast of bytes that spell a marker, each result checked against one computed
here. Prints "encrypt worker rank R: N rounds right" and exits 0; a call that fails prints "encrypt
worker rank R: round K failed: MESSAGE" and exits 3; a wrong result prints "WRONG" and exits 4.
Usage: encrypt_worker.py ROUNDS; PY_ENCRYPT, when set, is given to hoop.Communicator(encrypt=)."""

import array
import os
import sys

import hoop

MARKER = b"hoop-plaintext-marker:"
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
comm = hoop.Communicator(encrypt=os.environ.get("PY_ENCRYPT") or None)
rank, size = comm.rank, comm.size
n = 300000
for k in range(rounds):
    try:
        # Sums whose float32 rounding depends on nothing but the values: each rank's part is a
        # multiple of 2^-10 below 2^10, so every partial sum is exact.
        buf = array.array("f", [((i * 7 + rank * 13 + k) % 1024) / 1024.0 for i in range(n)])
        comm.allreduce(buf)
        want = [sum(((i * 7 + r * 13 + k) % 1024) / 1024.0 for r in range(size)) for i in range(0, n, 997)]
        if [buf[i] for i in range(0, n, 997)] != want:
            print("encrypt worker rank %d: WRONG allreduce in round %d" % (rank, k), flush=True)
            sys.exit(4)
        text = bytearray((MARKER * 3000)[:65536]) if rank == 0 else bytearray(65536)
        comm.broadcast(text, root=0)
        if bytes(text) != (MARKER * 3000)[:65536]:
            print("encrypt worker rank %d: WRONG broadcast in round %d" % (rank, k), flush=True)
            sys.exit(4)
    except hoop.HoopError as err:
        print("encrypt worker rank %d: round %d failed: %s" % (rank, k, err), flush=True)
        sys.exit(3)
print("encrypt worker rank %d: %d rounds right" % (rank, rounds), flush=True)
comm.finalize()
