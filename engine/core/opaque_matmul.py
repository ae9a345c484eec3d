"""A matmul that a compiled graph calls as one opaque op (the int8 kernel, the packed float32 weights).

Their eager calls check whether a copy of the weights is stale (data_ptr, version) and call kernels over
tensors dynamo cannot trace (fbgemm's packed weights, oneDNN's blocked layout). Traced, those checks broke
the graph at every projection (int8, the 135M model at batch 1: p10 step 30 ms eager, 63 ms compiled). As
one opaque op per matmul, the graph fuses everything between the projections and the op runs the object's
`eager` at call time. A handle (an int, constant in the graph) names the object; the table holds it weakly,
so a dropped model's matmuls go with it. Ops are declared with torch.library.Library, not the custom_op
decorator: its Python wrapper cost ~16 us a call, x121 calls a step on that model.

A subclass names its op (`class Int8Matmul(OpaqueMatmul, op="int8_matmul")`), defines `eager(x)` and
`out_features`, and calls `super().__init__()`.
"""

from __future__ import annotations

import itertools
import weakref

import torch

_LIB = torch.library.Library("infersight", "FRAGMENT")
_HANDLES = itertools.count()
_MATMULS: weakref.WeakValueDictionary[int, OpaqueMatmul] = weakref.WeakValueDictionary()


def tensor_version(t: torch.Tensor) -> int:
    """How many in-place writes `t` (and its views) has seen: with its data_ptr, whether a copy made from it is
    stale. 0 for inference tensors, which have no version counter."""
    return 0 if t.is_inference() else t._version


def _call(x: torch.Tensor, handle: int) -> torch.Tensor:
    mm = _MATMULS.get(handle)
    if mm is None:
        raise RuntimeError(f"matmul {handle} is gone: a compiled graph outlived the model it was traced on")
    return mm.eager(x)


def _shape(x: torch.Tensor, handle: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], _MATMULS[handle].out_features))


class OpaqueMatmul:
    _op = None  # torch.ops.infersight.<op>, set per subclass

    def __init_subclass__(cls, op: str, **kwargs):
        super().__init_subclass__(**kwargs)
        _LIB.define(f"{op}(Tensor x, int handle) -> Tensor")
        _LIB.impl(op, _call, "CompositeExplicitAutograd")
        torch.library.register_fake(f"infersight::{op}", _shape, lib=_LIB)
        cls._op = getattr(torch.ops.infersight, op)

    def __init__(self):
        self.handle = next(_HANDLES)  # how a compiled graph names this matmul
        _MATMULS[self.handle] = self

    @property
    def out_features(self) -> int:
        raise NotImplementedError

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return self._op(x, self.handle)
        return self.eager(x)
