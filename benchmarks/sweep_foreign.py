"""Sweep of code nobody at kiln wrote: torch.nn modules, torch.nn.functional calls with less common
arguments, and Tensor methods on edge cases, each compiled and compared with eager.

  python benchmarks/sweep_foreign.py [--backend kiln,aot_eager] [--only REGEX] [--list]
                                     [--json PATH] [--timeout SEC] [--verbose]

- backend "kiln": inference (modules in eval mode, under torch.no_grad()), the generated kernels
  run in Triton's interpreter on the CPU (TRITON_INTERPRET=1, config.cpu_codegen =
  "triton_interpret"; set here before triton loads).
- backend "kiln_train" (not in the default list): the aot_eager check with the kiln backend
  (forward and backward graphs as generated kernels).
- backend "aot_eager": training. Modules in train mode (except dropout-like ones), float inputs
  and parameters require grad; outputs, input grads, parameter grads and buffers (BatchNorm's
  running stats) are compared with eager's.

Each case is called twice with fresh random inputs (the compiling call, then a cache hit); with
--grow, twice more with every leading dim >= 2 one and two larger (a recompile with symbolic
sizes, then a call that reuses it). Where eager raises, kiln must raise the same type.
Result per case and backend: `ok`, `ok(fp64)` (outside float tolerance of eager but no farther
from a float64 run than eager is: rtol/atol as the fuzz oracle, `kiln.tools.fuzz.oracle._TOL`),
`fallback` (passed after a kiln warning: an eager fallback, allowed), `mismatch <what> maxdiff`,
`crash: <exception>` (kiln raised where eager did not, or a different type), `timeout`,
`skip` (the case is not for this backend). The coverage column: graphs captured / graph breaks /
ops in the captured graphs / ATen graphs compiled by the kiln pipeline (the kiln backend;
`records.pipeline_timings`), so a case that ran eagerly through breaks shows. Exit status 1 when any case mismatched or crashed.
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# float tolerances of the fuzz oracle (rtol, atol); integers and bools exact
TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-7, 1e-9), torch.float16: (1e-2, 1e-3),
       torch.bfloat16: (2e-2, 1e-2)}
GRAD_TOL = {torch.float32: (1e-4, 1e-4)}  # grads sum over batches: the suite's 1e-4/1e-4


# ---------------------------------------------------------------- input helpers (global RNG)

_GROW = 0  # --grow: later calls add this to every leading dim >= 2 (a new size: dynamic shapes)


def _g(shape: tuple) -> tuple:
    return (shape[0] + _GROW, *shape[1:]) if shape and shape[0] >= 2 else shape


def R(*shape, dtype=torch.float32):
    return torch.randn(_g(shape)).to(dtype)


def P(*shape):  # positive
    return torch.rand(_g(shape)) + 0.5


def U(*shape):  # in (0, 1)
    return torch.rand(_g(shape)) * 0.9 + 0.05


def I(high, *shape, low=0):
    return torch.randint(low, high, _g(shape))


def B(*shape):
    return torch.rand(_g(shape)) > 0.5


@dataclasses.dataclass
class Case:
    name: str
    build: Callable[[], Any]          # a fresh module or function (built under a fixed seed)
    inputs: Callable[[], tuple]       # fresh random arguments
    train: bool = True                # run the aot_eager training check
    infer: bool = True                # run the kiln inference check
    grad_inputs: bool = True          # float inputs require grad in training
    eval_in_train: bool = False       # keep the module in eval mode for training (dropout)
    ref64: bool = True                # a float64 reference run makes sense


CASES: list[Case] = []


def M(name, build, inputs, **kw):
    CASES.append(Case(name, build, inputs, **kw))


def Fn(name, fn, inputs, **kw):
    CASES.append(Case(name, lambda fn=fn: fn, inputs, **kw))


# ---------------------------------------------------------------- 1. torch.nn modules

# convolutions
M("Conv1d", lambda: nn.Conv1d(3, 4, 3), lambda: (R(2, 3, 9),))
M("Conv1d_stride_pad_dil", lambda: nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2),
  lambda: (R(2, 4, 11),))
M("Conv1d_same", lambda: nn.Conv1d(3, 4, 4, padding="same"), lambda: (R(2, 3, 9),))
M("Conv1d_circular", lambda: nn.Conv1d(3, 4, 3, padding=1, padding_mode="circular"), lambda: (R(2, 3, 8),))
M("Conv2d", lambda: nn.Conv2d(3, 4, 3), lambda: (R(2, 3, 7, 7),))
M("Conv2d_groups_dil", lambda: nn.Conv2d(4, 8, 3, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=4),
  lambda: (R(2, 4, 8, 9),))
M("Conv2d_depthwise", lambda: nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False), lambda: (R(2, 4, 6, 6),))
M("Conv2d_reflect", lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), lambda: (R(2, 3, 6, 6),))
M("Conv2d_replicate", lambda: nn.Conv2d(3, 4, 3, padding=2, padding_mode="replicate"), lambda: (R(2, 3, 6, 6),))
M("Conv2d_circular", lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular"), lambda: (R(2, 3, 6, 6),))
M("Conv2d_same_even", lambda: nn.Conv2d(3, 4, (2, 4), padding="same"), lambda: (R(2, 3, 6, 7),))
M("Conv3d", lambda: nn.Conv3d(2, 3, 2, stride=(1, 2, 1), padding=1), lambda: (R(1, 2, 4, 5, 4),))
M("ConvTranspose1d", lambda: nn.ConvTranspose1d(3, 4, 3, stride=2, padding=1, output_padding=1),
  lambda: (R(2, 3, 6),))
M("ConvTranspose2d", lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2, dilation=2),
  lambda: (R(2, 4, 5, 5),))
M("ConvTranspose2d_outsize", lambda: nn.ConvTranspose2d(3, 2, 3, stride=2), lambda: (R(1, 3, 4, 4),))
M("ConvTranspose3d", lambda: nn.ConvTranspose3d(2, 3, 2, stride=2), lambda: (R(1, 2, 3, 3, 2),))
M("LazyLinear_like_Bilinear", lambda: nn.Bilinear(4, 5, 3), lambda: (R(6, 4), R(6, 5)))
M("Linear", lambda: nn.Linear(5, 3), lambda: (R(2, 4, 5),))
M("Linear_nobias_1d", lambda: nn.Linear(5, 3, bias=False), lambda: (R(5),))
M("Identity", lambda: nn.Identity(), lambda: (R(3, 4),))

# pooling
M("MaxPool1d", lambda: nn.MaxPool1d(3, stride=2, padding=1), lambda: (R(2, 3, 9),))
M("MaxPool1d_ceil_dil", lambda: nn.MaxPool1d(2, stride=2, dilation=2, ceil_mode=True), lambda: (R(2, 3, 10),))
M("MaxPool2d", lambda: nn.MaxPool2d(2), lambda: (R(2, 3, 6, 6),))
M("MaxPool2d_ceil_pad", lambda: nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), lambda: (R(2, 3, 7, 8),))
M("MaxPool2d_indices", lambda: nn.MaxPool2d(2, return_indices=True), lambda: (R(1, 2, 4, 6),))
M("MaxPool3d", lambda: nn.MaxPool3d(2, stride=1), lambda: (R(1, 2, 3, 4, 4),))
M("AvgPool1d", lambda: nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False), lambda: (R(2, 3, 9),))
M("AvgPool2d", lambda: nn.AvgPool2d(3, stride=2, padding=1), lambda: (R(2, 3, 7, 7),))
M("AvgPool2d_ceil_nopad", lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
  lambda: (R(2, 3, 6, 8),))
M("AvgPool2d_divisor", lambda: nn.AvgPool2d(2, divisor_override=3), lambda: (R(1, 2, 4, 4),))
M("AvgPool3d", lambda: nn.AvgPool3d(2), lambda: (R(1, 2, 4, 4, 4),))
M("AdaptiveAvgPool1d", lambda: nn.AdaptiveAvgPool1d(4), lambda: (R(2, 3, 10),))
M("AdaptiveAvgPool2d", lambda: nn.AdaptiveAvgPool2d((3, 2)), lambda: (R(2, 3, 7, 5),))
M("AdaptiveAvgPool2d_1", lambda: nn.AdaptiveAvgPool2d(1), lambda: (R(2, 3, 5, 5),))
M("AdaptiveAvgPool3d", lambda: nn.AdaptiveAvgPool3d((2, 3, 2)), lambda: (R(1, 2, 4, 5, 3),))
M("AdaptiveMaxPool1d", lambda: nn.AdaptiveMaxPool1d(3), lambda: (R(2, 3, 8),))
M("AdaptiveMaxPool2d", lambda: nn.AdaptiveMaxPool2d((2, 3)), lambda: (R(2, 3, 5, 7),))
M("AdaptiveMaxPool2d_idx", lambda: nn.AdaptiveMaxPool2d(2, return_indices=True), lambda: (R(1, 2, 5, 5),))
M("AdaptiveMaxPool3d", lambda: nn.AdaptiveMaxPool3d(2), lambda: (R(1, 2, 4, 5, 3),))
M("LPPool1d", lambda: nn.LPPool1d(2, 3, stride=2), lambda: (P(2, 3, 9),))
M("LPPool2d", lambda: nn.LPPool2d(3, 2), lambda: (P(2, 3, 6, 6),))
M("MaxUnpool2d", lambda: _MaxUnpool(), lambda: (R(1, 2, 4, 4),))


class _MaxUnpool(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(2, return_indices=True)
        self.unpool = nn.MaxUnpool2d(2)

    def forward(self, x):
        y, i = self.pool(x)
        return self.unpool(y, i)


# normalization
M("BatchNorm1d", lambda: nn.BatchNorm1d(4), lambda: (R(5, 4),))
M("BatchNorm1d_3d", lambda: nn.BatchNorm1d(4, momentum=None), lambda: (R(3, 4, 5),))
M("BatchNorm2d", lambda: _randomize(nn.BatchNorm2d(3)), lambda: (R(2, 3, 4, 4),))
M("BatchNorm2d_noaffine", lambda: nn.BatchNorm2d(3, affine=False), lambda: (R(2, 3, 4, 4),))
M("BatchNorm2d_nostats", lambda: nn.BatchNorm2d(3, track_running_stats=False), lambda: (R(2, 3, 4, 4),))
M("BatchNorm3d", lambda: _randomize(nn.BatchNorm3d(2)), lambda: (R(2, 2, 3, 3, 3),))
M("InstanceNorm1d", lambda: nn.InstanceNorm1d(3), lambda: (R(2, 3, 6),))
M("InstanceNorm2d_affine", lambda: nn.InstanceNorm2d(3, affine=True, track_running_stats=True),
  lambda: (R(2, 3, 4, 5),))
M("InstanceNorm3d", lambda: nn.InstanceNorm3d(2, affine=True), lambda: (R(2, 2, 3, 3, 3),))
M("GroupNorm", lambda: _randomize(nn.GroupNorm(2, 4)), lambda: (R(2, 4, 3, 3),))
M("GroupNorm_1group_noaffine", lambda: nn.GroupNorm(1, 4, affine=False), lambda: (R(2, 4, 5),))
M("LayerNorm", lambda: _randomize(nn.LayerNorm(6)), lambda: (R(2, 3, 6),))
M("LayerNorm_2d_nobias", lambda: nn.LayerNorm((3, 4), bias=False), lambda: (R(2, 3, 4),))
M("LayerNorm_noaffine", lambda: nn.LayerNorm(5, elementwise_affine=False, eps=1e-2), lambda: (R(4, 5),))
M("RMSNorm", lambda: _randomize(nn.RMSNorm(6)), lambda: (R(2, 3, 6),))
M("RMSNorm_eps_2d", lambda: nn.RMSNorm((3, 4), eps=1e-3), lambda: (R(2, 3, 4),))
M("LocalResponseNorm", lambda: nn.LocalResponseNorm(3), lambda: (R(2, 5, 4, 4),))
M("LocalResponseNorm_3d", lambda: nn.LocalResponseNorm(2, alpha=0.01, beta=0.5, k=2.0), lambda: (R(2, 4, 6),))
M("CrossMapLRN2d", lambda: nn.CrossMapLRN2d(3), lambda: (R(2, 5, 3, 3),), train=False)


def _randomize(m: nn.Module) -> nn.Module:
    """Parameters and running stats away from their 1/0 defaults, so a dropped affine shows."""
    with torch.no_grad():
        for name, t in list(m.named_parameters()) + list(m.named_buffers()):
            if t.is_floating_point():
                t.copy_(torch.rand_like(t) + 0.5 if "var" in name else torch.randn_like(t))
    return m


# activations: every one of torch.nn.modules.activation
ACTS = [
    ("ReLU", lambda: nn.ReLU()), ("ReLU6", lambda: nn.ReLU6()), ("ELU", lambda: nn.ELU(alpha=0.7)),
    ("SELU", lambda: nn.SELU()), ("CELU", lambda: nn.CELU(alpha=1.3)), ("GELU", lambda: nn.GELU()),
    ("GELU_tanh", lambda: nn.GELU("tanh")), ("SiLU", lambda: nn.SiLU()), ("Mish", lambda: nn.Mish()),
    ("Sigmoid", lambda: nn.Sigmoid()), ("Tanh", lambda: nn.Tanh()), ("Hardtanh", lambda: nn.Hardtanh(-0.5, 0.7)),
    ("Hardsigmoid", lambda: nn.Hardsigmoid()), ("Hardswish", lambda: nn.Hardswish()),
    ("Hardshrink", lambda: nn.Hardshrink(0.3)), ("Softshrink", lambda: nn.Softshrink(0.3)),
    ("Tanhshrink", lambda: nn.Tanhshrink()), ("LeakyReLU", lambda: nn.LeakyReLU(0.2)),
    ("LogSigmoid", lambda: nn.LogSigmoid()), ("Softplus", lambda: nn.Softplus(beta=2, threshold=1.5)),
    ("Softsign", lambda: nn.Softsign()), ("PReLU", lambda: nn.PReLU(4, init=0.1)),
    ("PReLU_1", lambda: nn.PReLU()), ("RReLU_eval", lambda: nn.RReLU().eval()),
    ("Threshold", lambda: nn.Threshold(0.1, -2.0)), ("Softmax", lambda: nn.Softmax(dim=1)),
    ("Softmax_neg", lambda: nn.Softmax(dim=-2)), ("Softmin", lambda: nn.Softmin(dim=-1)),
    ("LogSoftmax", lambda: nn.LogSoftmax(dim=1)), ("Softmax2d", lambda: nn.Softmax2d()),
    ("GLU", lambda: nn.GLU(dim=1)),
]
for _n, _b in ACTS:
    M(_n, _b, lambda: (R(2, 4, 3, 2),), eval_in_train=_n == "RReLU_eval")
M("AdaptiveLogSoftmaxWithLoss", lambda: nn.AdaptiveLogSoftmaxWithLoss(8, 10, [4, 8]),
  lambda: (R(6, 8), I(10, 6)))

# dropout in eval
for _n, _cls in [("Dropout", nn.Dropout), ("Dropout1d", nn.Dropout1d), ("Dropout2d", nn.Dropout2d),
                 ("Dropout3d", nn.Dropout3d), ("AlphaDropout", nn.AlphaDropout),
                 ("FeatureAlphaDropout", nn.FeatureAlphaDropout)]:
    M(_n + "_eval", lambda c=_cls: c(0.5).eval(), lambda: (R(2, 3, 4, 4),), eval_in_train=True)
M("Dropout_p0_train", lambda: nn.Dropout(0.0), lambda: (R(3, 4),))

# embeddings
M("Embedding", lambda: nn.Embedding(10, 4), lambda: (I(10, 2, 5),))
M("Embedding_padding_idx", lambda: nn.Embedding(10, 4, padding_idx=2), lambda: (I(10, 3, 4),))
M("Embedding_maxnorm", lambda: nn.Embedding(10, 4, max_norm=1.0), lambda: (I(10, 3, 4),))
M("Embedding_scale_grad", lambda: nn.Embedding(10, 4, scale_grad_by_freq=True), lambda: (I(5, 3, 4),))
M("EmbeddingBag_mean", lambda: nn.EmbeddingBag(10, 4), lambda: (I(10, 3, 4),))
M("EmbeddingBag_sum_offsets", lambda: nn.EmbeddingBag(10, 4, mode="sum"),
  lambda: (I(10, 7), torch.tensor([0, 2, 2, 5])))
M("EmbeddingBag_max", lambda: nn.EmbeddingBag(10, 4, mode="max"), lambda: (I(10, 2, 3),))
M("EmbeddingBag_psw", lambda: nn.EmbeddingBag(10, 4, mode="sum"),
  lambda: (I(10, 2, 3), None, R(2, 3)), grad_inputs=False)
M("Embedding_oob", lambda: nn.Embedding(5, 3), lambda: (torch.tensor([[0, 5]]),))

# recurrent
for _cls in (nn.RNN, nn.LSTM, nn.GRU):
    _n = _cls.__name__
    M(f"{_n}", lambda c=_cls: c(4, 5), lambda: (R(3, 2, 4),))
    M(f"{_n}_bf_bi_2l", lambda c=_cls: c(4, 5, num_layers=2, batch_first=True, bidirectional=True),
      lambda: (R(2, 3, 4),))
    M(f"{_n}_nobias_unbatched", lambda c=_cls: c(4, 3, bias=False), lambda: (R(5, 4),))
M("RNN_relu_h0", lambda: nn.RNN(4, 5, nonlinearity="relu", batch_first=True), lambda: (R(2, 3, 4), R(1, 2, 5)))
M("LSTM_proj", lambda: nn.LSTM(4, 6, proj_size=3, batch_first=True), lambda: (R(2, 3, 4),))
M("LSTM_h0c0", lambda: nn.LSTM(4, 5, num_layers=2), lambda: (R(3, 2, 4), (R(2, 2, 5), R(2, 2, 5))))
M("GRUCell", lambda: nn.GRUCell(4, 5), lambda: (R(3, 4), R(3, 5)))
M("LSTMCell", lambda: nn.LSTMCell(4, 5), lambda: (R(3, 4),))
M("RNNCell_tanh", lambda: nn.RNNCell(4, 5), lambda: (R(3, 4), R(3, 5)))

# transformers / attention
M("MultiheadAttention", lambda: nn.MultiheadAttention(8, 2), lambda: (R(4, 2, 8), R(5, 2, 8), R(5, 2, 8)))
M("MHA_bf_kdim_mask", lambda: nn.MultiheadAttention(8, 2, batch_first=True, kdim=6, vdim=5, bias=False),
  lambda: (R(2, 4, 8), R(2, 3, 6), R(2, 3, 5), B(2, 3), True, torch.randn(4, 3)))
M("MHA_causal_avg", lambda: _MhaCausal(), lambda: (R(2, 5, 8),))
M("MHA_addbias_zeroattn", lambda: nn.MultiheadAttention(8, 4, add_bias_kv=True, add_zero_attn=True),
  lambda: (R(3, 2, 8), R(3, 2, 8), R(3, 2, 8)))
M("TransformerEncoderLayer", lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0), lambda: (R(5, 2, 8),))
M("TransformerEncoderLayer_bf_normfirst_gelu",
  lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True,
                                     activation="gelu"), lambda: (R(2, 5, 8),))
M("TransformerEncoder_mask", lambda: _EncoderMask(), lambda: (R(2, 5, 8), B(2, 5)))
M("TransformerDecoderLayer", lambda: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
  lambda: (R(2, 4, 8), R(2, 5, 8)))
M("Transformer_small", lambda: nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True),
  lambda: (R(2, 5, 8), R(2, 4, 8)))


class _MhaCausal(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.mha(x, x, x, attn_mask=mask, is_causal=True, average_attn_weights=True)


class _EncoderMask(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x, pad):
        pad = pad.clone()
        pad[:, 0] = False  # no fully masked row
        return self.enc(x, src_key_padding_mask=pad)


# shape / layout modules
M("PixelShuffle", lambda: nn.PixelShuffle(2), lambda: (R(2, 8, 3, 3),))
M("PixelUnshuffle", lambda: nn.PixelUnshuffle(2), lambda: (R(2, 2, 4, 6),))
M("ChannelShuffle", lambda: nn.ChannelShuffle(2), lambda: (R(2, 6, 3, 3),))
for _mode, _kw in [("nearest", {}), ("nearest-exact", {}), ("linear", {"align_corners": False}),
                   ("linear", {"align_corners": True}), ("bilinear", {"align_corners": False}),
                   ("bilinear", {"align_corners": True}), ("bicubic", {"align_corners": False}),
                   ("bicubic", {"align_corners": True}), ("trilinear", {"align_corners": False})]:
    _shape = {"linear": (2, 3, 5), "trilinear": (1, 2, 3, 4, 3)}.get(_mode, (2, 3, 4, 5))
    _tag = "_ac" if _kw.get("align_corners") else ""
    M(f"Upsample_{_mode}{_tag}", lambda m=_mode, kw=_kw: nn.Upsample(scale_factor=2, mode=m, **kw),
      lambda s=_shape: (R(*s),))
M("Upsample_size_nearest", lambda: nn.Upsample(size=(5, 7)), lambda: (R(1, 2, 3, 4),))
M("Upsample_frac_bilinear", lambda: nn.Upsample(scale_factor=1.5, mode="bilinear"), lambda: (R(1, 2, 4, 5),))
M("UpsamplingNearest2d", lambda: nn.UpsamplingNearest2d(scale_factor=3), lambda: (R(1, 2, 2, 3),))
M("UpsamplingBilinear2d", lambda: nn.UpsamplingBilinear2d(size=(5, 6)), lambda: (R(1, 2, 3, 4),))
M("Fold", lambda: nn.Fold((4, 5), (2, 2)), lambda: (R(2, 12, 12),))
M("Fold_stride_pad_dil", lambda: nn.Fold((5, 5), 2, dilation=2, padding=1, stride=2), lambda: (R(1, 8, 9),))
M("Unfold", lambda: nn.Unfold((2, 3)), lambda: (R(2, 3, 4, 5),))
M("Unfold_stride_pad_dil", lambda: nn.Unfold(2, dilation=2, padding=1, stride=2), lambda: (R(1, 2, 5, 5),))
M("Flatten", lambda: nn.Flatten(), lambda: (R(2, 3, 4),))
M("Flatten_mid", lambda: nn.Flatten(1, -2), lambda: (R(2, 3, 4, 5),))
M("Unflatten", lambda: nn.Unflatten(1, (2, 3)), lambda: (R(4, 6, 2),))
for _n, _b, _s in [
    ("ZeroPad1d", lambda: nn.ZeroPad1d((1, 2)), (2, 3, 4)),
    ("ZeroPad2d", lambda: nn.ZeroPad2d((1, 0, 2, 1)), (2, 3, 4, 4)),
    ("ZeroPad2d_neg", lambda: nn.ZeroPad2d((-1, 2, 0, -1)), (2, 3, 4, 4)),
    ("ZeroPad3d", lambda: nn.ZeroPad3d(1), (1, 2, 2, 3, 2)),
    ("ConstantPad1d", lambda: nn.ConstantPad1d(2, 3.5), (2, 3, 4)),
    ("ConstantPad2d", lambda: nn.ConstantPad2d((1, 2, 0, 1), -1.0), (2, 3, 4)),
    ("ConstantPad3d", lambda: nn.ConstantPad3d((1, 0, 0, 1, 1, 1), 0.5), (1, 2, 2, 3, 2)),
    ("ReflectionPad1d", lambda: nn.ReflectionPad1d((2, 1)), (2, 3, 5)),
    ("ReflectionPad2d", lambda: nn.ReflectionPad2d((1, 2, 2, 0)), (2, 3, 4, 5)),
    ("ReflectionPad3d", lambda: nn.ReflectionPad3d(1), (1, 2, 3, 3, 3)),
    ("ReplicationPad1d", lambda: nn.ReplicationPad1d((3, 1)), (2, 3, 4)),
    ("ReplicationPad2d", lambda: nn.ReplicationPad2d((1, 2, 3, 0)), (2, 3, 4, 4)),
    ("ReplicationPad3d", lambda: nn.ReplicationPad3d((1, 0, 2, 1, 0, 1)), (1, 2, 2, 3, 3)),
    ("CircularPad1d", lambda: nn.CircularPad1d((2, 1)), (2, 3, 4)),
    ("CircularPad2d", lambda: nn.CircularPad2d((1, 2, 1, 0)), (2, 3, 4, 4)),
    ("CircularPad3d", lambda: nn.CircularPad3d(1), (1, 2, 3, 3, 3)),
]:
    M(_n, _b, lambda s=_s: (R(*s),))
M("CosineSimilarity", lambda: nn.CosineSimilarity(dim=1, eps=1e-6), lambda: (R(3, 5, 2), R(3, 5, 2)))
M("CosineSimilarity_bcast", lambda: nn.CosineSimilarity(dim=-1), lambda: (R(3, 4, 5), R(4, 5)))
M("PairwiseDistance", lambda: nn.PairwiseDistance(), lambda: (R(4, 6), R(4, 6)))
M("PairwiseDistance_p1_keep", lambda: nn.PairwiseDistance(p=1.0, keepdim=True), lambda: (R(4, 6), R(4, 6)))
M("PairwiseDistance_pinf", lambda: nn.PairwiseDistance(p=float("inf")), lambda: (R(4, 6), R(4, 6)))
M("Sequential_ModuleList", lambda: nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)),
  lambda: (R(3, 4),))
M("Conv2d_half", lambda: nn.Conv2d(3, 4, 3).half(), lambda: (R(1, 3, 5, 5, dtype=torch.float16),), train=False)
M("Conv2d_channels_last", lambda: nn.Conv2d(3, 4, 3, padding=1),
  lambda: (R(2, 3, 5, 5).to(memory_format=torch.channels_last),))
M("Conv2d_1x1_bs1", lambda: nn.Conv2d(4, 2, 1), lambda: (R(1, 4, 1, 1),))
M("Linear_bf16", lambda: nn.Linear(8, 4).bfloat16(), lambda: (R(3, 8, dtype=torch.bfloat16),))
M("LayerNorm_half", lambda: _randomize(nn.LayerNorm(16)).half(), lambda: (R(3, 16, dtype=torch.float16),))
M("LayerNorm_bf16", lambda: _randomize(nn.LayerNorm(16)).bfloat16(), lambda: (R(3, 16, dtype=torch.bfloat16),))
M("GroupNorm_bf16", lambda: nn.GroupNorm(2, 4).bfloat16(), lambda: (R(2, 4, 3, dtype=torch.bfloat16),))
M("RMSNorm_half", lambda: _randomize(nn.RMSNorm(8)).half(), lambda: (R(3, 8, dtype=torch.float16),))
M("BatchNorm2d_channels_last", lambda: _randomize(nn.BatchNorm2d(3)),
  lambda: (R(2, 3, 4, 4).to(memory_format=torch.channels_last),))
M("BatchNorm1d_bs1_eval_only", lambda: _randomize(nn.BatchNorm1d(4)), lambda: (R(1, 4),), train=False)
M("Linear_transposed_input", lambda: _TLinear(), lambda: (R(5, 3),))
M("ConvBnReluPool", lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16, 3)),
  lambda: (R(2, 3, 4, 4),))
M("Softmax_half", lambda: nn.Softmax(-1), lambda: (R(3, 7, dtype=torch.float16) * 4,))
M("GELU_bf16", lambda: nn.GELU(), lambda: (R(3, 7, dtype=torch.bfloat16) * 3,))
M("Embedding_bf16", lambda: nn.Embedding(10, 4).bfloat16(), lambda: (I(10, 2, 3),))
M("MHA_need_weights_false", lambda: _MhaNoWeights(), lambda: (R(2, 5, 8),))
M("TransformerEncoderLayer_eval_fastpath_bf", lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                                                batch_first=True),
  lambda: (R(2, 5, 8),), train=False)
M("GRU_bf_h0", lambda: nn.GRU(3, 4, batch_first=True, num_layers=2), lambda: (R(2, 5, 3), R(2, 2, 4)))
M("LSTM_unbatched_bi", lambda: nn.LSTM(3, 4, bidirectional=True), lambda: (R(5, 3),))


class _TLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 2)

    def forward(self, x):
        return self.fc(x.t())


class _MhaNoWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 4, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


# losses with valid targets
for _red in ("mean", "sum", "none"):
    M(f"L1Loss_{_red}", lambda r=_red: nn.L1Loss(reduction=r), lambda: (R(3, 4), R(3, 4)))
    M(f"MSELoss_{_red}", lambda r=_red: nn.MSELoss(reduction=r), lambda: (R(3, 4), R(3, 4)))
    M(f"CrossEntropyLoss_{_red}", lambda r=_red: nn.CrossEntropyLoss(reduction=r), lambda: (R(4, 5), I(5, 4)))
    M(f"NLLLoss_{_red}", lambda r=_red: nn.NLLLoss(reduction=r), lambda: (R(4, 5).log_softmax(1), I(5, 4)))
M("CrossEntropyLoss_probs", lambda: nn.CrossEntropyLoss(label_smoothing=0.1), lambda: (R(4, 5), R(4, 5).softmax(1)))
M("CrossEntropyLoss_ignore_weight_ls",
  lambda: nn.CrossEntropyLoss(weight=torch.rand(5) + 0.5, ignore_index=1, label_smoothing=0.2),
  lambda: (R(6, 5), I(5, 6)))
M("CrossEntropyLoss_2d", lambda: nn.CrossEntropyLoss(), lambda: (R(2, 5, 3, 3), I(5, 2, 3, 3)))
M("CrossEntropyLoss_unbatched", lambda: nn.CrossEntropyLoss(), lambda: (R(5), torch.tensor(3)))
M("NLLLoss_weight_ignore", lambda: nn.NLLLoss(weight=torch.rand(5) + 0.5, ignore_index=-100),
  lambda: (R(6, 5), torch.tensor([0, 4, -100, 2, 2, 1])))
M("NLLLoss_2d", lambda: nn.NLLLoss(), lambda: (R(2, 4, 3, 2), I(4, 2, 3, 2)))
M("BCELoss", lambda: nn.BCELoss(), lambda: (U(3, 4), U(3, 4)))
M("BCELoss_weight", lambda: nn.BCELoss(weight=torch.rand(4), reduction="sum"), lambda: (U(3, 4), U(3, 4)))
M("BCEWithLogitsLoss", lambda: nn.BCEWithLogitsLoss(pos_weight=torch.rand(4) + 0.5), lambda: (R(3, 4), U(3, 4)))
M("BCEWithLogitsLoss_none", lambda: nn.BCEWithLogitsLoss(reduction="none"), lambda: (R(3, 4) * 20, U(3, 4)))
M("HuberLoss", lambda: nn.HuberLoss(delta=0.5), lambda: (R(3, 4), R(3, 4)))
M("SmoothL1Loss", lambda: nn.SmoothL1Loss(beta=0.5), lambda: (R(3, 4), R(3, 4)))
M("SmoothL1Loss_beta0", lambda: nn.SmoothL1Loss(beta=0.0), lambda: (R(3, 4), R(3, 4)))
M("KLDivLoss", lambda: nn.KLDivLoss(reduction="batchmean"), lambda: (R(3, 4).log_softmax(1), R(3, 4).softmax(1)))
M("KLDivLoss_logtarget", lambda: nn.KLDivLoss(reduction="sum", log_target=True),
  lambda: (R(3, 4).log_softmax(1), R(3, 4).log_softmax(1)))
M("PoissonNLLLoss", lambda: nn.PoissonNLLLoss(), lambda: (R(3, 4), P(3, 4) * 3))
M("PoissonNLLLoss_full_nolog", lambda: nn.PoissonNLLLoss(log_input=False, full=True),
  lambda: (P(3, 4), P(3, 4) * 3))
M("GaussianNLLLoss", lambda: nn.GaussianNLLLoss(), lambda: (R(3, 4), R(3, 4), P(3, 4)))
M("GaussianNLLLoss_full_bcast", lambda: nn.GaussianNLLLoss(full=True, reduction="sum"),
  lambda: (R(3, 4), R(3, 4), P(3, 1)))
M("HingeEmbeddingLoss", lambda: nn.HingeEmbeddingLoss(margin=0.5),
  lambda: (R(3, 4), I(2, 3, 4).float() * 2 - 1))
M("SoftMarginLoss", lambda: nn.SoftMarginLoss(), lambda: (R(3, 4), I(2, 3, 4).float() * 2 - 1))
M("MultiLabelSoftMarginLoss", lambda: nn.MultiLabelSoftMarginLoss(weight=torch.rand(4)),
  lambda: (R(3, 4), I(2, 3, 4).float()))
M("MultiLabelMarginLoss", lambda: nn.MultiLabelMarginLoss(),
  lambda: (R(3, 4), torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3], [1, -1, 0, 0]])))
M("MultiMarginLoss", lambda: nn.MultiMarginLoss(p=2, margin=0.7, weight=torch.rand(5)),
  lambda: (R(4, 5), I(5, 4)))
M("MarginRankingLoss", lambda: nn.MarginRankingLoss(margin=0.2),
  lambda: (R(5), R(5), I(2, 5).float() * 2 - 1))
M("CosineEmbeddingLoss", lambda: nn.CosineEmbeddingLoss(margin=0.1),
  lambda: (R(4, 5), R(4, 5), I(2, 4).float() * 2 - 1))
M("TripletMarginLoss", lambda: nn.TripletMarginLoss(margin=0.5, p=1.5, swap=True),
  lambda: (R(4, 5), R(4, 5), R(4, 5)))
M("TripletMarginWithDistanceLoss", lambda: nn.TripletMarginWithDistanceLoss(
    distance_function=nn.PairwiseDistance(), margin=0.3), lambda: (R(4, 5), R(4, 5), R(4, 5)))
M("CTCLoss", lambda: nn.CTCLoss(), lambda: (R(8, 2, 5).log_softmax(2), I(5, 2, 4, low=1),
                                            torch.tensor([8, 7]), torch.tensor([4, 3])))

# ---------------------------------------------------------------- 2. torch.nn.functional

Fn("F.interpolate_bilinear_ac_sf", lambda x: F.interpolate(x, scale_factor=(1.7, 0.6), mode="bilinear",
                                                          align_corners=True), lambda: (R(1, 2, 5, 6),))
Fn("F.interpolate_bilinear_recompute", lambda x: F.interpolate(
    x, scale_factor=1.7, mode="bilinear", recompute_scale_factor=True), lambda: (R(1, 2, 5, 6),))
Fn("F.interpolate_bilinear_antialias", lambda x: F.interpolate(x, size=(3, 2), mode="bilinear",
                                                              antialias=True), lambda: (R(1, 2, 7, 6),))
Fn("F.interpolate_bicubic_antialias", lambda x: F.interpolate(x, scale_factor=0.5, mode="bicubic",
                                                             antialias=True), lambda: (R(1, 2, 8, 6),))
Fn("F.interpolate_area", lambda x: F.interpolate(x, size=(3, 4), mode="area"), lambda: (R(1, 2, 7, 9),))
Fn("F.interpolate_nearest_down", lambda x: F.interpolate(x, scale_factor=0.4), lambda: (R(1, 2, 7, 9),))
Fn("F.interpolate_nearest_exact_1d", lambda x: F.interpolate(x, size=7, mode="nearest-exact"),
   lambda: (R(1, 2, 5),))
Fn("F.grid_sample_bilinear", lambda x, g: F.grid_sample(x, g, align_corners=False),
   lambda: (R(1, 2, 4, 5), torch.rand(1, 3, 3, 2) * 2.4 - 1.2))
Fn("F.grid_sample_nearest_border", lambda x, g: F.grid_sample(x, g, mode="nearest", padding_mode="border",
                                                             align_corners=True),
   lambda: (R(2, 2, 4, 5), torch.rand(2, 3, 3, 2) * 2.4 - 1.2))
Fn("F.grid_sample_bicubic_reflect", lambda x, g: F.grid_sample(x, g, mode="bicubic", padding_mode="reflection"),
   lambda: (R(1, 2, 4, 5), torch.rand(1, 3, 3, 2) * 2.4 - 1.2))
Fn("F.affine_grid", lambda t: F.affine_grid(t, (2, 3, 4, 5), align_corners=False), lambda: (R(2, 2, 3),))
Fn("F.pad_reflect_neg", lambda x: F.pad(x, (2, -1), mode="reflect"), lambda: (R(2, 3, 5),))
Fn("F.pad_replicate_2d", lambda x: F.pad(x, (1, 1, 2, 0), mode="replicate"), lambda: (R(2, 3, 4, 4),))
Fn("F.pad_circular_3d", lambda x: F.pad(x, (1, 1, 0, 1, 1, 0), mode="circular"), lambda: (R(1, 2, 3, 3, 3),))
Fn("F.pad_constant_value_int", lambda x: F.pad(x, (1, 2, 0, 0, 1, 1), value=7), lambda: (I(5, 2, 3, 2),),
   train=False)
Fn("F.pad_constant_last_only", lambda x: F.pad(x, (3, 0), value=-2.5), lambda: (R(4, 3),))
Fn("F.softmax_dim0", lambda x: F.softmax(x, dim=0), lambda: (R(3, 4, 5),))
Fn("F.softmax_dtype", lambda x: F.softmax(x, dim=-1, dtype=torch.float64), lambda: (R(3, 5),))
Fn("F.log_softmax_neg2", lambda x: F.log_softmax(x, dim=-2), lambda: (R(3, 4, 5),))
Fn("F.softmax_0d", lambda x: F.softmax(x, dim=0), lambda: (R(),))
Fn("F.softmax_int_input_dtype", lambda x: F.softmax(x, dim=1, dtype=torch.float32), lambda: (I(5, 3, 4),),
   train=False)
Fn("F.softmax_inf_row", lambda x: F.softmax(x.masked_fill(x > 0.5, float("-inf")), dim=-1),
   lambda: (R(4, 6),))
Fn("F.gumbel_like_log_softmax_half", lambda x: F.log_softmax(x, dim=-1), lambda: (R(3, 5, dtype=torch.float16),))
Fn("F.one_hot", lambda i: F.one_hot(i, 6), lambda: (I(6, 3, 4),))
Fn("F.one_hot_inferred", lambda i: F.one_hot(i), lambda: (I(6, 5),))
Fn("F.one_hot_oob", lambda i: F.one_hot(i, 3), lambda: (torch.tensor([0, 3, 1]),))
Fn("F.one_hot_float_use", lambda i, w: F.one_hot(i, 5).float() @ w, lambda: (I(5, 4), R(5, 3)))
Fn("F.cross_entropy_ls_ignore_weight",
   lambda x, t, w: F.cross_entropy(x, t, weight=w, ignore_index=2, label_smoothing=0.3),
   lambda: (R(6, 4), I(4, 6), P(4)))
Fn("F.cross_entropy_all_ignored", lambda x, t: F.cross_entropy(x, t, ignore_index=1),
   lambda: (R(3, 4), torch.tensor([1, 1, 1])))
Fn("F.cross_entropy_probs_weight", lambda x, t, w: F.cross_entropy(x, t.softmax(-1), weight=w, label_smoothing=0.1),
   lambda: (R(6, 4), R(6, 4), P(4)))
Fn("F.cross_entropy_3d_sum", lambda x, t: F.cross_entropy(x, t, reduction="sum", label_smoothing=0.05),
   lambda: (R(2, 4, 5), I(4, 2, 5)))
Fn("F.cross_entropy_oob_target", lambda x, t: F.cross_entropy(x, t), lambda: (R(3, 4), torch.tensor([0, 4, 1])))
Fn("F.nll_loss_neg_target", lambda x, t: F.nll_loss(x, t), lambda: (R(3, 4), torch.tensor([0, -1, 1])))
Fn("F.normalize", lambda x: F.normalize(x), lambda: (R(3, 4),))
Fn("F.normalize_p1_dim0", lambda x: F.normalize(x, p=1, dim=0, eps=1e-3), lambda: (R(3, 4),))
Fn("F.normalize_pinf_zero_row", lambda x: F.normalize(x * (x.sum(-1, keepdim=True) > 0), p=float("inf"), dim=-1),
   lambda: (R(5, 4),))
Fn("F.unfold", lambda x: F.unfold(x, (2, 2), dilation=(1, 2), padding=(1, 0), stride=(2, 1)),
   lambda: (R(2, 3, 5, 6),))
Fn("F.fold", lambda x: F.fold(x, (3, 4), (2, 2)), lambda: (R(2, 8, 6),))
Fn("F.sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), lambda: (R(2, 2, 4, 8), R(2, 2, 5, 8),
                                                                               R(2, 2, 5, 8)))
Fn("F.sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
   lambda: (R(2, 2, 5, 8), R(2, 2, 5, 8), R(2, 2, 5, 8)))
Fn("F.sdpa_causal_rect", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
   lambda: (R(1, 2, 3, 8), R(1, 2, 5, 8), R(1, 2, 5, 8)))
Fn("F.sdpa_bool_mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m | torch.eye(
    4, 5, dtype=torch.bool)), lambda: (R(2, 2, 4, 8), R(2, 2, 5, 8), R(2, 2, 5, 8), B(4, 5)))
Fn("F.sdpa_float_mask_bcast", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
   lambda: (R(2, 2, 4, 8), R(2, 2, 5, 8), R(2, 2, 5, 8), R(2, 1, 1, 5)))
Fn("F.sdpa_dropout0_scale", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, scale=0.3),
   lambda: (R(2, 4, 8), R(2, 5, 8), R(2, 5, 8)))
Fn("F.sdpa_gqa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
   lambda: (R(1, 4, 3, 8), R(1, 2, 5, 8), R(1, 2, 5, 8)))
Fn("F.sdpa_gqa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
   lambda: (R(2, 6, 4, 8), R(2, 2, 4, 8), R(2, 2, 4, 8)))
Fn("F.sdpa_vdim", lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
   lambda: (R(2, 3, 8), R(2, 4, 8), R(2, 4, 6)))
Fn("F.sdpa_transposed_inputs", lambda q, k, v: F.scaled_dot_product_attention(
    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
   lambda: (R(2, 4, 2, 8), R(2, 5, 2, 8), R(2, 5, 2, 8)))
Fn("F.embedding_padding_maxnorm", lambda i, w: F.embedding(i, w, padding_idx=0), lambda: (I(6, 3, 2), R(6, 4)))
Fn("F.gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), lambda: (R(4, 5),))
Fn("F.silu_inplace_view", lambda x: F.silu(x.clone()[:, 1:], inplace=True), lambda: (R(4, 5),))
Fn("F.relu_inplace_input", lambda x: F.relu_(x.clone().t()), lambda: (R(4, 5),))
Fn("F.hardtanh_int", lambda x: F.hardtanh(x, -2, 3), lambda: (I(9, 4, 5, low=-8),), train=False)
Fn("F.leaky_relu_bf16", lambda x: F.leaky_relu(x, 0.3), lambda: (R(4, 5, dtype=torch.bfloat16),))
Fn("F.threshold", lambda x: F.threshold(x, 0.2, 9.0), lambda: (R(4, 5),))
Fn("F.glu_neg", lambda x: F.glu(x, -2), lambda: (R(3, 4, 5),))
Fn("F.layer_norm_no_weight", lambda x: F.layer_norm(x, (5,), eps=1e-3), lambda: (R(3, 4, 5),))
Fn("F.group_norm_fn", lambda x, w, b: F.group_norm(x, 3, w, b), lambda: (R(2, 6, 4), R(6), R(6)))
Fn("F.batch_norm_eval_fn", lambda x, m, v, w: F.batch_norm(x, m, v, w, None, training=False, eps=1e-3),
   lambda: (R(4, 3, 2), R(3), P(3), R(3)))
Fn("F.instance_norm_fn", lambda x: F.instance_norm(x), lambda: (R(2, 3, 5),))
Fn("F.rms_norm_fn", lambda x, w: F.rms_norm(x, (4,), w), lambda: (R(3, 4), R(4)))
Fn("F.local_response_norm", lambda x: F.local_response_norm(x, 4), lambda: (R(2, 6, 3),))
Fn("F.pixel_shuffle", lambda x: F.pixel_shuffle(x, 3), lambda: (R(1, 9, 2, 2),))
Fn("F.cosine_similarity_eps", lambda a, b: F.cosine_similarity(a, b, dim=0, eps=1e-3),
   lambda: (R(4, 3), R(4, 3)))
Fn("F.pdist", lambda x: F.pdist(x), lambda: (R(5, 3),))
Fn("F.cdist", lambda a, b: torch.cdist(a, b), lambda: (R(4, 3), R(5, 3)))
Fn("F.cdist_p1", lambda a, b: torch.cdist(a, b, p=1.0), lambda: (R(2, 4, 3), R(2, 5, 3)))
Fn("F.max_pool2d_indices", lambda x: F.max_pool2d(x, 2, return_indices=True), lambda: (R(1, 2, 4, 4),))
Fn("F.avg_pool1d_ceil", lambda x: F.avg_pool1d(x, 3, 2, ceil_mode=True), lambda: (R(1, 2, 8),))
Fn("F.adaptive_avg_pool2d_nondiv", lambda x: F.adaptive_avg_pool2d(x, (4, 3)), lambda: (R(1, 2, 7, 5),))
Fn("F.conv2d_fn_stride", lambda x, w: F.conv2d(x, w, stride=2, padding=(0, 1)), lambda: (R(1, 2, 5, 5),
                                                                                        R(3, 2, 3, 3)))
Fn("F.conv1d_batchless", lambda x, w: F.conv1d(x, w, padding=1), lambda: (R(2, 6), R(3, 2, 3)))
Fn("F.linear_3d_weight_bias_bcast", lambda x, w, b: F.linear(x, w, b), lambda: (R(2, 3, 4), R(5, 4), R(5)))
Fn("F.bilinear_fn", lambda a, b, w: F.bilinear(a, b, w), lambda: (R(3, 2), R(3, 4), R(5, 2, 4)))
Fn("F.dropout_eval", lambda x: F.dropout(x, 0.5, training=False), lambda: (R(3, 4),))
Fn("F.mse_loss_bcast", lambda a, b: F.mse_loss(a, b.expand_as(a)), lambda: (R(3, 4), R(1, 4)))
Fn("F.binary_cross_entropy_with_logits_weight",
   lambda x, t, w: F.binary_cross_entropy_with_logits(x, t, weight=w, reduction="sum"),
   lambda: (R(3, 4), U(3, 4), P(4)))
Fn("F.huber_none", lambda a, b: F.huber_loss(a, b, reduction="none", delta=2.0), lambda: (R(3, 4) * 3, R(3, 4)))
Fn("F.logsigmoid_large", lambda x: F.logsigmoid(x * 40), lambda: (R(4, 5),))
Fn("F.softplus_large", lambda x: F.softplus(x * 40), lambda: (R(4, 5),))
Fn("F.softmin_dtype", lambda x: F.softmin(x, dim=0, dtype=torch.float64), lambda: (R(3, 4),))

# ---------------------------------------------------------------- 3. Tensor methods, edge cases

T = Fn  # the same record; grads where inputs are float
T("sum_neg_dims_keepdim", lambda x: x.sum((-1, -3), keepdim=True), lambda: (R(2, 3, 4),))
T("mean_neg_dim", lambda x: x.mean(-2), lambda: (R(2, 3, 4),))
T("amax_keepdim_ties", lambda x: x.round().amax(1, keepdim=True), lambda: (R(3, 5) * 2,))
T("amin_multi", lambda x: x.amin((0, 2)), lambda: (R(2, 3, 4),))
T("prod_dim", lambda x: x.prod(1), lambda: (R(3, 4),))
T("prod_int", lambda x: x.prod(), lambda: (I(4, 5, low=-3),), train=False)
T("std_correction0", lambda x: x.std(dim=1, correction=0), lambda: (R(3, 5),))
T("var_unbiased_keep", lambda x: x.var(-1, keepdim=True), lambda: (R(3, 5),))
T("var_mean", lambda x: torch.var_mean(x, 0), lambda: (R(4, 3),))
T("norm_p3", lambda x: x.norm(p=3, dim=1), lambda: (R(3, 5),))
T("norm_fro_all", lambda x: torch.linalg.vector_norm(x, ord=0.5), lambda: (R(3, 5),))
T("logsumexp_neg", lambda x: x.logsumexp(-1), lambda: (R(3, 5),))
T("logsumexp_inf", lambda x: torch.logsumexp(x.masked_fill(x > 0, float("-inf")), 0), lambda: (R(3, 5),))
T("sum_empty", lambda x: x.sum(0), lambda: (R(0, 3),))
T("mean_empty_dim", lambda x: x.mean(1), lambda: (R(3, 0),))
T("amax_empty_raises", lambda x: x.amax(0), lambda: (R(0, 3),))
T("max_empty_raises", lambda x: x.max(), lambda: (R(0),))
T("prod_empty", lambda x: x.prod(0), lambda: (R(0, 3),))
T("cat_empty", lambda x, y: torch.cat([x, y]), lambda: (R(0, 3), R(2, 3)))
T("cat_legacy_empty_1d", lambda x, y: torch.cat([x, y]), lambda: (R(0), R(2, 3)))
T("mul_empty", lambda x, y: x * y + 1, lambda: (R(0, 3), R(3)))
T("zero_d_ops", lambda x, y: (x * y).exp() + x, lambda: (R(), R(3)))
T("zero_d_sum_dim0", lambda x: x.sum(0), lambda: (R(),))
T("zero_d_unsqueeze_index", lambda x: x.unsqueeze(0)[0] * 2, lambda: (R(),))
T("zero_d_int_item_like", lambda x, y: y * x, lambda: (torch.tensor(3), R(4)))
T("transposed_input_add", lambda x, y: x.t() + y, lambda: (R(4, 3), R(3, 4)))
T("expanded_input", lambda x: x.expand(3, 4, 5).contiguous() * 2 + x, lambda: (R(4, 1),))
T("expanded_input_sum", lambda x: x.sum(0), lambda: (R(1, 5).expand(4, 5),), train=False)
T("stepped_input", lambda x: x[::2, 1::3] * 3, lambda: (R(6, 7),))
T("noncontig_permute_sum", lambda x: x.permute(2, 0, 1).sum(-1), lambda: (R(3, 4, 5),))
T("int_float_promo", lambda x, y: x + y, lambda: (I(5, 3, 4), R(3, 4)))
T("int_div_true", lambda x, y: x / y, lambda: (I(9, 3, 4, low=-8), I(5, 3, 4, low=1)), train=False)
T("int_floordiv_neg", lambda x, y: x // y, lambda: (I(9, 3, 4, low=-8), torch.tensor([-3, 2, -1, 4])),
  train=False)
T("int_remainder_neg", lambda x, y: x % y, lambda: (I(9, 3, 4, low=-8), torch.tensor([-3, 2, -1, 4])),
  train=False)
T("int_fmod_neg", lambda x, y: torch.fmod(x, y), lambda: (I(9, 3, 4, low=-8), torch.tensor([-3, 2, -1, 4])),
  train=False)
T("float_floordiv_neg", lambda x, y: x // y, lambda: (R(3, 4) * 5, torch.tensor([-1.5, 2.0, -0.7, 3.0])),
  train=False)  # eager has no derivative for floor_divide
T("float_remainder_neg", lambda x: x % -1.5, lambda: (R(3, 4) * 5,))
T("float_fmod_scalar", lambda x: torch.fmod(x, 1.3), lambda: (R(3, 4) * 5,))
T("int_div_trunc", lambda x: torch.div(x, -3, rounding_mode="trunc"), lambda: (I(9, 3, 4, low=-8),),
  train=False)
T("int_div_floor_scalar", lambda x: torch.div(x, 3, rounding_mode="floor"), lambda: (I(9, 3, 4, low=-8),),
  train=False)
T("int_div_zero_raises", lambda x, y: x // y, lambda: (I(9, 3, low=1), torch.tensor([1, 0, 2])), train=False)
T("int_pow", lambda x: x ** 2 + x.pow(3), lambda: (I(5, 4, low=-4),), train=False)
T("int_pow_neg_exp_raises", lambda x: x ** -1, lambda: (I(5, 4, low=1),), train=False)
T("int_python_float", lambda x: x * 2.5 + 1, lambda: (I(9, 4, low=-8),), train=False)
T("int_python_int_ops", lambda x: (x * 3 - 7) // 2, lambda: (I(9, 4, low=-8),), train=False)
T("int32_int64_promo", lambda x, y: x + y, lambda: (I(9, 4).int(), I(9, 4)), train=False)
T("uint8_overflow", lambda x: x * 3 + 200, lambda: (I(255, 6).to(torch.uint8),), train=False)
T("int8_neg_div", lambda x: x // -3, lambda: (I(100, 6, low=-100).to(torch.int8),), train=False)
T("bool_sum_mean", lambda x: (x.sum(), x.float().mean()), lambda: (B(3, 4),), train=False)
T("bool_add_int", lambda x, y: x + y, lambda: (B(3, 4), I(5, 4)), train=False)
T("bool_mul_float", lambda x, y: x * y, lambda: (B(3, 4), R(3, 4)))
T("half_float_promo", lambda x, y: x + y, lambda: (R(3, 4, dtype=torch.float16), R(3, 4)))
T("half_scalar_promo", lambda x: x * 1e-3 + 65000.0, lambda: (R(3, 4, dtype=torch.float16),))
T("bf16_sum", lambda x: x.sum(-1), lambda: (R(3, 64, dtype=torch.bfloat16),))
T("bf16_softmax", lambda x: x.softmax(-1), lambda: (R(3, 16, dtype=torch.bfloat16),))
T("bf16_int_promo", lambda x, y: x * y, lambda: (R(3, 4, dtype=torch.bfloat16), I(5, 4)))
T("half_mean_var", lambda x: (x.mean(0), x.var(0)), lambda: (R(6, 4, dtype=torch.float16) * 100,))
T("half_cumsum", lambda x: x.cumsum(0), lambda: (R(20, 3, dtype=torch.float16),))
T("bitwise_and_or_xor", lambda x, y: (x & y, x | y, x ^ y, ~x), lambda: (I(64, 5, low=-64), I(64, 5, low=-64)),
  train=False)
T("bitwise_shift", lambda x: (x << 2, x >> 1), lambda: (I(64, 5, low=-64),), train=False)
T("bitwise_shift_tensor", lambda x, s: (x << s, x >> s), lambda: (I(64, 5, low=-64), I(5, 5)), train=False)
T("bitwise_bool", lambda x, y: (x & y) | ~x, lambda: (B(5), B(5)), train=False)
T("bitwise_int_scalar", lambda x: x & 6 | 1, lambda: (I(64, 5),), train=False)
T("clamp_tensor_bounds", lambda x, lo, hi: x.clamp(lo, hi), lambda: (R(3, 4), R(4) - 0.5, R(3, 1) + 0.5))
T("clamp_min_only_tensor", lambda x, lo: torch.clamp(x, min=lo), lambda: (R(3, 4), R(3, 4)))
T("clamp_int_float_bound", lambda x: x.clamp(-1.5, 2.5), lambda: (I(9, 6, low=-8),), train=False)
T("clamp_lo_gt_hi", lambda x: x.clamp(1.0, -1.0), lambda: (R(6),))
T("clamp_nan", lambda x: x.masked_fill(x > 1, float("nan")).clamp(-0.5, 0.5), lambda: (R(8),), train=False)
T("where_scalar", lambda c, x: torch.where(c, x, 0.5), lambda: (B(3, 4), R(3, 4)))
T("where_scalar_int", lambda c, x: torch.where(c, x, 2), lambda: (B(3, 4), I(5, 3, 4)), train=False)
T("where_two_scalars", lambda c: torch.where(c, 1.5, -2), lambda: (B(3, 4),), train=False)
T("where_int_float_promo", lambda c, x, y: torch.where(c, x, y), lambda: (B(3, 4), I(5, 3, 4), R(3, 4)))
T("where_bcast", lambda c, x, y: torch.where(c, x, y), lambda: (B(3, 1), R(4), R(3, 4)))
T("cumsum_neg_dim", lambda x: x.cumsum(-1), lambda: (R(3, 5),))
T("cumsum_int_dtype", lambda x: x.cumsum(0), lambda: (I(5, 4, 3, low=-3),), train=False)
T("cumsum_bool", lambda x: x.cumsum(1), lambda: (B(3, 5),), train=False)
T("cumsum_dtype_arg", lambda x: x.cumsum(0, dtype=torch.float64), lambda: (R(4, 3),))
T("cumprod", lambda x: x.cumprod(1), lambda: (R(3, 5),))
T("cumprod_with_zero", lambda x: (x * (x > -0.5)).cumprod(0), lambda: (R(5, 3),))
T("cummax", lambda x: torch.cummax(x.round(), 1), lambda: (R(3, 6) * 2,))
T("logcumsumexp", lambda x: torch.logcumsumexp(x, 0), lambda: (R(5, 3),))
T("sort_ties", lambda x: torch.sort(x.round(), dim=-1, stable=True), lambda: (R(3, 7) * 2,))
T("sort_desc_dim0", lambda x: torch.sort(x, dim=0, descending=True), lambda: (R(5, 3),))
T("argsort_ties_stable", lambda x: torch.argsort(x, stable=True), lambda: (I(3, 4, 8).float(),), train=False)
T("topk_ties", lambda x: torch.topk(x.round(), 3, dim=1).values, lambda: (R(3, 7) * 2,))
T("topk_smallest", lambda x: torch.topk(x, 2, dim=0, largest=False), lambda: (R(5, 3),))
T("argmax_ties", lambda x: x.argmax(-1), lambda: (I(3, 4, 8).float(),), train=False)
T("argmin_ties_keep", lambda x: x.argmin(0, keepdim=True), lambda: (I(3, 5, 4).float(),), train=False)
T("argmax_flat", lambda x: x.argmax(), lambda: (I(3, 5, 4).float(),), train=False)
T("argmax_nan", lambda x: x.masked_fill(x > 1, float("nan")).argmax(1), lambda: (R(4, 6),), train=False)
T("max_dim_ties", lambda x: x.max(1), lambda: (I(3, 4, 8).float(),), train=False)
T("max_nan", lambda x: x.masked_fill(x > 1.2, float("nan")).amax(1), lambda: (R(4, 6),), train=False)
T("minimum_nan", lambda x, y: torch.minimum(x.masked_fill(x > 1, float("nan")), y), lambda: (R(8), R(8)),
  train=False)
T("kthvalue", lambda x: torch.kthvalue(x, 2, dim=1), lambda: (R(3, 5),))
T("median_dim", lambda x: x.median(1), lambda: (R(3, 5),))
T("index_oob_raises", lambda x, i: x[i], lambda: (R(4, 3), torch.tensor([0, 4])))
T("index_neg_ok", lambda x, i: x[i], lambda: (R(4, 3), torch.tensor([-1, -4, 2])))
T("gather_oob_raises", lambda x, i: x.gather(1, i), lambda: (R(3, 4), torch.tensor([[0], [4], [1]])))
T("index_select_neg_raises", lambda x, i: x.index_select(0, i), lambda: (R(3, 4), torch.tensor([0, -1])))
T("index_put_oob_raises", lambda x, i: x.clone().index_put_((i,), torch.tensor(1.0)),
  lambda: (R(3, 4), torch.tensor([5])), train=False)
T("scatter_add", lambda x, i, s: x.scatter_add(0, i, s), lambda: (R(3, 4), I(3, 2, 4), R(2, 4)))
T("scatter_reduce_amax", lambda x, i, s: x.scatter_reduce(1, i, s, "amax", include_self=False),
  lambda: (R(3, 4), I(4, 3, 5), R(3, 5)), train=False)
T("index_add_neg_dim", lambda x, i, s: x.index_add(-1, i, s, alpha=2), lambda: (R(3, 4), I(4, 5), R(3, 5)))
T("inplace_on_view", lambda x: _inplace_view(x), lambda: (R(4, 5),))
T("inplace_on_transposed_view", lambda x: _inplace_tview(x), lambda: (R(4, 5),))
T("inplace_input_slice", lambda x: x[1:].mul_(2).add_(1), lambda: (R(4, 5),), train=False)
T("inplace_diag", lambda x: x.clone().diagonal().zero_(), lambda: (R(4, 4),))
T("inplace_int_on_float_view", lambda x: _inplace_int(x), lambda: (R(4, 4),))
T("masked_fill_scalar_tensor", lambda x, m, v: x.masked_fill(m, v), lambda: (R(3, 4), B(3, 4), R()))
T("masked_scatter", lambda x, m, s: x.masked_scatter(m, s), lambda: (R(3, 4), B(3, 4), R(12)))
T("roll_neg", lambda x: x.roll(-2, -1), lambda: (R(3, 5),))
T("roll_multi", lambda x: x.roll((1, -3), (0, 1)), lambda: (R(3, 5),))
T("flip_neg", lambda x: x.flip(-1, 0), lambda: (R(3, 5),))
T("tril_neg_diag", lambda x: x.tril(-1) + x.triu(2), lambda: (R(4, 5),))
T("repeat_interleave_int", lambda x: x.repeat_interleave(2, dim=-1), lambda: (R(3, 4),))
T("repeat", lambda x: x.repeat(2, 1, 3), lambda: (R(3, 4),))
T("narrow_neg", lambda x: x.narrow(-1, 1, 2) * 2, lambda: (R(3, 5),))
T("unbind_stack", lambda x: torch.stack(x.unbind(1), -1), lambda: (R(3, 4),))
T("split_sizes", lambda x: [t.sum() for t in x.split([1, 3, 1], 1)], lambda: (R(3, 5),))
T("chunk_uneven", lambda x: x.chunk(3, -1)[-1] * 2, lambda: (R(3, 7),))
T("tensor_split_idx", lambda x: x.tensor_split([1, 4], dim=1)[1], lambda: (R(3, 6),))
T("diff", lambda x: torch.diff(x, n=2, dim=0), lambda: (R(5, 3),))
T("outer_einsum", lambda a, b: torch.einsum("i,j->ij", a, b), lambda: (R(3), R(4)))
T("einsum_bmm_trace", lambda a, b: torch.einsum("bij,bjk->b", a, b), lambda: (R(2, 3, 4), R(2, 4, 3)))
T("matmul_1d_2d", lambda a, b: a @ b, lambda: (R(4), R(4, 3)))
T("matmul_bcast", lambda a, b: a @ b, lambda: (R(2, 1, 3, 4), R(3, 4, 5)))
T("matmul_int", lambda a, b: a @ b, lambda: (I(5, 3, 4), I(5, 4, 2)), train=False)
T("baddbmm_beta", lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2), lambda: (R(2, 3, 5), R(2, 3, 4),
                                                                                   R(2, 4, 5)))
T("addcmul_value", lambda x, a, b: torch.addcmul(x, a, b, value=-0.5), lambda: (R(3, 4), R(3, 4), R(4)))
T("lerp_tensor_w", lambda a, b, w: torch.lerp(a, b, w), lambda: (R(3, 4), R(3, 4), U(3, 4)))
T("hypot_atan2", lambda a, b: (torch.hypot(a, b), torch.atan2(a, b)), lambda: (R(3, 4), R(3, 4)))
T("sign_sgn_signbit", lambda x: (x.sign(), torch.signbit(x), x.sgn()), lambda: (R(6),), train=False)
T("round_decimals", lambda x: x.round(decimals=2), lambda: (R(6) * 10,), train=False)
T("round_half_even", lambda x: torch.round(x), lambda: (torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 3.7]),),
  train=False)
T("nan_to_num", lambda x: torch.nan_to_num(x.log(), nan=0.5, neginf=-7.0), lambda: (R(8),), train=False)
T("isfinite_isinf", lambda x: (torch.isfinite(1 / x), torch.isinf(1 / x)), lambda: (R(6).round(),), train=False)
T("float_to_int_cast", lambda x: (x * 10).long(), lambda: (R(8),), train=False)
T("float_to_uint8_cast", lambda x: (x * 10).abs().to(torch.uint8), lambda: (R(8),), train=False)
T("bool_cast", lambda x: x.bool().int(), lambda: (R(8).round(),), train=False)
T("arange_like", lambda x: x + torch.arange(x.shape[-1], dtype=x.dtype), lambda: (R(3, 4),))
T("arange_float_step", lambda x: x * torch.arange(0.0, 1.0, 0.3), lambda: (R(2, 4),))
T("linspace", lambda x: x * torch.linspace(-1, 1, 5), lambda: (R(3, 5),))
T("full_like_int", lambda x: torch.full_like(x, 7) + x, lambda: (I(5, 3),), train=False)
T("new_zeros_ones", lambda x: x.new_ones(2, 3) + x.new_zeros(3) + x[:2, :3], lambda: (R(3, 4),))
T("view_as_complex_like_reshape", lambda x: x.view(2, -1).t().reshape(-1), lambda: (R(4, 3),))
T("unsqueeze_neg_squeeze_multi", lambda x: x.unsqueeze(-1).squeeze((0, 2)), lambda: (R(1, 4, 1),))
T("movedim", lambda x: x.movedim((0, -1), (-1, 1)), lambda: (R(2, 3, 4),))
T("swapaxes_contig", lambda x: x.swapaxes(0, 2).contiguous().view(-1), lambda: (R(2, 3, 4),))
T("as_strided", lambda x: x.as_strided((3, 3), (1, 2)) * 2, lambda: (R(8),))
T("unfold_method", lambda x: x.unfold(1, 3, 2).sum(-1), lambda: (R(2, 8),))
T("expand_neg1", lambda x: x.expand(-1, 4) * 2, lambda: (R(3, 1),))
T("any_all_dims", lambda x: (x.any(-1), x.all(0), (x > 0).all()), lambda: (R(3, 4) > 0,), train=False)
T("count_nonzero", lambda x: torch.count_nonzero(x.round(), dim=1), lambda: (R(3, 5),), train=False)
T("eq_scalar_int_float", lambda x: (x == 2.0, x > 1.5), lambda: (I(5, 6),), train=False)
T("pow_scalar_base", lambda x: 2 ** x + x ** 0.5, lambda: (P(6),))
T("pow_tensor_tensor_neg_base", lambda a, b: a ** b, lambda: (R(6), torch.tensor([2.0, 3.0, 0.5, 1.0, 0.0, -1.0])),
  train=False)
T("rsub_scalar", lambda x: 1 - x + (2 - x) * 3, lambda: (R(6),))
T("softmax_method_neg", lambda x: x.softmax(-2), lambda: (R(3, 4, 2),))
T("int_tensor_truediv_scalar", lambda x: x / 2, lambda: (I(9, 6, low=-8),), train=False)
T("int_mean_raises", lambda x: x.mean(), lambda: (I(5, 4),), train=False)
T("sum_int_dtype_out", lambda x: x.sum(dtype=torch.float32), lambda: (I(5, 4),), train=False)
T("sum_bool_dim", lambda x: x.sum(-1), lambda: (B(3, 5),), train=False)
T("max_binary_int_float", lambda x, y: torch.max(x, y), lambda: (I(5, 4), R(4)), train=False)
T("std_single_elem", lambda x: x.std(0), lambda: (R(1, 3),), train=False)
T("inplace_add_broadcast_self", lambda x, y: x.clone().add_(y), lambda: (R(3, 4), R(4)))
T("inplace_promote_raises", lambda x, y: x.clone().add_(y), lambda: (I(5, 3), R(3)), train=False)
T("setitem_bool_mask_scalar", lambda x: _setitem_mask(x), lambda: (R(4, 5),))
T("setitem_int_index_tensor", lambda x, i: _setitem_idx(x, i), lambda: (R(4, 5), I(4, 3)))
T("setitem_step_slice", lambda x: _setitem_step(x), lambda: (R(6, 5),))

T("promo_uint8_int8", lambda a, b: a + b, lambda: (I(255, 6).to(torch.uint8), I(100, 6, low=-100).to(torch.int8)),
  train=False)
T("promo_int_0d_double", lambda a, b: a * b, lambda: (I(9, 6, low=-8), torch.tensor(1.5, dtype=torch.float64)),
  train=False)
T("promo_half_0d_float", lambda a, b: a * b, lambda: (R(6, dtype=torch.float16), R()))
T("promo_int32_0d_int64", lambda a, b: a + b, lambda: (I(9, 6).int(), torch.tensor(2 ** 33)), train=False)
T("promo_bool_python_int", lambda a: a + 3, lambda: (B(6),), train=False)
T("promo_bool_python_float", lambda a: a * 0.5, lambda: (B(6),), train=False)
T("promo_int_div_python_int", lambda a: a / 4, lambda: (I(9, 6, low=-8),), train=False)
T("promo_float64_input", lambda a, b: a + b, lambda: (R(3, dtype=torch.float64), R(3)))
T("sum_int32_to_int64", lambda a: (a.sum(), a.sum(0), a.cumsum(0)), lambda: (I(2 ** 30, 4, 3).int(),), train=False)
T("sum_uint8", lambda a: a.sum(-1), lambda: (I(255, 3, 50).to(torch.uint8),), train=False)
T("prod_bool", lambda a: a.prod(-1), lambda: (B(3, 4),), train=False)
T("mean_bf16_long", lambda a: a.mean(-1), lambda: (R(2, 300, dtype=torch.bfloat16) + 3,))
T("var_half", lambda a: a.var(-1), lambda: (R(2, 40, dtype=torch.float16) * 10 + 50,))
T("sum_dim_empty_tuple", lambda a: a.sum(dim=()), lambda: (R(2, 3),), train=False)
T("amax_0d_keepdim", lambda a: a.amax(0, keepdim=True), lambda: (R(),))
T("argmax_bool", lambda a: a.argmax(1), lambda: (B(3, 5),), train=False)
T("topk_int", lambda a: torch.topk(a, 2), lambda: (I(5, 3, 6),), train=False)
T("sort_int_stable", lambda a: torch.sort(a, stable=True), lambda: (I(3, 2, 9),), train=False)
T("sort_nan", lambda a: torch.sort(a.masked_fill(a > 1, float("nan"))), lambda: (R(2, 6),), train=False)
T("bucketize", lambda a, b: torch.bucketize(a, b), lambda: (R(3, 4), torch.tensor([-1.0, 0.0, 0.5])), train=False)
T("searchsorted_right", lambda s, v: torch.searchsorted(s, v, right=True),
  lambda: (torch.sort(R(3, 5)).values, R(3, 2)), train=False)
T("histc", lambda a: torch.histc(a, bins=4, min=-1, max=1), lambda: (R(20),), train=False)
T("index_put_accumulate_dups", lambda x, i, v: x.index_put((i,), v, accumulate=True),
  lambda: (R(5), I(5, 5), R(5)))
T("index_fill_neg_dim", lambda x, i: x.index_fill(-1, i, -3.0), lambda: (R(3, 4), torch.tensor([0, 2])))
T("take", lambda x, i: torch.take(x, i), lambda: (R(3, 4), torch.tensor([[0, 11], [-1, 5]])))
T("take_oob", lambda x, i: torch.take(x, i), lambda: (R(3, 4), torch.tensor([0, 12])))
T("take_along_dim_neg", lambda x, i: torch.take_along_dim(x, i, dim=-1), lambda: (R(3, 4), I(4, 3, 2)))
T("scatter_reduce_prod", lambda x, i, s: x.scatter_reduce(0, i, s, "prod"), lambda: (R(3, 4), I(3, 2, 4), R(2, 4)),
  train=False)
T("scatter_value_dim_last", lambda x, i: x.scatter(-1, i, 2.5), lambda: (R(3, 4), I(4, 3, 1)))
T("scatter_oob", lambda x, i: x.scatter(1, i, 1.0), lambda: (R(3, 4), torch.tensor([[0], [4], [1]])), train=False)
T("masked_fill_int_from_float", lambda x, m: x.masked_fill(m, 2), lambda: (I(9, 3, 4), B(3, 4)), train=False)
T("where_cond_int_mask", lambda m, x: torch.where(m > 0, x, -x), lambda: (I(3, 3, 4, low=-1), R(3, 4)))
T("float_mod_zero", lambda x: torch.remainder(x, 0.0), lambda: (R(5),), train=False)
T("float_div_zero", lambda x, y: (x / y, x // y), lambda: (R(5), torch.tensor([0.0, -0.0, 1.0, 0.0, 2.0])),
  train=False)
T("int_remainder_neg_scalar", lambda x: (x % -3, torch.remainder(x, 4)), lambda: (I(9, 8, low=-8),), train=False)
T("int_floor_div_neg_scalar", lambda x: (x // -3, torch.floor_divide(x, 2)), lambda: (I(9, 8, low=-8),),
  train=False)
T("int_min_div_neg1", lambda x: x // -1, lambda: (torch.tensor([-(2 ** 62), 5, -7]),), train=False)
T("round_neg_decimals", lambda x: x.round(decimals=-1), lambda: (R(6) * 100,), train=False)
T("float_to_int32_trunc", lambda x: (x * 10).to(torch.int32), lambda: (R(8),), train=False)
T("bool_to_float_ops", lambda m, x: m.float() * x - m.to(x.dtype), lambda: (B(6), R(6)))
T("clamp_int_tensor_bounds", lambda x, lo: x.clamp(min=lo, max=5), lambda: (I(9, 6, low=-8), I(3, 6, low=-3)),
  train=False)
T("clamp_half_bounds", lambda x: x.clamp(-0.3, 0.4), lambda: (R(8, dtype=torch.float16),))
T("where_half_scalar", lambda c, x: torch.where(c, x, 1e-4), lambda: (B(8), R(8, dtype=torch.float16)))
T("minmax_dim_keep_neg", lambda x: (x.min(-1, keepdim=True), x.max(-2)), lambda: (R(3, 4),))
T("aminmax", lambda x: torch.aminmax(x, dim=0), lambda: (R(3, 4),), train=False)
T("nansum_nanmean", lambda x: (x.masked_fill(x > 1, float("nan")).nansum(-1),
                               x.masked_fill(x > 1, float("nan")).nanmean(0)), lambda: (R(3, 4),), train=False)
T("logaddexp", lambda a, b: (torch.logaddexp(a, b), torch.logaddexp2(a * 30, b)), lambda: (R(5), R(5)))
T("xlogy_special", lambda a, b: (torch.xlogy(a, b), torch.special.xlog1py(a, b)),
  lambda: (torch.tensor([0.0, 1.0, 2.0, 0.0]), torch.tensor([0.0, 0.5, 3.0, -1.0])), train=False)
T("erfinv_lgamma_digamma", lambda x: (torch.erfinv(x * 0.9), torch.lgamma(x + 2), torch.digamma(x + 2)),
  lambda: (U(6),))
T("copysign_nextafter", lambda a, b: (torch.copysign(a, b), torch.nextafter(a, b)), lambda: (R(5), R(5)),
  train=False)
T("frac_trunc_neg", lambda x: (x.frac(), x.trunc(), x.fix()), lambda: (R(6) * 3,), train=False)
T("sigmoid_extreme", lambda x: torch.sigmoid(x * 100), lambda: (R(8),))
T("log_softmax_extreme", lambda x: F.log_softmax(x * 1000, -1), lambda: (R(3, 5),))
T("softmax_bf16_in_f32_out", lambda x: F.softmax(x, -1, dtype=torch.float32), lambda: (R(3, 5, dtype=torch.bfloat16),))
T("matmul_half", lambda a, b: a @ b, lambda: (R(3, 8, dtype=torch.float16), R(8, 4, dtype=torch.float16)))
T("inplace_chain_views", lambda x: _inplace_chain(x), lambda: (R(4, 6),))
T("inplace_expanded_source", lambda x, y: x.clone().copy_(y.expand(4, 6)), lambda: (R(4, 6), R(1, 6)))
T("inplace_unsqueeze_view", lambda x: _inplace_unsq(x), lambda: (R(3, 4),))
T("inplace_on_input_view_returned", lambda x: x.view(-1)[2:5].fill_(1.5), lambda: (R(3, 4),), train=False)
T("inplace_input_transposed", lambda x: x.t().mul_(2), lambda: (R(3, 4),), train=False)
T("inplace_int_div_raises", lambda x: x.clone().div_(2), lambda: (I(9, 4),), train=False)
T("detach_inplace", lambda x: x.detach().mul(2) + x, lambda: (R(3),))
T("t_on_1d", lambda x: x.t() * 2, lambda: (R(4),))
T("reshape_noncontig", lambda x: x.t().reshape(-1, 2), lambda: (R(4, 3),))
T("view_dtype_bits", lambda x: x.view(torch.int32) & 0xFF, lambda: (R(6),), train=False)
T("flatten_0d", lambda x: x.flatten() * 2, lambda: (R(),))
T("squeeze_non1_dim", lambda x: x.squeeze(1) + 1, lambda: (R(3, 4),))
T("diag_embed", lambda x: torch.diag_embed(x, offset=-1), lambda: (R(2, 3),))
T("diagonal_neg_offset", lambda x: x.diagonal(-1, 0, 1) * 2, lambda: (R(4, 5),))
T("triu_indices_use", lambda x: x[tuple(torch.triu_indices(4, 4, 1))], lambda: (R(4, 4),))
T("stack_neg_dim", lambda a, b: torch.stack([a, b], -1), lambda: (R(3, 2), R(3, 2)))
T("cat_mixed_dtype", lambda a, b: torch.cat([a, b], 0), lambda: (I(5, 2, 3), R(2, 3)), train=False)
T("cat_neg_dim_noncontig", lambda a, b: torch.cat([a.t(), b], -1), lambda: (R(4, 3), R(3, 2)))
T("meshgrid_ij_xy", lambda a, b: (*torch.meshgrid(a, b, indexing="xy"),), lambda: (R(3), R(4)))
T("cross", lambda a, b: torch.linalg.cross(a, b, dim=0), lambda: (R(3, 4), R(3, 4)))
T("cumsum_empty", lambda x: x.cumsum(0), lambda: (R(0, 3),))
T("softmax_empty", lambda x: x.softmax(-1), lambda: (R(0, 3),))
T("argmax_empty_raises", lambda x: x.argmax(), lambda: (R(0),), train=False)
T("topk_k_too_big_raises", lambda x: torch.topk(x, 5), lambda: (R(3),), train=False)
T("reshape_bad_raises", lambda x: x.view(5, -1), lambda: (R(3, 4),), train=False)
T("add_shape_mismatch_raises", lambda x, y: x + y, lambda: (R(3, 4), R(3)), train=False)
T("matmul_shape_raises", lambda x, y: x @ y, lambda: (R(3, 4), R(3, 4)), train=False)


def _inplace_chain(x):
    y = x.clone()
    a = y[1:, :]
    b = a.t()[2:4]
    b.add_(1).mul_(-1)
    return y, b


def _inplace_unsq(x):
    y = x.clone()
    y.unsqueeze(0)[0, 1].sub_(5)
    return y


def _inplace_view(x):
    y = x.clone()
    v = y[1:3, ::2]
    v.mul_(3).add_(1)
    return y, v


def _inplace_tview(x):
    y = x * 1.0
    y.t()[1:].sub_(y.t()[:-1].sum())
    return y


def _inplace_int(x):
    y = x.clone()
    y[:, 1].fill_(2)
    y[0] += 1
    return y


def _setitem_mask(x):
    y = x.clone()
    y[y > 0.3] = -1.0
    return y


def _setitem_idx(x, i):
    y = x.clone()
    y[i] = y[i] * 2  # duplicate indices: last write wins in both
    return y


def _setitem_step(x):
    y = x.clone()
    y[::2, 1::2] = 0.25
    y[-1] *= 2
    return y


# ---------------------------------------------------------------- the runner

class _Timeout(Exception):
    pass


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().splitlines()[0][:160])


def _leaves(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, dict):
        return [leaf for k in sorted(value) for leaf in _leaves(value[k])]
    if hasattr(value, "_fields"):
        return _leaves(tuple(value))
    return [value]


def _fresh_inputs(case: Case, seed: int) -> tuple:
    """Seeds 1-2: the case's shapes; seeds 3, 4 (--grow): leading dims 1 and 2 larger."""
    global _GROW
    torch.manual_seed(seed)
    _GROW = max(0, seed - 2)
    try:
        return case.inputs()
    finally:
        _GROW = 0


def _build(case: Case) -> Any:
    torch.manual_seed(1234)
    return case.build()


def _to64(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.double() if v.is_floating_point() else v
    if isinstance(v, (tuple, list)):
        return type(v)(_to64(x) for x in v)
    return v


def _clone_inputs(v: Any, grad: bool) -> Any:
    if isinstance(v, torch.Tensor):
        t = v.detach().clone()
        if grad and t.is_floating_point():
            t.requires_grad_(True)
        return t
    if isinstance(v, (tuple, list)):
        return type(v)(_clone_inputs(x, grad) for x in v)
    return v


class _Mismatch(Exception):
    pass


def _run_both(obj: Any, compiled: Any, eager_args: Any, compiled_args: Any) -> Any:
    """(eager's result, the compiled result); None when both raise, the compiled call an
    instance of eager's exception type. Raising where eager does not re-raises; another type,
    or no error where eager raises, is a _Mismatch."""
    try:
        want = _call(obj, eager_args)
    except Exception as exc:  # eager raises: kiln must raise the same type
        want = exc
    try:
        got = _call(compiled, compiled_args)
    except Exception as exc:
        if isinstance(want, Exception):
            if not isinstance(exc, type(want)):
                raise _Mismatch(f"raises {type(exc).__name__} where eager raises "
                                f"{type(want).__name__}") from exc
            return None
        raise
    if isinstance(want, Exception):
        raise _Mismatch(f"no error where eager raises {type(want).__name__}: {want}")
    return want, got


def _compare(what: str, e: Any, k: Any, ref: Any | None, tol: dict) -> str:
    """'' when kiln's value is eager's, 'fp64' when forgiven against a float64 reference."""
    if isinstance(e, torch.Tensor) != isinstance(k, torch.Tensor):
        raise _Mismatch(f"{what} type {type(e).__name__} vs {type(k).__name__}")
    if not isinstance(e, torch.Tensor):
        if e != k and not (isinstance(e, float) and math.isnan(e) and math.isnan(k)):
            raise _Mismatch(f"{what} value {e!r} vs {k!r}")
        return ""
    if e.shape != k.shape:
        raise _Mismatch(f"{what} shape {tuple(e.shape)} vs {tuple(k.shape)}")
    if e.dtype != k.dtype:
        raise _Mismatch(f"{what} dtype {e.dtype} vs {k.dtype}")
    e, k = e.detach(), k.detach()
    if not (e.is_floating_point() or e.is_complex()):
        if not torch.equal(e, k):
            diff = (e.long() - k.long()).abs().max().item() if e.numel() else 0
            raise _Mismatch(f"{what} values maxdiff {diff}")
        return ""
    rtol, atol = tol.get(e.dtype, TOL.get(e.dtype, (1e-4, 1e-5)))
    if torch.allclose(k, e, rtol=rtol, atol=atol, equal_nan=True):
        return ""
    bad_nan = (e.isnan() != k.isnan()).any().item()
    fin = ~(e.isnan() | k.isnan())
    diff = (e[fin].double() - k[fin].double()).abs().max().item() if fin.any() else float("nan")
    if ref is not None and not bad_nan and isinstance(ref, torch.Tensor) and ref.shape == e.shape:
        r = ref.detach().double()
        err_e = (e.double() - r).abs().nan_to_num(0).max().item()
        err_k = (k.double() - r).abs().nan_to_num(0).max().item()
        if err_k <= 1.5 * err_e + 1e-6:
            return "fp64"
    raise _Mismatch(f"{what} maxdiff {diff:.3g}" + (" nan" if bad_nan else ""))


def _call(fn, args):
    return fn(*args)


def _run_infer(case: Case, backend: str, seeds: tuple[int, ...]) -> str:
    import kiln
    obj = _build(case)
    is_mod = isinstance(obj, nn.Module)
    if is_mod:
        obj.eval()
    compiled_obj = copy.deepcopy(obj) if is_mod else obj
    compiled = kiln.compile(compiled_obj, backend=backend)
    notes = set()
    for seed in seeds:
        args = _fresh_inputs(case, seed)
        with torch.no_grad():
            both = _run_both(obj, compiled, _clone_inputs(args, False),
                             _clone_inputs(args, False))
            if both is None:
                continue
            want, got = both
            ref = None
            ws, gs = _leaves(want), _leaves(got)
            if len(ws) != len(gs):
                raise _Mismatch(f"output count {len(ws)} vs {len(gs)}")
            for i, (w, g) in enumerate(zip(ws, gs)):
                try:
                    notes.add(_compare(f"out{i}", w, g, None, {}))
                except _Mismatch:
                    if ref is None and case.ref64:
                        ref = _leaves(_ref64(case, obj, args))
                    notes.add(_compare(f"out{i}", w, g, ref[i] if ref else None, {}))
    return "fp64" if "fp64" in notes else ""


def _ref64(case: Case, obj: Any, args: tuple) -> Any:
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        o = copy.deepcopy(obj).double() if isinstance(obj, nn.Module) else obj
        with torch.no_grad():
            return _call(o, _clone_inputs(_to64(args), False))
    except Exception:
        return None
    finally:
        torch.set_default_dtype(prev)


def _real(value: torch.Tensor) -> torch.Tensor:
    return value.real if value.is_complex() else value  # a complex loss has no implicit grad


def _grads(obj: Any, args: tuple, out: Any, seed: int) -> tuple[list, list]:
    torch.manual_seed(seed + 999)
    outs = [o for o in _leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    if outs:
        loss = sum(_real((o * torch.randn(o.shape).to(o.dtype)).sum()) for o in outs)
        loss.backward()
    in_grads = [a.grad for a in _leaves(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    p_grads, bufs = [], []
    if isinstance(obj, nn.Module):
        p_grads = [p.grad for _, p in obj.named_parameters()]
        bufs = [b for _, b in obj.named_buffers()]
    return in_grads + p_grads, bufs


def _run_train(case: Case, backend: str, seeds: tuple[int, ...]) -> str:
    import kiln
    obj = _build(case)
    is_mod = isinstance(obj, nn.Module)
    if is_mod:
        obj.train(not case.eval_in_train)
    cobj = copy.deepcopy(obj) if is_mod else obj
    compiled = kiln.compile(cobj, backend=backend)
    notes = set()
    for seed in seeds:
        args = _fresh_inputs(case, seed)
        if is_mod:
            obj.zero_grad(set_to_none=True)
            cobj.zero_grad(set_to_none=True)
        ea = _clone_inputs(args, case.grad_inputs)
        ka = _clone_inputs(args, case.grad_inputs)
        both = _run_both(obj, compiled, ea, ka)
        if both is None:
            continue
        want, got = both
        ws, gs = _leaves(want), _leaves(got)
        if len(ws) != len(gs):
            raise _Mismatch(f"output count {len(ws)} vs {len(gs)}")
        for i, (w, g) in enumerate(zip(ws, gs)):
            notes.add(_compare(f"out{i}", w, g, None, {}))
        both_grads = _run_both(lambda: _grads(obj, ea, want, seed),
                               lambda: _grads(cobj, ka, got, seed), (), ())
        if both_grads is None:  # eager's backward raises (no derivative): kiln's the same
            continue
        (eg, eb), (kg, kb) = both_grads
        for i, (w, g) in enumerate(zip(eg, kg)):
            if w is None and g is None:
                continue
            if (w is None) != (g is None):
                raise _Mismatch(f"grad{i} {'None' if w is None else 'set'} vs {'None' if g is None else 'set'}")
            notes.add(_compare(f"grad{i}", w, g, None, GRAD_TOL))
        for i, (w, g) in enumerate(zip(eb, kb)):
            notes.add(_compare(f"buffer{i}", w, g, None, GRAD_TOL))
    return "fp64" if "fp64" in notes else ""


def run_case(case: Case, backend: str, timeout: float, verbose: bool,
             seeds: tuple[int, ...] = (1, 2)) -> tuple[str, str, str]:
    import kiln
    from kiln import records
    if backend == "kiln" and not case.infer or backend != "kiln" and not case.train:
        return "skip", "", ""
    kiln.reset()
    handler = _Warnings()
    logging.getLogger("kiln").addHandler(handler)
    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    old = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    detail = ""
    try:
        runner = _run_infer if backend == "kiln" else _run_train
        note = runner(case, "kiln" if backend == "kiln_train" else backend, seeds)
        result = "ok(fp64)" if note == "fp64" else "ok"
        if handler.messages:
            result, detail = "fallback", handler.messages[0]
    except _Mismatch as exc:
        result, detail = "mismatch", str(exc)
    except _Timeout:
        result, detail = "timeout", f"> {timeout:.0f} s"
    except Exception as exc:  # kiln raised where eager did not
        result = "crash"
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        if verbose:
            traceback.print_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        logging.getLogger("kiln").removeHandler(handler)
        records.active_recorders().remove(recorder)
    if result in ("mismatch", "crash") and handler.messages:
        detail += f" [after warning: {handler.messages[0]}]"
    ops = sum(len(g.ops) for g in recorder.graphs)
    cover = f"g{len(recorder.graphs)}/b{len(recorder.breaks)}/ops{ops}/k{len(recorder.pipeline_timings)}"
    return result, detail, cover


def _raise_timeout(signum, frame):
    raise _Timeout()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="kiln,aot_eager")
    ap.add_argument("--only", default="", help="regex on case names")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--grow", action="store_true",
                    help="two more calls with leading dims 1 and 2 larger (kiln's dynamic shapes)")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if re.search(args.only, c.name)]
    if args.list:
        for c in cases:
            print(c.name)
        return 0
    backends = [b for b in args.backend.split(",") if b]
    return run_cases(cases, backends, args.timeout, args.verbose,
                     (1, 2, 3, 4) if args.grow else (1, 2), args.json)


def run_cases(cases: list[Case], backends: list[str], timeout: float, verbose: bool,
              seeds: tuple[int, ...], json_path: str = "") -> int:
    """Every case under every backend: a row printed each, the summary last, the rows in
    `json_path`; 1 when any case mismatched, crashed or timed out."""
    from kiln.config import config
    config.cpu_codegen = "triton_interpret" if not torch.cuda.is_available() else config.cpu_codegen
    os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln_sweep_cache_"))
    rows = []
    width = max((len(c.name) for c in cases), default=10)
    for case in cases:
        for backend in backends:
            t0 = time.perf_counter()
            result, detail, cover = run_case(case, backend, timeout, verbose, seeds)
            if result == "skip":
                continue
            rows.append({"case": case.name, "backend": backend, "result": result, "detail": detail,
                         "coverage": cover, "seconds": round(time.perf_counter() - t0, 2)})
            print(f"{case.name:<{width}}  {backend:<10}  {cover:<20} {result:<9} {detail}",
                  flush=True)
    print()
    summary: dict[str, dict[str, int]] = {}
    for r in rows:
        summary.setdefault(r["backend"], {}).setdefault(r["result"], 0)
        summary[r["backend"]][r["result"]] += 1
    for backend, counts in summary.items():
        print(f"{backend}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"rows": rows, "summary": summary}, fh, indent=1)
    return 1 if any(r["result"] in ("mismatch", "crash", "timeout") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
