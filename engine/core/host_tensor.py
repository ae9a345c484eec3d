"""Small tensors a step builds from Python lists: the runner's input ids, positions and KV slots, the
sampler's per-row parameters.

`torch.tensor(values)` reads a list element by element through Python's sequence protocol: ~9-14 us
even for one element (torch 2.13, CPU), where an `array` of the same values hands torch one buffer
(~3 us). A decode step at batch 1 builds several such tensors, and that difference is a visible share
of its host time. The values are the same either way: the array stores each value converted as
`torch.tensor` converts it (a float64 buffer is cast by torch for dtypes an array cannot hold).
"""

from __future__ import annotations

from array import array

import torch

# the array typecode that holds a dtype's values exactly as torch.tensor would convert them
_TYPECODES = {torch.int64: ("q", torch.int64), torch.float32: ("f", torch.float32), torch.bool: ("b", torch.bool)}


def host_tensor(values: list, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`torch.tensor(values, dtype=dtype, device=device)`, made from an array's buffer (see the module)."""
    if not values:  # torch.frombuffer refuses an empty buffer
        return torch.empty(0, dtype=dtype, device=device)
    code, buffer_dtype = _TYPECODES.get(dtype, ("d", torch.float64))
    return torch.frombuffer(array(code, values), dtype=buffer_dtype).to(device=device, dtype=dtype)
