"""hoop.torch: compression, what a tensor becomes to travel (hvd.Compression.none, .fp16, .bf16)."""

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


class Compression:
    """hvd.Compression.none, .fp16, .bf16."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
