"""libhoop loaded (ctypes) with its functions' prototypes; dtypes and ops by name; a buffer's
address, size and dtype as libhoop takes them (_Buffer)."""

import ctypes
import os

from ._errors import InvalidArgument, Unsupported

# ---- the library -----------------------------------------------------------------------------

_SONAME = "libhoop.so.1"


def _candidates():
    """Where libhoop may be, in order, each looked up only if the one before would not load."""
    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("HOOP_LIBRARY"):
        yield os.environ["HOOP_LIBRARY"]
    # A build tree: python/hoop/ beside lib/.libs/.
    yield os.path.join(here, "..", "..", "lib", ".libs", _SONAME)
    try:
        from . import _build
        yield os.path.join(_build.LIBDIR, _SONAME)
    except ImportError:  # installed by pip: no configure wrote it
        pass
    libdir = _pkg_config_libdir()
    if libdir:
        yield os.path.join(libdir, _SONAME)
    yield _SONAME  # the loader's own search: LD_LIBRARY_PATH, ld.so.cache


def _pkg_config_libdir():
    """Where pkg-config says the installed libhoop is (hoop.pc), or None."""
    import subprocess
    try:
        out = subprocess.run(["pkg-config", "--variable=libdir", "hoop"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as err:
            tried.append("%s (%s)" % (path, err))
    raise ImportError("hoop: cannot load %s; tried: %s. Set HOOP_LIBRARY to its path."
                      % (_SONAME, "; ".join(tried)))


_lib = _load()
_c = ctypes
_lib.hoop_version.restype = _c.c_char_p
_lib.hoop_cuda_supported.argtypes = []
_lib.hoop_strerror.restype = _c.c_char_p
_lib.hoop_last_error.restype = _c.c_char_p
_lib.hoop_last_error.argtypes = [_c.c_void_p]
_lib.hoop_init_from_env.argtypes = [_c.POINTER(_c.c_void_p)]
_lib.hoop_finalize.argtypes = [_c.c_void_p]
_lib.hoop_abort.argtypes = [_c.c_void_p, _c.c_char_p]
for _name in ("hoop_rank", "hoop_size", "hoop_local_rank", "hoop_local_size", "hoop_cross_rank",
              "hoop_cross_size"):
    getattr(_lib, _name).argtypes = [_c.c_void_p]
_lib.hoop_allreduce.argtypes = [_c.c_void_p, _c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_int,
                                _c.c_int]
_lib.hoop_broadcast.argtypes = [_c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_int, _c.c_int]
_lib.hoop_allgather.argtypes = [_c.c_void_p, _c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_int]
_lib.hoop_barrier.argtypes = [_c.c_void_p]
_lib.hoop_reduce_scatter.argtypes = _lib.hoop_allreduce.argtypes
_lib.hoop_alltoall.argtypes = _lib.hoop_allgather.argtypes
_SIZES = _c.POINTER(_c.c_size_t)
_lib.hoop_alltoallv.argtypes = [_c.c_void_p, _c.c_void_p, _SIZES, _SIZES, _c.c_void_p, _SIZES,
                                _SIZES, _c.c_int]
_REQ = _c.POINTER(_c.c_void_p)
_lib.hoop_iallreduce.argtypes = _lib.hoop_allreduce.argtypes + [_REQ]
_lib.hoop_ibroadcast.argtypes = _lib.hoop_broadcast.argtypes + [_REQ]
_lib.hoop_iallgather.argtypes = _lib.hoop_allgather.argtypes + [_REQ]
_lib.hoop_ibarrier.argtypes = [_c.c_void_p, _REQ]
_lib.hoop_ireduce_scatter.argtypes = _lib.hoop_reduce_scatter.argtypes + [_REQ]
_lib.hoop_ialltoall.argtypes = _lib.hoop_alltoall.argtypes + [_REQ]
_lib.hoop_ialltoallv.argtypes = _lib.hoop_alltoallv.argtypes + [_REQ]
_lib.hoop_reduce.argtypes = [_c.c_void_p, _c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_int,
                             _c.c_int, _c.c_int]
_lib.hoop_gather.argtypes = [_c.c_void_p, _c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_int,
                             _c.c_int]
_lib.hoop_scatter.argtypes = _lib.hoop_gather.argtypes
_lib.hoop_ireduce.argtypes = _lib.hoop_reduce.argtypes + [_REQ]
_lib.hoop_igather.argtypes = _lib.hoop_gather.argtypes + [_REQ]
_lib.hoop_iscatter.argtypes = _lib.hoop_scatter.argtypes + [_REQ]
_lib.hoop_send.argtypes = [_c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_int, _c.c_int, _c.c_int]
_lib.hoop_recv.argtypes = _lib.hoop_send.argtypes
_lib.hoop_isend.argtypes = _lib.hoop_send.argtypes + [_REQ]
_lib.hoop_irecv.argtypes = _lib.hoop_send.argtypes + [_REQ]
_PTRS = _c.POINTER(_c.c_void_p)
_lib.hoop_allreduce_many.argtypes = [_c.c_void_p, _c.c_size_t, _PTRS, _PTRS,
                                     _c.POINTER(_c.c_size_t), _c.c_int, _c.c_int]
_lib.hoop_iallreduce_many.argtypes = _lib.hoop_allreduce_many.argtypes + [_REQ]
_lib.hoop_comm_split.argtypes = [_c.c_void_p, _c.c_int, _c.c_int, _c.POINTER(_c.c_void_p)]
_lib.hoop_comm_create_group.argtypes = [_c.c_void_p, _c.POINTER(_c.c_int), _c.c_int,
                                        _c.POINTER(_c.c_void_p)]
_lib.hoop_comm_shrink.argtypes = [_c.c_void_p, _c.POINTER(_c.c_void_p)]
_lib.hoop_comm_grow.argtypes = [_c.c_void_p, _c.POINTER(_c.c_void_p)]
_lib.hoop_comm_newcomers.argtypes = [_c.c_void_p]
_lib.hoop_comm_generation.argtypes = [_c.c_void_p]
_lib.hoop_comm_generation.restype = _c.c_uint
_lib.hoop_comm_set_timeout.argtypes = [_c.c_void_p, _c.c_double]
_lib.hoop_comm_timeout.argtypes = [_c.c_void_p]
_lib.hoop_comm_timeout.restype = _c.c_double
_lib.hoop_comm_set_reproducible.argtypes = [_c.c_void_p, _c.c_int]
_lib.hoop_comm_reproducible.argtypes = [_c.c_void_p]
_lib.hoop_name_next.argtypes = [_c.c_void_p, _c.c_char_p]
_lib.hoop_comm_set_compress.argtypes = [_c.c_void_p, _c.c_int]
_lib.hoop_comm_compress.argtypes = [_c.c_void_p]
_lib.hoop_compress_next.argtypes = [_c.c_void_p, _c.c_int]
_lib.hoop_compress_name.argtypes = [_c.c_int, _c.c_char_p, _c.c_size_t]
_lib.hoop_compress_name.restype = _c.c_char_p
_lib.hoop_compress_from_name.argtypes = [_c.c_char_p, _c.POINTER(_c.c_int)]
_lib.hoop_register.argtypes = [_c.c_void_p, _c.c_void_p, _c.c_size_t, _c.POINTER(_c.c_uint64)]
_lib.hoop_deregister.argtypes = [_c.c_void_p, _c.c_uint64]
_lib.hoop_test.argtypes = [_c.c_void_p, _c.POINTER(_c.c_int)]
_lib.hoop_wait.argtypes = [_c.c_void_p]


_NAME_SHOWN = 63  # HOOP_NAME_MAX - 1: the bytes of a name libhoop's messages show


def _name_tag(data):
    """libhoop's tag of a call's name (core/fingerprint.c: FNV-1a, 0 taken as 1)."""
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h or 1


def cuda_supported():
    """Whether this libhoop takes CUDA device buffers (torch tensors on a GPU)."""
    return bool(_lib.hoop_cuda_supported())


def library_version():
    """The version of the libhoop this package loaded."""
    return _lib.hoop_version().decode()


# ---- data types and operations ---------------------------------------------------------------

DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
          "bfloat16": 7, "float32": 8, "float64": 9, "int16": 10, "uint16": 11, "bool": 12}
_DTYPE_SIZES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 2, 8: 4, 9: 8, 10: 2, 11: 2, 12: 1}
# band, bor, bxor: the integer dtypes and bool only; bool's sum and max are or, prod and min and.
OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4, "band": 5, "bor": 6, "bxor": 7}

# memoryview formats (struct codes) and their hoop dtypes, by item size where C types vary.
_FORMATS = {"b": "int8", "B": "uint8", "e": "float16", "f": "float32", "d": "float64",
            "c": "uint8", "?": "bool"}
_SIGNED = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}
_UNSIGNED = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
_TORCH = {"torch.int8": "int8", "torch.uint8": "uint8", "torch.int16": "int16",
          "torch.int32": "int32", "torch.int64": "int64", "torch.float16": "float16",
          "torch.bfloat16": "bfloat16", "torch.float32": "float32", "torch.float64": "float64",
          "torch.bool": "bool", "torch.uint16": "uint16", "torch.uint32": "uint32",
          "torch.uint64": "uint64"}  # the last three: torch 2.3 on


def _dtype_code(name, call):
    if isinstance(name, int):
        if name in _DTYPE_SIZES:
            return name
    elif name in DTYPES:
        return DTYPES[name]
    raise InvalidArgument("%s: unknown dtype %r (one of %s)" % (call, name, ", ".join(DTYPES)))


def _op_code(name, call):
    if isinstance(name, int) and 0 <= name < len(OPS):
        return name
    if name in OPS:
        return OPS[name]
    raise InvalidArgument("%s: unknown op %r (one of %s)" % (call, name, ", ".join(OPS)))


class _Buffer:
    """A buffer's address, byte length and hoop dtype; keeps the object (and any view) alive."""

    def __init__(self, obj, dtype, call, writable):
        self.obj = obj
        if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # a torch tensor
            if getattr(obj, "is_cuda", False):
                if not _lib.hoop_cuda_supported():
                    raise Unsupported("%s: a tensor on %s, but this libhoop takes no CUDA "
                                      "buffers (built without CUDA, or no driver loads)"
                                      % (call, obj.device), Unsupported.code)
                # hoop reads inputs when the call runs: what torch queued must be done by then.
                import torch
                torch.cuda.current_stream(obj.device).synchronize()
            elif str(getattr(obj, "device", "cpu")) != "cpu":
                raise Unsupported("%s: tensors on %s are not supported (CPU and CUDA are)"
                                  % (call, obj.device), Unsupported.code)
            if not obj.is_contiguous():
                raise InvalidArgument("%s: the tensor is not contiguous" % call)
            name = dtype or _TORCH.get(str(obj.dtype))
            if name is None:
                raise InvalidArgument("%s: tensors of %s are not supported" % (call, obj.dtype))
            self.dtype = _dtype_code(name, call)
            self.address = obj.data_ptr()
            self.nbytes = obj.numel() * obj.element_size()
            return
        try:
            view = memoryview(obj)
        except TypeError:
            raise InvalidArgument("%s: %s has no buffer protocol (use array.array, bytearray, "
                                  "numpy or torch)" % (call, type(obj).__name__)) from None
        if not view.c_contiguous:
            raise InvalidArgument("%s: the buffer is not contiguous" % call)
        if writable and view.readonly:
            raise InvalidArgument("%s: the buffer is read-only" % call)
        self.view = view
        self.nbytes = view.nbytes
        if dtype is None:
            fmt = view.format.lstrip("@=<>!")
            if fmt in _FORMATS:
                dtype = _FORMATS[fmt]
            elif fmt in "hilq":
                dtype = _SIGNED.get(view.itemsize)
            elif fmt in "HILQ":
                dtype = _UNSIGNED.get(view.itemsize)
            if dtype is None:
                raise InvalidArgument("%s: buffer format %r has no hoop dtype; pass dtype="
                                      % (call, view.format))
        self.dtype = _dtype_code(dtype, call)
        if self.nbytes == 0:
            self.address = None
        elif view.readonly:
            # ctypes gives no address for a read-only buffer; a copy serves as input.
            self.copy = ctypes.create_string_buffer(view.tobytes(), self.nbytes)
            self.address = ctypes.addressof(self.copy)
        else:
            holder = (ctypes.c_char * self.nbytes).from_buffer(view.cast("B"))
            self.holder = holder
            self.address = ctypes.addressof(holder)

    def count(self, call):
        size = _DTYPE_SIZES[self.dtype]
        if self.nbytes % size:
            raise InvalidArgument("%s: %d bytes are not a whole number of %d-byte elements"
                                  % (call, self.nbytes, size))
        return self.nbytes // size
