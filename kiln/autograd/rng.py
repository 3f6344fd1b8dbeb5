"""rng: how random ops (dropout, rand_like, bernoulli) are treated by the autograd stage.

Policy (v1): random ops stay in the forward graph as ATen ops that draw from torch's default
generator when the graph runs, so results are reproducible under `torch.manual_seed`. They are
never recomputed in the backward: the partitioner saves their results (dropout masks). Two such
ops are never merged, and an unused one is still removed (it cannot change the result).

Eager RNG (`KILN_EAGER_RNG=1`, later `kiln.config.config.eager_rng`): random ops are not
decomposed and unused ones are kept, so a graph consumes the generator exactly as eager does and
dropout masks are bit-identical to eager. A backend with its own random number generator must run
random ops through torch in this mode.
"""
from __future__ import annotations

import os

import torch

__all__ = ["eager_rng", "is_random"]

_TRUE = {"1", "true", "yes", "on"}


def eager_rng() -> bool:
    """True when random ops must run exactly as eager runs them (config field, else env var)."""
    from kiln.config import config

    value = getattr(config, "eager_rng", None)
    if value is not None:
        return bool(value)
    return os.environ.get("KILN_EAGER_RNG", "").strip().lower() in _TRUE


def is_random(op: object) -> bool:
    """True for ops that draw from a random generator."""
    tags = getattr(op, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags
