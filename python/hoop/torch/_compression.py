"""hoop.torch: compression, what a tensor becomes to travel (hvd.Compression.none, .fp16, .bf16,
as Horovod casts them), or how hoop encodes it between hosts (.int8, .fp8, .wire_bf16)."""

import torch


class Compressor:
    """Turns a tensor into what travels, and back."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class NoneCompressor(Compressor):
    """Sends tensors as they are."""


class _CastCompressor(Compressor):
    wire = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16 (half the bytes)."""

    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16 (float32's range, half the bytes)."""

    wire = torch.bfloat16


class _WireCompressor(Compressor):
    """Leaves the tensor as it is: hoop encodes it between hosts in wire_format and nowhere else
    (hoop(3), "Slow links"), every rank ending with the same bits. DistributedOptimizer adds error
    feedback: each bucket is packed into a registered buffer of its own (one more copy of the
    gradients' memory), and what one step's encoding dropped is added to the next step's
    gradients (4 more bytes per element this rank sends between hosts). Float sums and averages
    only; other calls are refused."""

    wire_format = None


class Int8Compressor(_WireCompressor):
    """int8 between hosts, scaled per block of 128 elements: 3.9x fewer bytes there."""

    wire_format = "int8"


class FP8Compressor(_WireCompressor):
    """float8 e4m3 between hosts, scaled per block of 128 elements: 3.9x fewer bytes there."""

    wire_format = "fp8"


class WireBF16Compressor(_WireCompressor):
    """bfloat16 between hosts, float32 within them and in the sums: half the bytes there."""

    wire_format = "bf16"


class Compression:
    """hvd.Compression.none, .fp16, .bf16 (cast before the call, as Horovod does); .int8, .fp8,
    .wire_bf16 (encoded by hoop between hosts only)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    int8 = Int8Compressor
    fp8 = FP8Compressor
    wire_bf16 = WireBF16Compressor
