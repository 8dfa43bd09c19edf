"""hoop.torch: plain values between ranks, without pickle.

What hoop.torch exchanges on its own account (tensors' shapes and dtypes, the names of a model's
tensors, an optimizer's state, an elastic state's attributes) travels as integers or as this
module's encoding, which decodes into nothing but None, bool, int, float, str, bytes, lists,
tuples, dicts and CPU tensors of known dtypes: a peer's bytes cannot make this rank run code, and
bytes that are not such a value fail the call naming the rank that sent them. Only the calls that
say they trust peers (broadcast_object, allgather_object, and torch.distributed's *_object calls)
unpickle.

The encoding: 8 bytes "hoopval1", the header's length (8 bytes, big-endian), the header (JSON: a
value's tree, where JSON's own scalars and strings stand for themselves and every container is an
object of one key: {"l": [...]} a list, {"t": [...]} a tuple, {"d": [[key, value], ...]} a dict,
{"b": "hex"} bytes, {"x": [dtype, shape]} the next tensor), then the tensors' bytes in order.
"""

import hashlib
import json
import math

import torch

from .. import ProtocolError, Unsupported

_MAGIC = b"hoopval1"
_DEPTH = 64  # containers within containers
_DIMS = 32   # a tensor's dimensions
# The most bytes one rank's value may take in an exchange: a bound on what a peer's claimed length
# makes this rank allocate.
MAX_BYTES = 1 << 32

_DTYPES = {str(d)[len("torch."):]: d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.bool)}


class _Bad(Exception):
    """A value this encoding does not carry, or bytes that are not one."""


# ---- encoding ---------------------------------------------------------------------------------

def _tree(value, blobs, depth):
    if depth > _DEPTH:
        raise _Bad("containers nested more than %d deep" % _DEPTH)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        return {"b": bytes(value).hex()}
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype)[len("torch."):]
        if dtype not in _DTYPES or value.is_sparse or value.dim() > _DIMS:
            raise _Bad("a tensor of %s with %d dimensions%s" % (
                value.dtype, value.dim(), " (sparse)" if value.is_sparse else ""))
        flat = value.detach().to("cpu").contiguous().reshape(-1)
        blobs.append(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        return {"x": [dtype, list(value.shape)]}
    if isinstance(value, list):
        return {"l": [_tree(v, blobs, depth + 1) for v in value]}
    if isinstance(value, tuple):
        return {"t": [_tree(v, blobs, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"d": [[_tree(k, blobs, depth + 1), _tree(v, blobs, depth + 1)]
                      for k, v in value.items()]}
    raise _Bad("a value of type %s" % type(value).__name__)


def encode(value, call):
    """value as bytes; TypeError naming call if it holds anything but plain values and tensors."""
    blobs = []
    try:
        header = json.dumps(_tree(value, blobs, 0), separators=(",", ":")).encode("utf-8")
    except _Bad as err:
        raise TypeError("%s: only None, bool, int, float, str, bytes, lists, tuples, dicts and "
                        "tensors travel between ranks without pickle, not %s" % (call, err))
    return b"".join([_MAGIC, len(header).to_bytes(8, "big"), header] + blobs)


# ---- decoding ---------------------------------------------------------------------------------

def _value(node, data, at, depth):
    """The value of node; at[0]: where the next tensor's bytes start in data."""
    if depth > _DEPTH:
        raise _Bad("containers nested more than %d deep" % _DEPTH)
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if not isinstance(node, dict) or len(node) != 1:
        raise _Bad("a node that is no value: %.60r" % (node,))
    (kind, body), = node.items()
    if kind in ("l", "t") and isinstance(body, list):
        items = [_value(v, data, at, depth + 1) for v in body]
        return items if kind == "l" else tuple(items)
    if kind == "d" and isinstance(body, list):
        out = {}
        for pair in body:
            if not isinstance(pair, list) or len(pair) != 2:
                raise _Bad("a dict entry that is no pair")
            key = _value(pair[0], data, at, depth + 1)
            if isinstance(key, (list, dict, bytearray, torch.Tensor)):
                raise _Bad("a dict key of type %s" % type(key).__name__)
            out[key] = _value(pair[1], data, at, depth + 1)
        return out
    if kind == "b" and isinstance(body, str):
        try:
            return bytes.fromhex(body)
        except ValueError:
            raise _Bad("bytes that are not hex")
    if kind == "x" and isinstance(body, list) and len(body) == 2:
        dtype, shape = body
        if dtype not in _DTYPES:
            raise _Bad("a tensor of unknown dtype %.40r" % (dtype,))
        if (not isinstance(shape, list) or len(shape) > _DIMS or
                any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in shape)):
            raise _Bad("a tensor of shape %.80r" % (shape,))
        dtype = _DTYPES[dtype]
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if nbytes > len(data) - at[0]:
            raise _Bad("a tensor of %d bytes where %d remain" % (nbytes, len(data) - at[0]))
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        blob = bytearray(data[at[0]:at[0] + nbytes])
        at[0] += nbytes
        return torch.frombuffer(blob, dtype=dtype).reshape(shape)
    raise _Bad("a node of unknown kind %.20r" % (kind,))


def decode(data, call, rank):
    """The value data encodes; ProtocolError naming call and rank (who sent it) if data is not
    one. Builds nothing but plain values and tensors, whatever data holds."""
    data = bytes(data)
    try:
        if len(data) < 16 or data[:8] != _MAGIC:
            raise _Bad("bytes that are not a hoop.torch value (%d bytes from %.16r)"
                       % (len(data), data[:16]))
        length = int.from_bytes(data[8:16], "big")
        if length > len(data) - 16:
            raise _Bad("a header of %d bytes in %d" % (length, len(data)))
        try:
            tree = json.loads(data[16:16 + length].decode("utf-8"))
        except (ValueError, RecursionError) as err:
            raise _Bad("a header that is not JSON (%s)" % err)
        at = [16 + length]
        value = _value(tree, data, at, 0)
        if at[0] != len(data):
            raise _Bad("%d bytes after the value" % (len(data) - at[0]))
        return value
    except _Bad as err:
        raise ProtocolError("%s: rank %d sent %s; nothing was unpickled or run" % (call, rank, err),
                            ProtocolError.code)


# ---- exchanges --------------------------------------------------------------------------------

def _bounded(lengths, call):
    for r, n in enumerate(lengths):
        if n < 0 or n > MAX_BYTES:
            raise ProtocolError("%s: rank %d announced a value of %d bytes (at most %d are taken)"
                                % (call, r, n, MAX_BYTES), ProtocolError.code)


def _widest(lengths, call):
    """The longest of the ranks' announced lengths, after checking that every rank may take all
    of them padded to it."""
    _bounded(lengths, call)
    widest = max(lengths)
    if widest * len(lengths) > MAX_BYTES:
        raise ProtocolError("%s: the ranks' values take %d bytes each (at most %d in all are "
                            "taken)" % (call, widest, MAX_BYTES), ProtocolError.code)
    return widest


def _encode_or_refuse(value, call):
    """(the encoding, None), or (None, the TypeError) for a value encode refuses: the ranks learn
    of it through the length they exchange (_REFUSED), and every one of them raises."""
    try:
        return encode(value, call), None
    except TypeError as err:
        return None, err


_REFUSED = -1  # the length a rank announces for a value it cannot send


def _refused(lengths, call, err):
    refusers = [r for r, n in enumerate(lengths) if n == _REFUSED]
    if err is not None:
        raise err
    if refusers:
        raise TypeError("%s: rank%s %s could not send %s value without pickle (%s error says "
                        "why)" % (call, "s" if len(refusers) > 1 else "",
                                  ", ".join(map(str, refusers)),
                                  "their" if len(refusers) > 1 else "its",
                                  "their" if len(refusers) > 1 else "its"))


def broadcast(value, root, comm, call, name=None):
    """root's value (plain values and tensors, see encode) on every rank of comm; TypeError on
    every rank if the root's is not such a value."""
    err = None
    if comm.rank == root:
        data, err = _encode_or_refuse(value, call)
        length = torch.tensor([_REFUSED if err else len(data)], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    comm.broadcast(length, root=root, name=name)
    _refused([int(length.item())], call, err)
    if comm.rank == root:
        comm.broadcast(bytearray(data), root=root, dtype="uint8", name=name)
        return value
    _bounded([int(length.item())], call)
    buf = bytearray(int(length.item()))
    comm.broadcast(buf, root=root, dtype="uint8", name=name)
    return decode(buf, call, root)


def allgather(value, comm, call, name=None):
    """Every rank's value, in rank order (plain values and tensors, see encode); TypeError on
    every rank if one rank's is not such a value."""
    data, err = _encode_or_refuse(value, call)
    lengths = torch.empty(comm.size, dtype=torch.int64)
    comm.allgather(torch.tensor([_REFUSED if err else len(data)], dtype=torch.int64), lengths,
                   name=name)
    lengths = lengths.tolist()
    _refused(lengths, call, err)
    widest = _widest(lengths, call)
    every = bytearray(widest * comm.size)
    comm.allgather(bytearray(data.ljust(widest, b"\0")), every, dtype="uint8", name=name)
    return [value if r == comm.rank else decode(every[r * widest:r * widest + n], call, r)
            for r, n in enumerate(lengths)]


def digest_agrees(value, comm, call):
    """Whether every rank of comm holds the same value (its encoding's SHA-256; one allgather)."""
    mine = torch.frombuffer(bytearray(hashlib.sha256(encode(value, call)).digest()),
                            dtype=torch.uint8)
    every = torch.empty(32 * comm.size, dtype=torch.uint8)
    comm.allgather(mine, every)
    return all(torch.equal(every[r * 32:(r + 1) * 32], mine) for r in range(comm.size))


# ---- a tensor's description as integers -------------------------------------------------------

_SHAPE_MAGIC = 0x686F6F7073686170  # "hoopshap": the first integer of every rank's description
_SHAPE_DTYPES = tuple(_DTYPES.values())


def gather_shapes(tensor, comm, call, name=None):
    """Every rank's (dtype, shape) of tensor, in rank order, as integers (3 + _DIMS int64 each:
    the mark, the dtype's index, the dimensions' count, the dimensions). ProtocolError naming the
    rank that sent something else; Unsupported on every rank if one's tensor has too many
    dimensions."""
    if tensor.dtype not in _SHAPE_DTYPES:
        code = -1
    else:
        code = _SHAPE_DTYPES.index(tensor.dtype)
    dims = list(tensor.shape)
    mine = torch.zeros(3 + _DIMS, dtype=torch.int64)
    mine[0], mine[1], mine[2] = _SHAPE_MAGIC, code, len(dims)
    if dims:
        mine[3:3 + min(len(dims), _DIMS)] = torch.tensor(dims[:_DIMS], dtype=torch.int64)
    every = torch.empty(comm.size * (3 + _DIMS), dtype=torch.int64)
    comm.allgather(mine, every, name=name)
    out = []
    for r, row in enumerate(every.reshape(comm.size, 3 + _DIMS).tolist()):
        mark, code, ndim = row[:3]
        if mark != _SHAPE_MAGIC or not (-1 <= code < len(_SHAPE_DTYPES)) or ndim < 0 or any(
                d < 0 for d in row[3:]):
            raise ProtocolError("%s: rank %d sent something other than a tensor's description "
                                "(%s...); nothing was unpickled or run" % (call, r, row[:4]),
                                ProtocolError.code)
        if ndim > _DIMS:
            raise Unsupported("%s: rank %d's tensor has %d dimensions; at most %d are supported"
                              % (call, r, ndim, _DIMS), Unsupported.code)
        if code == -1:
            raise Unsupported("%s: rank %d's tensor has a dtype this call does not carry"
                              % (call, r), Unsupported.code)
        out.append((_SHAPE_DTYPES[code], tuple(row[3:3 + ndim])))
    return out


__all__ = ["encode", "decode", "broadcast", "allgather", "digest_agrees", "gather_shapes"]
