"""The torch backend's encrypt option, for tests/test_encrypt.sh: the default group made with
ProcessGroupHoop.Options(encrypt=ENCRYPT) joins the job sealed (HOOP_ENCRYPT unset), an
all_reduce and a broadcast of bytes that spell a marker come out right, and a new_group asking
for another setting is refused, the job's connections being made. Prints "encrypt torch rank R:
right" and exits 0, or says what failed and exits 1. Usage: encrypt_torch.py ENCRYPT"""

import os
import sys

import torch
import torch.distributed as dist

from hoop.torch import ProcessGroupHoop

MARKER = b"hoop-plaintext-marker:"
os.environ.pop("HOOP_ENCRYPT", None)
dist.init_process_group("hoop", pg_options=ProcessGroupHoop.Options(encrypt=sys.argv[1]))
rank, size = dist.get_rank(), dist.get_world_size()
problems = []
t = torch.arange(300000, dtype=torch.float32) % 1024 / 1024 + rank
dist.all_reduce(t)
want = (torch.arange(300000, dtype=torch.float32) % 1024 / 1024) * size + sum(range(size))
if not torch.equal(t, want):
    problems.append("all_reduce")
text = torch.tensor(list((MARKER * 3000)[:65536]), dtype=torch.uint8)
if rank != 0:
    text.zero_()
dist.broadcast(text, src=0)
if bytes(text.tolist()) != (MARKER * 3000)[:65536]:
    problems.append("broadcast")
try:
    dist.new_group(list(range(size)), pg_options=ProcessGroupHoop.Options(encrypt=False))
    problems.append("a new_group asking for no encryption was made")
except ValueError as err:
    if "HOOP_ENCRYPT=%s" % sys.argv[1] not in str(err):
        problems.append("the refusal does not say what the job has: %s" % err)
dist.destroy_process_group()
if problems:
    print("encrypt torch rank %d: FAILED %s" % (rank, ", ".join(problems)), flush=True)
    sys.exit(1)
print("encrypt torch rank %d: right" % rank, flush=True)
