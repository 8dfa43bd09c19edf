"""hoop's exceptions: one class per libhoop result code, each carrying libhoop's message."""

# ---- errors ----------------------------------------------------------------------------------


class HoopError(Exception):
    """A libhoop call failed: .code is the hoop_result, .message libhoop's explanation."""

    code = -1

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgument(HoopError, ValueError):
    code = 1


class Timeout(HoopError, TimeoutError):
    code = 2


class PeerLost(HoopError, ConnectionError):
    code = 3


class AuthError(HoopError, PermissionError):
    code = 4


class SystemFailure(HoopError, OSError):
    code = 5


class Unsupported(HoopError, NotImplementedError):
    code = 6


class Aborted(HoopError):
    code = 7


class Mismatch(HoopError):
    code = 8


class ProtocolError(HoopError):
    code = 9


class Failed(HoopError):
    code = 10


_ERRORS = {cls.code: cls for cls in (InvalidArgument, Timeout, PeerLost, AuthError, SystemFailure,
                                     Unsupported, Aborted, Mismatch, ProtocolError, Failed)}
