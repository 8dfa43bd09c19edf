"""shm_backlog.py PID READY - fill the queue of the shared-memory listener of the rank with that
pid (connections it has not accepted), as another process of the job's user could, then create
the file READY and hold the connections for 20 s. Prints how many it made."""
import socket
import sys

from shm_listener import listener_of
import time

pid, ready = sys.argv[1], sys.argv[2]
name = listener_of(pid)
if not name:
    sys.exit("shm_backlog: no listener of pid %s" % pid)
held = []
while len(held) < 4096:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect("\0" + name)
    except BlockingIOError:
        s.close()
        break
    held.append(s)
print("shm_backlog: %d connections queued, the next refused" % len(held), flush=True)
open(ready, "w").close()
time.sleep(20)
