"""timm models (random weights, no download) through kiln: GPU machine only.

timm imports torchvision, and PyPI's torchvision wheel does not import beside the CPU torch
2.13 wheel of the CPU machines ("operator torchvision::nms does not exist"); the only working
CPU set-up is torch 2.14.1 + torchvision 0.29.1, a 5.5 GB CUDA build that also moves torch off
the project's CPU pin. So these tests carry the `gpu` marker and skip cleanly, with the reason,
wherever timm cannot be imported. Per model: inference equal to eager, and graphs/breaks no more
than TorchDynamo's (measured live with torch._dynamo.explain).
"""
from __future__ import annotations

import pytest
import torch

import kiln

pytestmark = pytest.mark.gpu

try:
    import timm
except Exception as err:  # noqa: BLE001 - ImportError, or torchvision's operator error
    pytest.skip(f"timm cannot be imported here ({type(err).__name__}: {err}); the timm tests "
                "run on the GPU machine", allow_module_level=True)

MODELS = ["resnet18", "efficientnet_b0", "mobilenetv3_small_100", "convnext_atto",
          "vit_tiny_patch16_224", "deit_tiny_patch16_224", "swin_tiny_patch4_window7_224",
          "regnetx_002"]


@pytest.mark.parametrize("name", MODELS)
def test_timm_inference_equal_and_no_more_breaks_than_dynamo(name):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval().to(device)
    size = model.default_cfg.get("input_size", (3, 224, 224))
    x = torch.randn(2, *size, device=device)
    with torch.no_grad():
        want = model(x)
        kiln.reset()
        out = kiln.explain(model)(x)
        kiln.reset()
        got = kiln.compile(model, backend="eager")(x)
        torch._dynamo.reset()
        dynamo = torch._dynamo.explain(model)(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    why = [str(r).splitlines()[0] for r in out.break_reasons]
    assert out.graph_count >= 1, why
    assert out.graph_break_count <= dynamo.graph_break_count, why
    assert out.graph_count <= dynamo.graph_count, why


@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_timm_family_runs_in_the_bench_with_the_kiln_backend(train):
    """`python -m kiln bench --models timm:resnet18` in-process: the model built by the suite's
    timm family, kiln's generated kernels checked against eager and fp64 by the bench."""
    from kiln.tools.bench import BenchConfig, run_bench
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = BenchConfig(models=("timm:resnet18",), backend="kiln", train=train, size="small",
                         repeat=2, device=device)
    rows = run_bench(config, progress=None)
    assert [(r["variant"], r["verdict"]) for r in rows] == [("eager", "pass"), ("kiln", "pass")], rows
    assert rows[1]["graphs"] == 1 and rows[1]["breaks"] == 0
