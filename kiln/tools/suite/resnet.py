"""resnet: a ResNet-style CNN (7x7 stem conv, BatchNorm, ReLU, max pool, four stages of basic
blocks with a 1x1 conv + BatchNorm downsample where the shape changes, adaptive average pool, fc),
written the way torchvision's / timm's ResNet is.

Full: basic blocks [3, 4, 6, 3] at widths 64..512 (ResNet-34; the zoo's resnet50 uses bottleneck
blocks), 1000 classes, images [64, 3, 224, 224]. `forward(images)` returns logits [B, classes].
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from kiln.tools.suite.batch import Batch, classification_loss, image_batch

__all__ = ["NAME", "ResNetConfig", "ResNet", "BasicBlock", "make_model", "make_batch", "loss"]

NAME = "resnet"


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    layers: tuple[int, ...] = (3, 4, 6, 3)
    widths: tuple[int, ...] = (64, 128, 256, 512)
    num_classes: int = 1000
    batch: int = 64
    image: int = 224


SIZES = {"full": ResNetConfig(),
         "small": ResNetConfig(layers=(1, 1, 1, 1), widths=(8, 16, 32, 64), num_classes=10,
                               batch=2, image=64)}


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + shortcut)


class ResNet(nn.Module):
    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        stem = config.widths[0]
        self.conv1 = nn.Conv2d(3, stem, 7, 2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, padding=1)
        stages, inplanes = [], stem
        for i, (blocks, planes) in enumerate(zip(config.layers, config.widths)):
            stride = 1 if i == 0 else 2
            stage = [BasicBlock(inplanes, planes, stride)]
            stage += [BasicBlock(planes, planes) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*stage))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, config.num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):  # random affine so its gradients matter
                nn.init.normal_(module.weight, mean=1.0, std=0.1)
                nn.init.normal_(module.bias, std=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def make_model(size: str) -> nn.Module:
    return ResNet(SIZES[size])


def make_batch(size: str) -> Batch:
    c = SIZES[size]
    return image_batch(c.batch, c.image, c.num_classes)


loss = classification_loss
