"""_compat: the runtime's private torch APIs, in one place (the rule: one such module per stage).

- `storage_use_count(t)`: how many references hold `t`'s storage (`torch._C._storage_Use_Count`,
  what torch's CUDA graph trees read to tell whether an output of a replay is still alive). The
  temporary storage object this function makes adds one; callers compare counts taken the same
  way, never absolute values.
"""
from __future__ import annotations

import torch

__all__ = ["storage_use_count"]


def storage_use_count(t: torch.Tensor) -> int:
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))
