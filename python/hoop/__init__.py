"""hoop: collective communication for data-parallel training, in Python.

Pure Python over libhoop (ctypes): nothing here is compiled, so the package works with any Python 3
that can load the library. Start the ranks with hooprun (``hooprun -np 4 /usr/bin/python3 prog.py``)
and join the job with ``hoop.init()``::

    import array, hoop
    comm = hoop.init()
    grads = array.array("f", [1.0, 2.0])
    comm.allreduce(grads, op="sum")          # in place
    req = comm.iallreduce(grads, op="avg")   # non-blocking; req.wait() later
    comm.finalize()

Buffers are objects with the buffer protocol (array.array, bytearray, memoryview, numpy arrays),
contiguous, or contiguous torch tensors on the CPU or, where libhoop takes CUDA buffers
(hoop.cuda_supported()), on a GPU. Every failure raises a subclass of HoopError
carrying libhoop's message, one class per result code.
"""
from ._comm import SPLIT_NONE, Communicator, Request  # noqa: F401
from ._errors import (Aborted, AuthError, Failed, HoopError, InvalidArgument,  # noqa: F401
                      Mismatch, PeerLost, ProtocolError, SystemFailure, Timeout, Unsupported)
from ._lib import DTYPES, OPS, cuda_supported, library_version  # noqa: F401

__all__ = [
    "Communicator", "Request", "init", "HoopError", "InvalidArgument", "Timeout", "PeerLost",
    "AuthError", "SystemFailure", "Unsupported", "Aborted", "Mismatch", "ProtocolError",
    "Failed", "DTYPES", "OPS", "library_version", "cuda_supported",
]


def init():
    """Join the job hooprun (or torchrun, Slurm, mpirun) started: a Communicator."""
    return Communicator()


_shared = None


def _shared_comm(encrypt=None):
    """The one Communicator hoop.torch's Horovod API and its torch.distributed backend share, so
    that a program using both joins the job once (encrypt: Communicator's, when it joins here)."""
    global _shared
    if _shared is None or _shared._handle is None:
        _shared = Communicator(encrypt=encrypt)
    return _shared
