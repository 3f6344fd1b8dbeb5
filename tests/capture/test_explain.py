"""kiln.explain: the ExplainOutput fields and report on a simple function and on the seed block;
unsupported code (a non-torch C extension, `.item()` + print) is reported with this file's line and
still runs like eager; fullgraph=True turns it into kiln.errors.UnsupportedError.
"""

from __future__ import annotations

import os
import re
import zlib

import pytest
import torch

import kiln
import kiln.errors
from helpers import CountingBackend, assert_same_structure_and_values, line_of, mentions_line
from models import TransformerBlock

THIS_FILE = os.path.basename(__file__)


def _line_of(marker: str) -> int:
    return line_of(__file__, marker)


def _mentions_line(text: str, lineno: int) -> bool:
    return mentions_line(text, THIS_FILE, lineno)


def simple(alpha, beta):
    return torch.relu(alpha + beta) * 2  # three call_function nodes: add, relu, mul


# --- a simple function ----------------------------------------------------------------------------

def test_explain_simple_function_fields():
    alpha, beta = torch.randn(4, 5), torch.randn(4, 5)
    out = kiln.explain(simple)(alpha, beta)
    assert out.graph_count == 1
    assert out.graph_break_count == 0
    assert list(out.break_reasons) == []
    assert len(out.graphs) == 1 and isinstance(out.graphs[0], torch.fx.GraphModule)
    assert out.op_count == 3
    assert len(out.ops_per_graph) == 1 and len(out.ops_per_graph[0]) == 3
    assert out.op_count == sum(len(ops) for ops in out.ops_per_graph)
    assert isinstance(out.compile_times, (str, dict))
    assert list(out.recompile_reasons) == []
    # the graph computes what the function computes
    gm_out = out.graphs[0](alpha, beta)
    gm_out = gm_out[0] if isinstance(gm_out, (tuple, list)) else gm_out
    torch.testing.assert_close(gm_out, simple(alpha, beta), rtol=0, atol=0)


def test_explain_simple_function_guards():
    out = kiln.explain(simple)(torch.randn(4, 5), torch.randn(4, 5))
    guards = list(out.out_guards)
    assert guards, "no guards recorded"
    for g in guards:
        assert isinstance(g.expr, str) and g.expr
        assert hasattr(g, "location")
    exprs = [g.expr for g in guards]
    assert any("alpha" in e for e in exprs), exprs
    assert any("beta" in e for e in exprs), exprs
    # the shapes are specialized, so guards on alpha state both sizes
    assert any("alpha" in e and re.search(r"\b4\b", e) for e in exprs), exprs
    assert any("alpha" in e and re.search(r"\b5\b", e) for e in exprs), exprs


def test_explain_str_is_a_readable_report():
    out = kiln.explain(simple)(torch.randn(4, 5), torch.randn(4, 5))
    text = str(out)
    for section in ("Graph Count", "Graph Break Count", "Op Count"):
        assert section in text, text
    assert re.search(r"Graph Count\W+1\b", text), text
    assert re.search(r"Graph Break Count\W+0\b", text), text
    assert re.search(r"Op Count\W+3\b", text), text
    assert "guard" in text.lower(), text
    assert any(g.expr in text for g in out.out_guards), text
    assert len(text.splitlines()) > 3


def test_explain_does_not_change_results_of_later_compiles():
    alpha, beta = torch.randn(4, 5), torch.randn(4, 5)
    kiln.explain(simple)(alpha, beta)
    backend = CountingBackend()
    assert_same_structure_and_values(simple(alpha, beta),
                                     kiln.compile(simple, backend=backend)(alpha, beta))
    assert backend.count == 1


# --- the seed block -------------------------------------------------------------------------------

def test_explain_seed_block():
    torch.manual_seed(0)
    model = TransformerBlock(d_model=32, nhead=4)
    out = kiln.explain(model)(torch.randn(2, 8, 32))
    assert out.graph_count == 1
    assert out.graph_break_count == 0
    assert list(out.break_reasons) == []
    assert out.op_count == len(out.ops_per_graph[0]) >= 5
    exprs = [g.expr for g in out.out_guards]
    assert any(re.search(r"\bx\b", e) and re.search(r"\b32\b", e) for e in exprs), exprs
    text = str(out)
    for section in ("Graph Count", "Graph Break Count", "Op Count"):
        assert section in text


# --- unsupported code -----------------------------------------------------------------------------

def checksum_fn(x):
    y = x * 2
    c = zlib.crc32(bytes(y.numpy()))  # BREAK-CRC
    return y + (c % 7)


def print_fn(x):
    y = x.sin()
    print("sum:", y.sum().item())  # BREAK-PRINT
    return y.cos()


def test_unsupported_c_extension_is_reported_with_file_and_line():
    x = torch.randn(8)
    out = kiln.explain(checksum_fn)(x)
    assert len(out.break_reasons) >= 1
    rendered = [r.render() for r in out.break_reasons]
    line = _line_of("BREAK-CRC")
    assert any(THIS_FILE in r and _mentions_line(r, line) for r in rendered), \
        f"no break reason points at {THIS_FILE}:{line}:\n" + "\n".join(rendered)
    assert THIS_FILE in str(out)


def test_unsupported_c_extension_still_gives_eager_output():
    x = torch.randn(8)
    compiled = kiln.compile(checksum_fn, backend="eager")
    for _ in range(2):
        assert_same_structure_and_values(checksum_fn(x), compiled(x))
        x = torch.randn(8)


def test_print_of_item_is_reported_and_output_printed(capsys):
    x = torch.randn(8)
    out = kiln.explain(print_fn)(x)
    rendered = [r.render() for r in out.break_reasons]
    line = _line_of("BREAK-PRINT")
    assert any(THIS_FILE in r and _mentions_line(r, line) for r in rendered), \
        f"no break reason points at {THIS_FILE}:{line}:\n" + "\n".join(rendered)

    capsys.readouterr()
    compiled = kiln.compile(print_fn, backend="eager")
    expected = print_fn(x)
    eager_text = capsys.readouterr().out
    got = compiled(x)
    assert capsys.readouterr().out == eager_text  # printed once, same text
    assert_same_structure_and_values(expected, got)


def test_fullgraph_raises_unsupported_error_with_location():
    compiled = kiln.compile(checksum_fn, backend="eager", fullgraph=True)
    with pytest.raises(kiln.errors.UnsupportedError) as info:
        compiled(torch.randn(8))
    msg = str(info.value)
    assert THIS_FILE in msg, msg
    assert "zlib.crc32(bytes(y.numpy()))" in msg, msg
    assert _mentions_line(msg, _line_of("BREAK-CRC")), msg


def test_fullgraph_raises_for_print_of_item():
    compiled = kiln.compile(print_fn, backend="eager", fullgraph=True)
    with pytest.raises(kiln.errors.UnsupportedError) as info:
        compiled(torch.randn(8))
    msg = str(info.value)
    assert THIS_FILE in msg, msg
    assert 'print("sum:", y.sum().item())' in msg, msg


def test_fullgraph_on_supported_code_compiles_one_graph():
    backend = CountingBackend()
    alpha, beta = torch.randn(3), torch.randn(3)
    out = kiln.compile(simple, backend=backend, fullgraph=True)(alpha, beta)
    assert_same_structure_and_values(simple(alpha, beta), out)
    assert backend.count == 1


def test_explain_with_keyword_arguments():
    out = kiln.explain(simple)(torch.randn(4, 5), beta=torch.randn(4, 5))
    assert out.graph_count == 1
    assert out.op_count == 3
    assert any("beta" in g.expr for g in out.out_guards)
