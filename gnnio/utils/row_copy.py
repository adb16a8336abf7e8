"""One row of a 2-D array into a row of another from a numba kernel, as a ``memcpy`` call.

:func:`copy_row` emits LLVM's ``memcpy`` intrinsic with a byte count known only at run time,
which LLVM lowers to a call of the C library's ``memcpy`` (on glibc: vector loads and stores
picked for the CPU at load time). Why not numba's own ``out[i, :] = src[r, :]``: on random
512-byte rows of a 1 GiB table that slice copy (uint64 words; the loop LLVM vectorises, with
numba's overlap check) measured 7.7 GB/s on 2 threads where the ``memcpy`` call measured 9.2
(2-core Intel VM, docs/benchmarks.md), and ATen's ``index_select`` (a ``memcpy`` per row too)
8.1. Importing this module needs numba.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["copy_row"]


@intrinsic
def _copy_row(typingctx, dst, i, src, r, nbytes):
    """``memcpy(&dst[i, 0], &src[r, 0], nbytes)`` for 2-D arrays whose rows are contiguous.

    No bounds check: ``i`` and ``r`` must be valid rows, ``nbytes`` at most a row's bytes, and
    the two rows must not overlap (``memcpy``'s contract). Any dtype: rows are addressed by
    ``strides[0]``, the count is in bytes."""

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        i8p = ir.IntType(8).as_pointer()

        def as_i64(v):
            return builder.sext(v, i64) if v.type.width < 64 else v

        def row_ptr(ary_type, ary_val, row):
            ary = context.make_array(ary_type)(context, builder, ary_val)
            stride0 = cgutils.unpack_tuple(builder, ary.strides)[0]
            addr = builder.add(builder.ptrtoint(ary.data, i64), builder.mul(as_i64(row), stride0))
            return builder.inttoptr(addr, i8p)

        d = row_ptr(signature.args[0], args[0], args[1])
        s = row_ptr(signature.args[2], args[2], args[3])
        cgutils.raw_memcpy(builder, d, s, as_i64(args[4]), 1)
        return context.get_dummy_value()

    return types.void(dst, i, src, r, nbytes), codegen


# the name kernels call, typed as they call it (numba's ``intrinsic`` adds the typing context)
copy_row = cast("Callable[[Any, Any, Any, Any, Any], None]", _copy_row)
