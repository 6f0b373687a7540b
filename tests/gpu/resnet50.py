"""ResNet-50 without torchvision (the GPU machine has none): its 161 parameter shapes,
in torchvision's order, and a plain-torch model with exactly those parameters, for the
GPU checks and benchmark."""
from __future__ import annotations

WIDTHS = (64, 128, 256, 512)
BLOCKS = (3, 4, 6, 3)
EXPANSION = 4


def resnet50_parameter_shapes() -> list[tuple[int, ...]]:
    """The shapes of torchvision's resnet50().parameters(), in order (25,557,032
    values, about 102 MB in float32)."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    channels = 64
    for width, blocks in zip(WIDTHS, BLOCKS):
        for block in range(blocks):
            out = width * EXPANSION
            shapes += [(width, channels, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (out, width, 1, 1), (out,), (out,)]
            if block == 0:
                shapes += [(out, channels, 1, 1), (out,), (out,)]
            channels = out
    return shapes + [(1000, 2048), (1000,)]


def resnet50(num_classes: int = 1000):
    """A ResNet-50 (v1.5: stride on the 3x3 convolution) in plain torch."""
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, channels: int, width: int, stride: int) -> None:
            super().__init__()
            out = width * EXPANSION
            self.conv1 = nn.Conv2d(channels, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, out, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or channels != out:
                self.downsample = nn.Sequential(nn.Conv2d(channels, out, 1, stride, bias=False),
                                                nn.BatchNorm2d(out))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self.relu(self.bn3(self.conv3(y)) + identity)

    layers: list = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                    nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    channels = 64
    for index, (width, blocks) in enumerate(zip(WIDTHS, BLOCKS)):
        for block in range(blocks):
            layers.append(Bottleneck(channels, width, 2 if block == 0 and index else 1))
            channels = width * EXPANSION
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)]
    return nn.Sequential(*layers)
