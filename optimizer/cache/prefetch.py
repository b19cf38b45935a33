"""``prefetch(arr, i)``: a software prefetch of ``arr[i]`` for numba kernels.

numba has no prefetch, so this emits LLVM's ``llvm.prefetch`` (``prefetchw`` on x86-64) for the
address of element ``i`` of a 1-D array. A prefetch is only a hint: it never faults and changes
no value, so a kernel may prefetch an element it ends up not reading. The cache kernels use it
where they know many accesses in advance which block a later access will touch (the trace's ids,
the order of a FIFO queue), so the miss to DRAM overlaps the work in between instead of stalling
it.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.base import BaseContext
from numba.core.typing.templates import Signature
from numba.extending import intrinsic


@intrinsic
def prefetch(
    typingctx: object, arr: types.Type, i: types.Type
) -> tuple[Signature, Callable[..., object]] | None:
    """Prefetch ``arr[i]`` for writing into every cache level; no bounds check, no effect.

    numba calls this at typing time with the argument types; the returned ``codegen`` emits
    the LLVM IR into the calling kernel.
    """
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(i, types.Integer):
        return None
    sig = types.void(arr, i)

    def codegen(
        context: BaseContext,
        builder: ir.IRBuilder,
        signature: Signature,
        args: tuple[ir.Value, ...],
    ) -> object:
        arr_val, idx = args
        ary = context.make_array(signature.args[0])(context, builder, arr_val)
        i64 = ir.IntType(64)
        i32 = ir.IntType(32)
        idx = context.cast(builder, idx, signature.args[1], types.int64)
        stride = builder.extract_value(ary.strides, 0)
        addr = builder.add(builder.ptrtoint(ary.data, i64), builder.mul(idx, stride))
        ptr = builder.inttoptr(addr, ir.IntType(8).as_pointer())
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        # rw=1: the kernels write most of what they prefetch; locality=3: keep in all levels;
        # cache type 1: data
        builder.call(fn, [ptr, ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen
