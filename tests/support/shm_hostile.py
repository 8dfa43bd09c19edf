"""shm_hostile.py PID - connect to the shared-memory listener of the rank with that pid eight times,
each time sending a few bytes with 2, 3, 20, ... descriptors of /dev/null (more than a hello
carries, and more than its control buffer holds), then closing: the rank must refuse each and close
every descriptor it received."""
import array
import os
import socket
import sys

from shm_listener import listener_of

pid = sys.argv[1]
name = listener_of(pid)
if not name:
    sys.exit("shm_hostile: no listener of pid %s" % pid)
sent = 0
for count in (2, 3, 20, 2, 3, 20, 5, 8):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + name)
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(count)]
    s.sendmsg([b"x" * 8], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
    for fd in fds:
        os.close(fd)
    s.close()
    sent += count
print("shm_hostile: sent %d descriptors in 8 connections" % sent)
