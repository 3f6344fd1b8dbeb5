"""Training graphs whose outputs are views of tensors made inside the graph: eager lets the
caller write into such an output in place (and differentiate through the write); a custom
autograd.Function would refuse ("... is a view and is being modified inplace ... created inside a
custom Function"). kiln returns the base from its Function and views it again outside."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln


def _run(fn, model, x, backend):
    """fn(model, x) under kiln with a graph break between producing and writing the view, then a
    backward; the output and every gradient, against eager on a copy of the same model."""
    ref_model = copy.deepcopy(model)
    ref_x = x.detach().clone().requires_grad_(x.requires_grad)
    expected = fn(ref_model, ref_x)
    expected.square().sum().backward()
    got = kiln.compile(fn, backend=backend)(model, x)
    got.square().sum().backward()
    torch.testing.assert_close(got, expected)
    assert kiln.explain(fn)(copy.deepcopy(model), x.detach()).graph_count >= 1  # kiln compiled

