"""Compression (Horovod's hvd.Compression): Compressor objects with
compress(tensor) -> (tensor, ctx) and decompress(tensor, ctx) -> tensor.

The collectives apply them as Horovod does: allreduce(t, compression=C)
reduces C.compress(t)[0] and returns C.decompress(result, ctx). Built in:
  Compression.none  the tensor as it is
  Compression.fp16  floating tensors cast to float16 (2 bytes an element on
                    the wire: the hub receives and replies float16, sums in fp32)
  Compression.bf16  floating tensors cast to bfloat16 (likewise)
A user-written compressor (a subclass of Compressor, or any object with
compress and decompress) may be passed to the collectives.

DistributedOptimizer's gradients go through the hub's keys, whose wire type
the hub must know: it takes none, fp16, bf16 and Compression.topk(ratio,
error_feedback=True) (each chunk's ceil(ratio * n) largest-magnitude
gradient entries are pushed, the rest kept on the worker as a residual;
the client library selects them, so top-k is not a tensor-to-tensor
compressor and the collectives refuse it), or the strings "none", "fp16",
"bf16", "topk:RATIO", "topk:RATIO:noef". It refuses a user-written
compressor (the hub could not reduce what it produces).

This module imports no other module of the package.
"""
import torch


class Compressor:
    """Horovod's interface: compress(tensor) -> (compressed, ctx);
    decompress(compressed, ctx) -> tensor."""
    name = "custom"
    wire = None  # the hub key's wire type, for the built-in compressors
    topk_ratio = 0.0
    error_feedback = False

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """The tensor as it is."""
    name, wire = "none", "fp32"

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    to = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.to:
            return tensor.type(cls.to), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.type(ctx)


class FP16Compressor(_CastCompressor):
    """Floating tensors as float16."""
    name, wire, to = "fp16", "fp16", torch.float16


class BF16Compressor(_CastCompressor):
    """Floating tensors as bfloat16."""
    name, wire, to = "bf16", "bf16", torch.bfloat16


class TopKCompressor(Compressor):
    """DistributedOptimizer's top-k sparsification (see the module
    docstring). Not a tensor-to-tensor compressor: compress() raises
    ValueError."""
    wire = "fp32"

    def __init__(self, ratio, error_feedback=True):
        try:
            r = float(ratio)
        except (TypeError, ValueError):
            r = float("nan")
        if isinstance(ratio, bool) or not 0.0 < r <= 1.0:  # NaN fails too
            raise ValueError(f"compression: top-k ratio in (0, 1], got {ratio!r}")
        self.topk_ratio = r
        self.error_feedback = bool(error_feedback)
        self.name = f"topk:{r!r}" + ("" if self.error_feedback else ":noef")

    def compress(self, tensor):
        raise ValueError(f"compression: {self!r} applies to DistributedOptimizer's gradients "
                        f"only (the client library selects each chunk's entries); "
                        f"collectives take Compression.none, .fp16, .bf16 or a Compressor")

    decompress = compress

    def __repr__(self):
        ef = "" if self.error_feedback else ", error_feedback=False"
        return f"rackhub.torch.Compression.topk({self.topk_ratio!r}{ef})"

    def __eq__(self, other):
        return (isinstance(other, TopKCompressor) and
                (self.topk_ratio, self.error_feedback) == (other.topk_ratio, other.error_feedback))

    def __hash__(self):
        return hash((self.topk_ratio, self.error_feedback))


class Compression:
    """Horovod's hvd.Compression: none, fp16; rackhub's bf16 and topk(...)."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    @staticmethod
    def topk(ratio, error_feedback=True):
        """Top-k sparsification of DistributedOptimizer's gradients: per
        chunk of the key, the ceil(ratio * elements) entries of largest
        magnitude are sent, ratio in (0, 1]; with error_feedback (default)
        the entries not sent are kept in a residual on this worker and
        added to the next step's gradient."""
        return TopKCompressor(ratio, error_feedback)


_BUILTIN = (NoneCompressor, FP16Compressor, BF16Compressor)
_FORMS = ("rackhub.torch.Compression.none, .fp16, .bf16 or .topk(ratio, error_feedback=True), "
          "or one of the strings 'none', 'fp16', 'bf16', 'topk:RATIO', 'topk:RATIO:noef' "
          "(RATIO in (0, 1])")


def compression_of(compression):
    """The built-in compression `compression` means for DistributedOptimizer
    (a Compression member, or a string: "none", "fp16", "bf16", "topk:RATIO",
    "topk:RATIO:noef"; "fp32" = none). Anything else raises ValueError
    naming the accepted forms."""
    if compression in _BUILTIN or isinstance(compression, TopKCompressor):
        return compression
    if isinstance(compression, str):
        s = compression.strip()
        for w in _BUILTIN:
            if s in (w.name, w.wire):
                return w
        parts = s.split(":")
        if parts[0] == "topk" and len(parts) in (2, 3) and (len(parts) == 2 or
                                                           parts[2] == "noef"):
            try:
                return TopKCompressor(parts[1], error_feedback=len(parts) == 2)
            except ValueError:
                pass
    if hasattr(compression, "compress") and hasattr(compression, "decompress"):
        raise ValueError(f"compression: DistributedOptimizer takes {_FORMS}; a user-written "
                         f"compressor ({compression!r}) works with the collectives "
                         f"(allreduce, allgather, ...) only: the hub reduces the gradients "
                         f"and needs their wire type")
    raise ValueError(f"compression: {_FORMS}; got {compression!r}")


def compressor_of(compression):
    """The Compressor the collectives apply: a Compressor class or object
    (or anything with compress/decompress), or the strings "none", "fp16",
    "bf16"."""
    if isinstance(compression, str):
        c = compression_of(compression)
        if isinstance(c, TopKCompressor):
            c.compress(None)  # raises, naming why
        return c
    if compression is None:
        return NoneCompressor
    if not (callable(getattr(compression, "compress", None)) and
            callable(getattr(compression, "decompress", None))):
        raise ValueError(f"compression: a Compressor (compress(tensor) -> (tensor, ctx), "
                         f"decompress(tensor, ctx) -> tensor), got {compression!r}")
    return compression
