"""What a program sets on a hoop.Communicator after it is made (hoop_comm_set_*): its timeout,
reproducible mode and wire format between hosts; and the registration of buffers."""

import ctypes

from ._errors import InvalidArgument
from ._lib import _Buffer, _lib


def _compress_code(value, call):
    """libhoop's format for a name ("int8", "int8+feedback", "none"...), or None for None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError("%s: compress must be a format name such as 'int8', not %s"
                        % (call, type(value).__name__))
    if isinstance(value, int):
        return value
    code = ctypes.c_int(0)
    if _lib.hoop_compress_from_name(value.encode(), ctypes.byref(code)) != 0:
        raise InvalidArgument("%s: compress %r is not none, bf16, fp8 or int8 (with +stochastic, "
                              "+feedback)" % (call, value), InvalidArgument.code)
    return code.value


def _encrypt_value(value):
    """HOOP_ENCRYPT's value for Communicator(encrypt=...): True "1" (the CPU's best cipher),
    False "0", or a cipher's name."""
    if value is True or value is False:
        return "1" if value else "0"
    if value in ("0", "1", "aes256gcm", "chacha20poly1305"):
        return value
    raise ValueError("hoop.Communicator: encrypt must be True, False, 'aes256gcm' or "
                     "'chacha20poly1305', not %r" % (value,))


def _compress_name(code):
    buf = ctypes.create_string_buffer(48)
    name = _lib.hoop_compress_name(code, buf, len(buf))
    return name.decode() if name else str(code)


class Settings:
    """The settings a Communicator shares with its sub-communicators made afterwards."""

    @property
    def encrypt(self):
        """HOOP_ENCRYPT's value when the job was joined ("0", "1" or a cipher's name): what seals
        its TCP connections, which are made then (read only)."""
        return self._encrypt

    @property
    def timeout(self):
        """Seconds a call waits with nothing moving before it raises Timeout naming the rank it
        waits for (hoop_comm_set_timeout): HOOP_TIMEOUT's until set. Setting it applies from the
        next call on, and to the sub-communicators split from this one afterwards."""
        return _lib.hoop_comm_timeout(self._live("timeout"))

    @timeout.setter
    def timeout(self, seconds):
        self._check(_lib.hoop_comm_set_timeout(self._live("timeout"), float(seconds)))

    @property
    def reproducible(self):
        """Whether reducing calls return bits that depend only on their inputs and the rank count
        (hoop_comm_set_reproducible; hoop(3), "Reproducible reductions"): every element combined
        over one fixed tree of the ranks, whatever the algorithm, transport, hosts, chunks, fusion
        or buffer kind. Set it alike on every rank; it applies from the next call on, and to the
        sub-communicators split from this one afterwards. HOOP_REPRODUCIBLE's until set."""
        return bool(_lib.hoop_comm_reproducible(self._live("reproducible")))

    @reproducible.setter
    def reproducible(self, on):
        self._check(_lib.hoop_comm_set_reproducible(self._live("reproducible"), 1 if on else 0))

    @property
    def compress(self):
        """The wire format of float sums and averages between hosts (hoop_comm_set_compress;
        hoop(3), "Slow links"): "none", "bf16", "fp8" or "int8", with "+stochastic" and
        "+feedback" (error feedback on registered buffers). Within a host nothing is compressed.
        Set it alike on every rank; HOOP_COMPRESS's until set. A single call takes compress= too."""
        return _compress_name(_lib.hoop_comm_compress(self._live("compress")))

    @compress.setter
    def compress(self, value):
        code = _compress_code("none" if value is None else value, "compress")
        self._check(_lib.hoop_comm_set_compress(self._live("compress"), code))

    def register(self, buf):
        """Register a buffer used by many calls (hoop_register): zero-copy over verbs, and where
        error feedback (compress "+feedback") keeps what compression dropped. Returns a handle
        for deregister(); the buffer must stay alive until then."""
        held = _Buffer(buf, None, "register", True)
        handle = ctypes.c_uint64(0)
        self._check(_lib.hoop_register(self._live("register"), held.address, held.nbytes,
                                       ctypes.byref(handle)))
        return handle.value

    def deregister(self, handle):
        self._check(_lib.hoop_deregister(self._live("deregister"), int(handle)))
