"""hoop.Communicator and hoop.Request: the collectives, point-to-point messages and
sub-communicators over libhoop's communicator."""

import ctypes
import os
import re
import weakref

from . import _hooks
from ._errors import _ERRORS, Failed, HoopError, InvalidArgument
from ._lib import (_DTYPE_SIZES, _NAME_SHOWN, _Buffer, _dtype_code, _lib, _name_tag,
                   _op_code)
from ._settings import Settings, _compress_code, _encrypt_value

# Communicators the program never finalized leave the job at exit, with a goodbye, rather than
# vanish (which the other ranks and hooprun would report as a lost rank): _hooks.finalize_at_exit.
_alive = weakref.WeakSet()

# ---- requests --------------------------------------------------------------------------------


class Request:
    """A posted collective. Its buffers belong to hoop until test() says done or wait() returns."""

    def __init__(self, comm, handle, keep, result):
        self._comm = comm
        self._handle = handle
        self._keep = keep  # the buffers, alive until completion
        self._result = result
        self._done = False

    def test(self):
        """True once complete (raising its error if it failed); False while it runs."""
        if self._done:
            return True
        done = ctypes.c_int(0)
        code = _lib.hoop_test(self._handle, ctypes.byref(done))
        if not done.value:
            self._comm._check(code)
            return False
        self._finish(code)
        return True

    def wait(self):
        """Block until complete; return the result buffer, or raise the collective's error."""
        if not self._done:
            self._finish(_lib.hoop_wait(self._handle))
        return self._result

    def _finish(self, code):
        self._done = True
        self._handle = None
        self._keep = None
        self._comm._outstanding.discard(self)
        self._comm._check(code)


# ---- the communicator ------------------------------------------------------------------------


class Communicator(Settings):
    """A joined job (hoop_init_from_env): started by hooprun, or alone as a job of one rank.
    reproducible: True or False sets the communicator's reproducible mode, compress its wire
    format between hosts (see the properties); None leaves them as HOOP_REPRODUCIBLE and
    HOOP_COMPRESS say. encrypt (True, False or a cipher's name) seals the job's TCP connections,
    which are made here: it sets HOOP_ENCRYPT in this process's environment first. The timeout,
    reproducible, compress, register and deregister members are Settings'."""

    def __init__(self, _handle=None, reproducible=None, compress=None, encrypt=None):
        handle = _handle
        if encrypt is not None:
            os.environ["HOOP_ENCRYPT"] = _encrypt_value(encrypt)
        self._encrypt = os.environ.get("HOOP_ENCRYPT", "0")
        if handle is None:
            handle = ctypes.c_void_p()
            code = _lib.hoop_init_from_env(ctypes.byref(handle))
            self._handle = handle
            self._outstanding = set()
            if code != 0:
                message = self._message(code)
                _lib.hoop_finalize(handle)
                self._handle = None
                raise _ERRORS.get(code, HoopError)(message, code)
        self._handle = handle
        self._outstanding = set()
        self._names = {}  # the tags of the calls' names (_name_tag), for error messages
        self._depth = 0  # splits between this communicator and the job's (finalized first)
        self.rank = _lib.hoop_rank(handle)
        self.size = _lib.hoop_size(handle)
        self.local_rank = _lib.hoop_local_rank(handle)
        self.local_size = _lib.hoop_local_size(handle)
        # Horovod's: among the ranks with this local rank (on equal hosts, the host's index).
        self.cross_rank = _lib.hoop_cross_rank(handle)
        self.cross_size = _lib.hoop_cross_size(handle)
        if reproducible is not None:
            self.reproducible = reproducible
        if compress is not None:
            self.compress = compress
        _alive.add(self)
        _hooks.install()  # the process has joined a job: hoop's exit and exception hooks

    def __enter__(self):
        return self

    def __exit__(self, kind, value, trace):
        if value is not None and self._handle is not None:
            self.abort("%s: %s" % (kind.__name__, value))
        self.finalize()

    def _message(self, code):
        text = _lib.hoop_last_error(self._handle) if self._handle else None
        text = text.decode(errors="replace") if text else ""
        names = getattr(self, "_names", None)
        if names and "name #" in text:
            # A peer's name that this rank had not used when the call failed, used since.
            text = re.sub(r"name #([0-9a-f]{8})", lambda m: 'name "%s"' % names[int(m.group(1), 16)]
                          if int(m.group(1), 16) in names else m.group(0), text)
        return text or _lib.hoop_strerror(code).decode()

    def _check(self, code):
        if code != 0:
            raise _ERRORS.get(code, HoopError)(self._message(code), code)

    def _live(self, call):
        if self._handle is None:
            raise Failed("%s: the communicator was finalized" % call, Failed.code)
        return self._handle

    # -- collectives --

    def allreduce(self, sendbuf, recvbuf=None, op="sum", dtype=None, name=None, compress=None):
        """recvbuf = op over ranks of sendbuf (in place without recvbuf); returns recvbuf.
        compress: this call's wire format between hosts ("int8"...; see the property)."""
        return self._allreduce("hoop_allreduce", sendbuf, recvbuf, op, dtype, False, name,
                               compress)

    def iallreduce(self, sendbuf, recvbuf=None, op="sum", dtype=None, name=None, compress=None):
        return self._allreduce("hoop_iallreduce", sendbuf, recvbuf, op, dtype, True, name,
                               compress)

    def _allreduce(self, call, sendbuf, recvbuf, op, dtype, nonblocking, name=None,
                   compress=None):
        handle = self._live(call)
        opcode = _op_code(op, call)
        out = sendbuf if recvbuf is None else recvbuf
        dst = _Buffer(out, dtype, call, True)
        src = dst if recvbuf is None else _Buffer(sendbuf, dtype, call, False)
        if src.dtype != dst.dtype or src.nbytes != dst.nbytes:
            raise InvalidArgument("%s: sendbuf and recvbuf differ in dtype or size" % call)
        args = (handle, src.address, dst.address, dst.count(call), dst.dtype, opcode)
        return self._run(call, args, (src, dst), out, nonblocking, name, compress)

    def allreduce_many(self, buffers, op="sum", dtype=None, name=None, compress=None):
        """Allreduce every buffer of the list in place, as one fused transfer (hoop_allreduce_many:
        Horovod's tensor fusion). The buffers share one dtype. Returns the list."""
        return self._allreduce_many("hoop_allreduce_many", buffers, op, dtype, False, name,
                                    compress)

    def iallreduce_many(self, buffers, op="sum", dtype=None, name=None, compress=None):
        return self._allreduce_many("hoop_iallreduce_many", buffers, op, dtype, True, name,
                                    compress)

    def _allreduce_many(self, call, buffers, op, dtype, nonblocking, name=None, compress=None):
        handle = self._live(call)
        opcode = _op_code(op, call)
        held = [_Buffer(b, dtype, call, True) for b in buffers]
        if len({b.dtype for b in held}) > 1:
            raise InvalidArgument("%s: the buffers differ in dtype" % call)
        n = len(held)
        ptrs = (ctypes.c_void_p * max(n, 1))(*[b.address for b in held])
        counts = (ctypes.c_size_t * max(n, 1))(*[b.count(call) for b in held])
        code = held[0].dtype if held else _dtype_code(dtype or "float32", call)
        args = (handle, n, ptrs, ptrs, counts, code, opcode)
        return self._run(call, args, (held, ptrs, counts), buffers, nonblocking, name, compress)

    def broadcast(self, buf, root=0, dtype=None, name=None):
        """Copy root's buf to every rank's buf; returns buf."""
        return self._broadcast("hoop_broadcast", buf, root, dtype, False, name)

    def ibroadcast(self, buf, root=0, dtype=None, name=None):
        return self._broadcast("hoop_ibroadcast", buf, root, dtype, True, name)

    def _broadcast(self, call, buf, root, dtype, nonblocking, name=None):
        handle = self._live(call)
        b = _Buffer(buf, dtype, call, True)
        return self._run(call, (handle, b.address, b.count(call), b.dtype, int(root)), (b,), buf,
                         nonblocking, name)

    def reduce(self, sendbuf, recvbuf=None, root=0, op="sum", dtype=None, name=None):
        """The root's recvbuf = op over ranks of sendbuf (recvbuf None elsewhere, or at the root
        for in place); returns recvbuf (sendbuf in place)."""
        return self._rooted("hoop_reduce", sendbuf, recvbuf, root, op, dtype, False, name)

    def ireduce(self, sendbuf, recvbuf=None, root=0, op="sum", dtype=None, name=None):
        return self._rooted("hoop_ireduce", sendbuf, recvbuf, root, op, dtype, True, name)

    def gather(self, sendbuf, recvbuf=None, root=0, dtype=None, name=None):
        """The root's recvbuf holds size blocks of sendbuf's size, rank r's in block r (recvbuf
        None on the other ranks). Returns recvbuf."""
        return self._rooted("hoop_gather", sendbuf, recvbuf, root, None, dtype, False, name)

    def igather(self, sendbuf, recvbuf=None, root=0, dtype=None, name=None):
        return self._rooted("hoop_igather", sendbuf, recvbuf, root, None, dtype, True, name)

    def scatter(self, sendbuf, recvbuf, root=0, dtype=None, name=None):
        """Block r of the root's sendbuf (size blocks of recvbuf's size; None elsewhere) to rank
        r's recvbuf. Returns recvbuf."""
        return self._rooted("hoop_scatter", sendbuf, recvbuf, root, None, dtype, False, name)

    def iscatter(self, sendbuf, recvbuf, root=0, dtype=None, name=None):
        return self._rooted("hoop_iscatter", sendbuf, recvbuf, root, None, dtype, True, name)

    def _rooted(self, call, sendbuf, recvbuf, root, op, dtype, nonblocking, name=None):
        handle = self._live(call)
        root = int(root)
        is_root = self.rank == root
        kind = call.split("_", 1)[1].lstrip("i")
        if kind == "reduce" and recvbuf is None and is_root:
            recvbuf = sendbuf  # in place
        src = _Buffer(sendbuf, dtype, call, False) if sendbuf is not None else None
        dst = _Buffer(recvbuf, dtype, call, True) if recvbuf is not None else None
        block = dst if kind == "scatter" else src
        if block is None:
            raise InvalidArgument("%s: %s is needed on every rank" %
                                  (call, "recvbuf" if kind == "scatter" else "sendbuf"))
        count = block.count(call)
        whole = (dst if kind == "gather" else src if kind == "scatter" else dst) if is_root else None
        if is_root and whole is None:
            raise InvalidArgument("%s: the root needs %s" % (call, "sendbuf" if kind == "scatter"
                                                             else "recvbuf"))
        factor = 1 if kind == "reduce" else self.size
        if whole is not None and (whole.dtype != block.dtype or
                                  whole.nbytes != block.nbytes * factor):
            raise InvalidArgument("%s: the root's buffer must hold %d times %d bytes of the same "
                                  "dtype, not %d" % (call, factor, block.nbytes, whole.nbytes))
        args = [handle, src.address if src else None, dst.address if dst else None, count,
                block.dtype]
        if kind == "reduce":
            args.append(_op_code(op, call))
        args.append(root)
        return self._run(call, tuple(args), (src, dst), recvbuf if recvbuf is not None else sendbuf,
                         nonblocking, name)

    def send(self, buf, peer, tag=0, dtype=None):
        """Send buf to rank peer (matched in order by its recv of the same size, dtype and tag)."""
        return self._p2p("hoop_send", buf, peer, tag, dtype, False, False)

    def recv(self, buf, peer, tag=0, dtype=None):
        """Receive into buf from rank peer; returns buf."""
        return self._p2p("hoop_recv", buf, peer, tag, dtype, True, False)

    def isend(self, buf, peer, tag=0, dtype=None):
        return self._p2p("hoop_isend", buf, peer, tag, dtype, False, True)

    def irecv(self, buf, peer, tag=0, dtype=None):
        return self._p2p("hoop_irecv", buf, peer, tag, dtype, True, True)

    def _p2p(self, call, buf, peer, tag, dtype, writable, nonblocking):
        handle = self._live(call)
        b = _Buffer(buf, dtype, call, writable)
        return self._run(call, (handle, b.address, b.count(call), b.dtype, int(peer), int(tag)),
                         (b,), buf, nonblocking)

    def allgather(self, sendbuf, recvbuf, dtype=None, name=None):
        """recvbuf holds size blocks: rank r's sendbuf lands in block r. Returns recvbuf."""
        return self._allgather("hoop_allgather", sendbuf, recvbuf, dtype, False, name)

    def iallgather(self, sendbuf, recvbuf, dtype=None, name=None):
        return self._allgather("hoop_iallgather", sendbuf, recvbuf, dtype, True, name)

    def _allgather(self, call, sendbuf, recvbuf, dtype, nonblocking, name=None):
        handle = self._live(call)
        dst = _Buffer(recvbuf, dtype, call, True)
        src = _Buffer(sendbuf, dtype, call, False)
        if src.dtype != dst.dtype or src.nbytes * self.size != dst.nbytes:
            raise InvalidArgument("%s: recvbuf must hold size (%d) times sendbuf's %d bytes of "
                                  "the same dtype, not %d" % (call, self.size, src.nbytes,
                                                              dst.nbytes))
        return self._run(call, (handle, src.address, dst.address, src.count(call), src.dtype),
                         (src, dst), recvbuf, nonblocking, name)

    def reduce_scatter(self, sendbuf, recvbuf, op="sum", dtype=None, name=None, compress=None):
        """recvbuf = this rank's block of op over ranks of sendbuf, which holds size blocks of
        recvbuf's size (block r to rank r). Returns recvbuf."""
        return self._reduce_scatter("hoop_reduce_scatter", sendbuf, recvbuf, op, dtype, False,
                                    name, compress)

    def ireduce_scatter(self, sendbuf, recvbuf, op="sum", dtype=None, name=None, compress=None):
        return self._reduce_scatter("hoop_ireduce_scatter", sendbuf, recvbuf, op, dtype, True,
                                    name, compress)

    def _reduce_scatter(self, call, sendbuf, recvbuf, op, dtype, nonblocking, name=None,
                        compress=None):
        handle = self._live(call)
        opcode = _op_code(op, call)
        dst = _Buffer(recvbuf, dtype, call, True)
        src = _Buffer(sendbuf, dtype, call, False)
        if src.dtype != dst.dtype or dst.nbytes * self.size != src.nbytes:
            raise InvalidArgument("%s: sendbuf must hold size (%d) times recvbuf's %d bytes of "
                                  "the same dtype, not %d" % (call, self.size, dst.nbytes,
                                                              src.nbytes))
        args = (handle, src.address, dst.address, dst.count(call), dst.dtype, opcode)
        return self._run(call, args, (src, dst), recvbuf, nonblocking, name, compress)

    def alltoall(self, sendbuf, recvbuf, dtype=None, name=None):
        """Block j of sendbuf (size equal blocks) to rank j; block i of recvbuf from rank i.
        Returns recvbuf."""
        return self._alltoall("hoop_alltoall", sendbuf, recvbuf, dtype, False, name)

    def ialltoall(self, sendbuf, recvbuf, dtype=None, name=None):
        return self._alltoall("hoop_ialltoall", sendbuf, recvbuf, dtype, True, name)

    def _alltoall(self, call, sendbuf, recvbuf, dtype, nonblocking, name=None):
        handle = self._live(call)
        dst = _Buffer(recvbuf, dtype, call, True)
        src = _Buffer(sendbuf, dtype, call, False)
        if src.dtype != dst.dtype or src.nbytes != dst.nbytes or src.nbytes % self.size:
            raise InvalidArgument("%s: sendbuf and recvbuf must be size (%d) equal blocks of one "
                                  "dtype (%d and %d bytes)" % (call, self.size, src.nbytes,
                                                               dst.nbytes))
        args = (handle, src.address, dst.address, src.count(call) // self.size, src.dtype)
        return self._run(call, args, (src, dst), recvbuf, nonblocking, name)

    def alltoallv(self, sendbuf, sendcounts, recvbuf, recvcounts, sdispls=None, rdispls=None,
                  dtype=None, name=None):
        """sendcounts[j] elements of sendbuf to rank j, recvcounts[i] elements from rank i into
        recvbuf; blocks one after the other unless displacements (in elements) say where.
        Returns recvbuf."""
        return self._alltoallv("hoop_alltoallv", sendbuf, sendcounts, recvbuf, recvcounts, sdispls,
                               rdispls, dtype, False, name)

    def ialltoallv(self, sendbuf, sendcounts, recvbuf, recvcounts, sdispls=None, rdispls=None,
                   dtype=None, name=None):
        return self._alltoallv("hoop_ialltoallv", sendbuf, sendcounts, recvbuf, recvcounts,
                               sdispls, rdispls, dtype, True, name)

    def _alltoallv(self, call, sendbuf, sendcounts, recvbuf, recvcounts, sdispls, rdispls, dtype,
                   nonblocking, name=None):
        handle = self._live(call)
        dst = _Buffer(recvbuf, dtype, call, True)
        src = _Buffer(sendbuf, dtype, call, False)
        if src.dtype != dst.dtype:
            raise InvalidArgument("%s: sendbuf and recvbuf differ in dtype" % call)
        arrays = []
        for name, values, displs, buf in (("sendcounts", sendcounts, sdispls, src),
                                          ("recvcounts", recvcounts, rdispls, dst)):
            values = [int(v) for v in values]
            if len(values) != self.size or min(values, default=0) < 0:
                raise InvalidArgument("%s: %s must hold %d counts of 0 or more"
                                      % (call, name, self.size))
            if displs is None:
                displs = [sum(values[:i]) for i in range(self.size)]
            displs = [int(d) for d in displs]
            if len(displs) != self.size or min(displs, default=0) < 0 or any(
                    (d + v) * _DTYPE_SIZES[buf.dtype] > buf.nbytes for d, v in zip(displs, values)):
                raise InvalidArgument("%s: the blocks of %s do not fit in its buffer"
                                      % (call, name))
            arrays += [(ctypes.c_size_t * self.size)(*values),
                       (ctypes.c_size_t * self.size)(*displs)]
        args = (handle, src.address, arrays[0], arrays[1], dst.address, arrays[2], arrays[3],
                src.dtype)
        return self._run(call, args, (src, dst, arrays), recvbuf, nonblocking, name)

    def barrier(self, name=None):
        self._run("hoop_barrier", (self._live("hoop_barrier"),), (), None, False, name)

    def ibarrier(self, name=None):
        return self._run("hoop_ibarrier", (self._live("hoop_ibarrier"),), (), None, True, name)

    def _run(self, call, args, keep, result, nonblocking, name=None, compress=None):
        """Call libhoop's call with args; name (every collective takes one, as Horovod's calls
        do) goes into the call's fingerprint (hoop_name_next): ranks whose calls at one position
        carry different names fail with Mismatch naming both, instead of mixing their data.
        compress: the call's wire format (hoop_compress_next), refused where it cannot apply."""
        code = _compress_code(compress, call)
        if name is not None:
            if not isinstance(name, str):
                raise TypeError("%s: name must be a str, not %s" % (call, type(name).__name__))
            # Named just before the call, on this thread: nothing else can take the name.
            data = name.encode("utf-8", "replace")
            _lib.hoop_name_next(args[0], data)
            self._names[_name_tag(data)] = name[:_NAME_SHOWN]
            if len(self._names) > 4096:
                del self._names[next(iter(self._names))]
        if code is not None:
            self._check(_lib.hoop_compress_next(args[0], code))
        if not nonblocking:
            self._check(getattr(_lib, call)(*args))
            return result
        req = ctypes.c_void_p()
        self._check(getattr(_lib, call)(*args, ctypes.byref(req)))
        request = Request(self, req, keep, result)
        self._outstanding.add(request)
        return request

    # -- the rest --

    # -- sub-communicators --

    def split(self, color, key=0):
        """Split this communicator as MPI_Comm_split (hoop_comm_split; every rank calls it): the
        ranks passing the same color (an int >= 0) form a new Communicator, ordered by key, then
        by rank here; color None stays out and gets None. The new one shares this job's
        connections and may run calls at the same time as this one from another thread; finalize
        it before the job's."""
        handle = ctypes.c_void_p()
        self._check(_lib.hoop_comm_split(self._live("hoop_comm_split"),
                                         SPLIT_NONE if color is None else int(color), int(key),
                                         ctypes.byref(handle)))
        if not handle.value:
            return None
        view = Communicator(_handle=handle)
        view._depth = self._depth + 1
        return view

    def create_group(self, ranks):
        """A Communicator of the listed ranks of this one, in that order (hoop_comm_create_group):
        only they call it, at the same point, as MPI_Comm_create_group (torch's new_group)."""
        ranks = [int(r) for r in ranks]
        handle = ctypes.c_void_p()
        array = (ctypes.c_int * max(len(ranks), 1))(*ranks)
        self._check(_lib.hoop_comm_create_group(self._live("hoop_comm_create_group"), array,
                                                len(ranks), ctypes.byref(handle)))
        group = Communicator(_handle=handle)
        group._depth = self._depth + 1
        return group

    # -- a job that loses ranks, or takes in newcomers --

    def _next_generation(self, call, fn):
        handle = ctypes.c_void_p()
        self._check(fn(self._live(call), ctypes.byref(handle)))
        successor = Communicator(_handle=handle)
        successor._depth = self._depth  # a sub-communicator's shrink gives one of the new job's
        return successor

    def shrink(self):
        """After a call failed because a rank was lost: a new Communicator of the ranks that
        survive, ranked in their old order (hoop_comm_shrink; every survivor calls it). This one
        stays failed: finalize it, then re-broadcast the program's state from the new rank 0.
        Shrink the job's communicator first, then each sub-communicator (split's) to keep."""
        return self._next_generation("shrink", _lib.hoop_comm_shrink)

    def grow(self):
        """Take in the newcomers that wait to join (hoop_comm_grow; every rank calls it at a point
        they agreed on): a new Communicator of these ranks, then the newcomers."""
        return self._next_generation("grow", _lib.hoop_comm_grow)

    def newcomers(self):
        """How many newcomers wait to join, as the rendezvous server last told this rank."""
        return _lib.hoop_comm_newcomers(self._live("newcomers"))

    def stats(self):
        """What this rank measured (hoop_comm_stats; hoop(3), "Finding the slow rank"): a dict of
        since_s, calls, bytes, in_calls_s, waited_s, wait_share, colls (per collective called:
        calls, bytes, time_s, waited_s), slowest_rank and slowest_late_s (None until the
        rendezvous server names one), late_calls, reporting, view_age_s, and peers: per rank of
        this communicator its late_median_s, late_p99_s and late_max_s (None where not known),
        waited_s, bytes_sent, bytes_received and goodput (bytes/s of its large messages here, None
        where none); slowest_link: (from, to, bytes/s) of the job's slowest link, or None."""
        from ._stats import comm_stats
        return comm_stats(self._live("stats"), self.size, self._check)

    @property
    def generation(self):
        """0 for the job as started, one more per shrink or growth."""
        return _lib.hoop_comm_generation(self._live("generation"))

    def abort(self, reason="aborted from Python"):
        """Fail this job on every rank with reason (callable from any thread)."""
        if self._handle is not None:
            _lib.hoop_abort(self._handle, str(reason).encode())

    def finalize(self):
        """Leave the job. Outstanding requests are waited for first (their errors ignored)."""
        if self._handle is None:
            return
        for request in list(self._outstanding):
            try:
                request.wait()
            except HoopError:
                pass
        code = _lib.hoop_finalize(self._handle)
        if code == 0:
            self._handle = None
        self._check(code)

    def last_error(self):
        return self._message(0) if self._handle else ""


# hoop_comm_split's color for a rank that stays out (Communicator.split takes None too).
SPLIT_NONE = -1
