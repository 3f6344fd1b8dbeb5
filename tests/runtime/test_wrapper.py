"""The generated wrapper (kiln.runtime.wrapper) and compile_graph on small ATen graphs.

Graphs come from `trace_aten` (make_fx, functionalized); kernels run in Triton's interpreter on
CPU tensors, so shapes stay tiny. Each test checks the wrapper's text for what it promises
(kernels named, buffers freed, storage reused, views) and its results against eager.
"""
from __future__ import annotations

import ast
import re

import pytest
import torch

pytest.importorskip("triton")

from kiln.lower.decomposition_tables import trace_aten  # noqa: E402
from kiln.runtime import compile_graph, generate_wrapper, load_wrapper  # noqa: E402
from kiln.runtime.pipeline import build_kernel_launchers, emit_group  # noqa: E402
from kiln.schedule import trivial_schedule  # noqa: E402
from kiln.lower import lower_graph  # noqa: E402


def _mlp(x, w, b):
    h = torch.relu(x @ w + b)
    return (h - h.mean(-1, keepdim=True)).sin()


def _inputs():
    return torch.randn(8, 16), torch.randn(16, 12), torch.randn(12)


def test_wrapper_runs_and_matches_eager():
    inputs = _inputs()
    artifact = compile_graph(trace_aten(_mlp, *inputs), inputs, name="mlp")
    for _ in range(2):  # fresh inputs each call: the wrapper holds no state between calls
        inputs = _inputs()
        (out,) = artifact(*inputs)
        torch.testing.assert_close(out, _mlp(*inputs))


def test_wrapper_source_is_python_naming_kernels_and_freeing_buffers():
    inputs = _inputs()
    artifact = compile_graph(trace_aten(_mlp, *inputs), inputs, name="mlp")
    source = artifact.wrapper.source
    tree = ast.parse(source)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "call" for n in tree.body)
    assert artifact.specs, "the graph has generated kernels"
    for spec in artifact.specs:
        assert f"{spec.name}(" in source
    deleted = [t for n in ast.walk(tree) if isinstance(n, ast.Delete) for t in n.targets]
    freed = {n.id for t in deleted for n in ast.walk(t) if isinstance(n, ast.Name)}
    allocated = {n.targets[0].id for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and isinstance(n.targets[0], ast.Name) and n.targets[0].id.startswith("buf")}
    returned = {n.id for r in ast.walk(tree) if isinstance(r, ast.Return)
                for n in ast.walk(r) if isinstance(n, ast.Name)}
    assert allocated - returned <= freed, "every buffer that is not returned is freed"
    assert "aten.addmm.default(" in source or "aten.mm.default(" in source
    extern_calls = len(re.findall(r"\baten\.\w+\.\w+\(", source))
    assert artifact.kernel_launches == len(artifact.specs) + extern_calls


def test_storage_reuse_from_the_schedule():
    def chain(x, w):
        return torch.cos(torch.sin(x) @ w)

    inputs = (torch.randn(8, 8), torch.randn(8, 8))
    graph = lower_graph(trace_aten(chain, *inputs), inputs)
    schedule = trivial_schedule(graph)
    first, last = schedule.groups[0].nodes[0].name, schedule.groups[-1].nodes[0].name
    schedule.reuse = {last: first}  # sin's buffer is dead once the matmul ran
    specs = {g.name: emit_group(g, graph) for g in schedule.groups}
    code = generate_wrapper(schedule, specs, "chain")
    assert f"{last} = reinterpret({first}," in code.source
    call = load_wrapper(code.source, build_kernel_launchers(list(specs.values())))
    (out,) = call(inputs)
    torch.testing.assert_close(out, chain(*inputs))


def test_unsafe_reuse_is_ignored():
    def both(x):
        a = torch.sin(x)
        return torch.cos(a) + a  # a is still read when cos's buffer would take its storage

    inputs = (torch.randn(4, 8),)
    graph = lower_graph(trace_aten(both, *inputs), inputs)
    schedule = trivial_schedule(graph)
    names = [g.nodes[0].name for g in schedule.groups]
    schedule.reuse = {names[-1]: names[0]}
    specs = {g.name: emit_group(g, graph) for g in schedule.groups}
    code = generate_wrapper(schedule, specs, "both")
    assert "reinterpret(" not in code.source
    (out,) = load_wrapper(code.source, build_kernel_launchers(list(specs.values())))(inputs)
    torch.testing.assert_close(out, both(*inputs))


def test_outputs_keep_eager_strides():
    def transposed(x):
        return (x + 1).t(), x.sum(0)

    inputs = (torch.randn(6, 10),)
    artifact = compile_graph(trace_aten(transposed, *inputs), inputs)
    got, want = artifact(*inputs), transposed(*inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()


def test_graph_mutation_is_copied_into_the_input():
    def bump(x, y):
        x.mul_(2)
        return x + y

    x, y = torch.randn(5, 3), torch.randn(5, 3)
    gm = trace_aten(bump, x.clone(), y)
    artifact = compile_graph(gm, [x.clone(), y])
    assert "copy_(" in artifact.wrapper.source
    mine, theirs = x.clone(), x.clone()
    (out,) = artifact(mine, y)
    torch.testing.assert_close(out, bump(theirs, y))
    torch.testing.assert_close(mine, theirs)


def test_timings_cover_the_stages():
    inputs = _inputs()
    artifact = compile_graph(trace_aten(_mlp, *inputs), inputs, trace_s=0.25)
    t = artifact.timings
    assert {"trace", "lower", "schedule", "codegen", "compile_kernels", "autotune",
            "total"} <= set(t)
    assert t["trace"] == 0.25 and t["lower"] > 0 and t["codegen"] > 0
    assert t["total"] == pytest.approx(sum(v for k, v in t.items() if k != "total"))


def test_fit_layout_keeps_a_matching_output_and_copies_another_layout():
    """Kernels index a library output by the layout the IR recorded: a tensor in another layout
    is copied into it (values kept), a matching one passes through untouched."""
    from kiln.runtime import wrapper

    t = torch.randn(4, 6)
    assert wrapper.fit_layout(t, (4, 6), (6, 1), 0) is t
    before = wrapper.relayout_copies[0]
    transposed = torch.randn(6, 4).t()  # same values layout-wise wrong: strides (1, 4)
    fitted = wrapper.fit_layout(transposed, (4, 6), (6, 1), 0)
    assert fitted.stride() == (6, 1) and wrapper.relayout_copies[0] == before + 1
    torch.testing.assert_close(fitted, transposed)
    at_offset = wrapper.fit_layout(t, (4, 6), (6, 1), 3)
    assert at_offset.storage_offset() == 3
    torch.testing.assert_close(at_offset, t)


# the device's flash attention op and the dtype it takes (CUDA's: half precision only)
_FLASH = {"cpu": (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
                  torch.float32),
          "cuda": (torch.ops.aten._scaled_dot_product_flash_attention.default, torch.float16)}


@pytest.mark.explicit_device  # the flash op is per device: the test picks it and the tensors
def test_unread_library_outputs_are_not_bound(device):
    """Attention's logsumexp (and on CUDA its philox seed / offset, which flash attention
    returns as None without dropout) is never read: the wrapper neither binds, fits nor frees
    it, so a library returning None there cannot break the call."""
    op, dtype = _FLASH[device.type]

    def attention_output_only(q, k, v):
        return op(q, k, v)[0] * 2

    inputs = tuple(torch.randn(2, 3, 8, 16, device=device, dtype=dtype) for _ in range(3))
    artifact = compile_graph(trace_aten(attention_output_only, *inputs), inputs, name="attn")
    source = artifact.wrapper.source
    call = next(line for line in source.splitlines() if f"{op._opname}.default(" in line)
    assert re.match(r"\s*buf0, (_, )+= ", call), call  # output 0 bound, every other one not
    assert source.count("= fit_layout(") == 1  # the attention output only
    (out,) = artifact(*inputs)
    torch.testing.assert_close(out, attention_output_only(*inputs))
    from kiln.runtime import wrapper
    assert wrapper.fit_layout(None, (2,), (1,), 0) is None


def test_aligned_bias_pads_rows_to_16_elements_and_keeps_values():
    """The CUDA attention kernels need 16-element aligned bias rows (issue 11: a 6-key mask
    failed with "attn_bias is not correctly aligned (strideM)")."""
    from kiln.runtime.wrapper import aligned_bias

    bias = torch.randn(2, 1, 3, 6).expand(2, 4, 3, 6)
    out = aligned_bias(bias)
    assert all(s % 16 == 0 for s in out.stride()[:-1]) and out.stride(-1) == 1
    assert torch.equal(out, bias)
    aligned = torch.randn(2, 4, 3, 16)
    assert aligned_bias(aligned) is aligned
    assert aligned_bias(None) is None


def test_aligned_bias_ignores_the_strides_of_size_one_dims():
    """A size-1 dim's stride is never stepped (the kernels skip its alignment check), so a mask
    like GPT-2's causal (1, 1, L, L) with strides (1, 1, L, 1) passes as it is: padding it
    cost a new_zeros + copy per layer per call (~45 us of host time per layer at batch 1 on the
    H100). A size-1 dim beside an unaligned row stride still pads."""
    from kiln.runtime.wrapper import aligned_bias

    mask = torch.randn(32, 32).as_strided((1, 1, 32, 32), (1, 1, 32, 1))
    assert aligned_bias(mask) is mask
    rows = torch.randn(6, 6).as_strided((1, 1, 6, 6), (1, 1, 6, 1))
    padded = aligned_bias(rows)
    assert padded is not rows and padded.stride(2) % 16 == 0 and torch.equal(padded, rows)


def test_library_arguments_view_own_buffers_without_a_bounds_check_and_inputs_with_one():
    """A library call's argument that views a buffer the wrapper laid out itself (here the
    kernel output `h`, read by the second matmul as a (4·2, 6) view of a (4, 2, 6) buffer)
    reads inside that layout by construction: `alias_view`, half `as_strided`'s host cost. A
    view of an input keeps `as_strided`, whose bounds check catches a layout capture got
    wrong; so does a returned output, whose `_base` autograd reads."""
    def f(x, w1, w2):
        h = torch.relu(x @ w1)
        return (h.view(8, 6) @ w2).view(4, 2, 5), x.view(8, 8).t() @ x.view(8, 8)

    inputs = (torch.randn(4, 2, 8), torch.randn(8, 6), torch.randn(6, 5))
    artifact = compile_graph(trace_aten(f, *inputs), inputs, name="views")
    source = artifact.wrapper.source
    aliased = re.findall(r"alias_view\((\w+),", source)
    checked = re.findall(r"as_strided\((\w+),", source)
    buffers = {n for n in aliased + checked if n.startswith("buf")}
    assert aliased and all(name.startswith("buf") for name in aliased), source
    assert "x_1" in checked, source
    returned = re.search(r"return \((.*)\)", source).group(1)
    assert "alias_view" not in returned and buffers
    for _ in range(2):
        inputs = (torch.randn(4, 2, 8), torch.randn(8, 6), torch.randn(6, 5))
        for got, want in zip(artifact(*inputs), f(*inputs)):
            torch.testing.assert_close(got, want)


def test_symbolic_wrapper_views_own_buffers_without_a_bounds_check():
    """The same rule with symbolic sizes: a view of a buffer the wrapper laid out reads inside
    it for every size when its range, an expression of the sizes, provably lies in the buffer's
    (GPT-2 at batch 1 paid `as_strided` 112 times per call in its dynamic wrapper: ~10% more
    host time than the static one). Inputs keep the checked `as_strided`; every size is
    eager's answer."""
    from kiln.lower import _compat
    from kiln.lower.decomposition_tables import trace_table

    def f(x, w1, w2):
        h = torch.relu(x @ w1)
        return h[:, 0] @ w2, torch.bmm(h, h.transpose(1, 2))  # bmm reads a view of h

    weights = (torch.randn(8, 6), torch.randn(6, 5))
    gm = _compat.make_symbolic_aten_graph(f, (torch.randn(4, 2, 8), *weights), trace_table(),
                                          {0: {0}})
    artifact = compile_graph(gm, [], name="symbolic_views")
    assert artifact.graph.symbolic
    source = artifact.wrapper.source
    aliased = re.findall(r"alias_view\((\w+),", source)
    assert aliased and all(name.startswith("buf") for name in aliased), source
    for batch in (2, 3, 7):
        x = torch.randn(batch, 2, 8)
        for got, want in zip(artifact(x, *weights), f(x, *weights)):
            torch.testing.assert_close(got, want)


def test_alias_view_counts_its_offset_from_the_tensors_own_offset():
    """`alias_view` (Inductor's `_reinterpret_tensor`) and its fallback agree: the offset is
    relative to the tensor's storage offset, unlike `as_strided`'s."""
    from kiln.runtime import _compat

    base = torch.randn(12)
    t = base[3:]
    want = torch.as_strided(base, (2, 2), (3, 1), 3 + 4)
    for view in (_compat.alias_view, _compat._as_strided_from):
        got = view(t, (2, 2), (3, 1), 4)
        assert got.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fast_empty_allocates_the_requested_layout(device):
    """The wrapper allocates with `empty_cpu` / `empty_cuda` (Inductor's allocators without the
    dispatcher) and their `empty_strided` fallback: same size, strides, dtype and device, and
    a CUDA buffer on the device made current, as the wrapper's guard does."""
    import contextlib

    from kiln.runtime import _compat

    made = [_compat.empty_cuda if device.type == "cuda" else _compat.empty_cpu,
            _compat._empty_fn(device.type, "_missing")]  # the fallback
    guard: contextlib.AbstractContextManager = contextlib.nullcontext()
    if device.type == "cuda":
        guard = torch.cuda.device(device)
    with guard:
        for empty in made:
            t = empty((3, 4, 5), (20, 1, 4), torch.bfloat16)
            assert (t.shape, t.stride(), t.dtype) == ((3, 4, 5), (20, 1, 4), torch.bfloat16)
            assert t.device.type == device.type and (t.device.index or 0) == (device.index or 0)
