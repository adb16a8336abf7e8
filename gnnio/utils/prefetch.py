"""Software prefetch for numba kernels: ``llvm.prefetch`` as two numba intrinsics.

:func:`prefetch` (one element of a 1-D array) serves the sampler kernels of
:mod:`gnnio.sampling._kernels`, :func:`prefetch_row` (a byte offset into a row of a 2-D array) the
feature gather of :mod:`gnnio.features._gather`. Both are hints: they never fault (no bounds
check), even past the end of the array. Importing this module needs numba.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["prefetch", "prefetch_row"]


def _codegen(with_offset: bool):
    """Codegen of ``__builtin_prefetch(data + args[1] * strides[0] [+ args[2]])`` (read, keep in
    all cache levels) for the array ``args[0]``."""

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i64 = ir.IntType(64)

        def as_i64(v):
            return builder.sext(v, i64) if v.type.width < 64 else v

        stride0 = cgutils.unpack_tuple(builder, ary.strides)[0]
        offset = builder.mul(as_i64(args[1]), stride0)
        if with_offset:
            offset = builder.add(offset, as_i64(args[2]))
        addr = builder.add(builder.ptrtoint(ary.data, i64), offset)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        # (address, rw=0 read, locality=3 keep in all levels, cache type=1 data)
        builder.call(fn, [builder.inttoptr(addr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return codegen


@intrinsic
def _prefetch(typingctx, arr, i):
    """``__builtin_prefetch(&arr[i])`` for a 1-D array: a hint that never faults (no bounds check).

    The sampler's inner loops read big arrays (``indptr``, ``indices``, the ``[num_nodes]`` id
    map) at random positions known some iterations ahead; their loads are independent, but a
    mispredicted branch per edge (new node or not) keeps the CPU from running far enough ahead
    to overlap the cache misses. Prefetching the entry ``_PF_EDGES`` iterations ahead (see
    :mod:`gnnio.sampling._kernels`) measured
    1.3-1.5x faster relabel and count loops on a 2^21-node graph.
    """
    return types.void(arr, i), _codegen(False)


@intrinsic
def _prefetch_row(typingctx, arr, row, offset):
    """``__builtin_prefetch(&arr[row, 0] + offset)`` (read, keep in all cache levels) for a
    2-D array; a hint only: it never faults, even past the end of the array."""
    return types.void(arr, row, offset), _codegen(True)


# the names kernels call, typed as they call them (numba's ``intrinsic`` adds the typing context)
prefetch = cast("Callable[[Any, Any], None]", _prefetch)
prefetch_row = cast("Callable[[Any, Any, Any], None]", _prefetch_row)
