"""Model registry: the paper's four CNN families at CPU size, for 1-D and 2-D inputs.

Each builder takes the sample shape (C, L) or (C, H, W) and the class count, and picks
Conv1d/Conv2d accordingly, so one name works on mnist1d signals and on digit images.

- ``small_cnn``: three conv layers, batch norm, global pooling (the embedded default).
- ``resnet_tiny``: residual network (ResNet basic blocks, 3 stages).
- ``vgg_tiny``: VGG-style stacks of 3x3 conv + BN + ReLU with max pooling.
- ``alexnet_tiny``: AlexNet-style: large first kernel, no batch norm, dropout classifier.
- ``mobilenet_tiny``: MobileNetV3-style inverted residuals with depthwise conv,
  squeeze-excite and hard-swish.

``tv_<name>``: any torchvision classification model by name, untrained (``tv_resnet18``,
``tv_resnet50``, ``tv_vgg11`` = VGG-11-BN, ``tv_alexnet``, ``tv_mobilenet_v3_large``: the
paper's four families), for 3-channel images. ``package.module:callable``: your own model,
a callable taking ``(input_shape, num_classes)`` and returning an ``nn.Module``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from tula.runtime.input import data as data_mod
from tula.runtime.input.data import import_callable
from tula.runtime.input.images import decode_on_device
from tula.runtime.input.loader import resident_bytes
from tula.runtime.train import recipe


class _Ops:
    """Layer constructors for 1-D or 2-D inputs."""

    def __init__(self, dim: int):
        if dim not in (1, 2):
            raise ValueError(f"inputs must be (C, L) or (C, H, W); got {dim} spatial dims")
        self.conv = nn.Conv1d if dim == 1 else nn.Conv2d
        self.bn = nn.BatchNorm1d if dim == 1 else nn.BatchNorm2d
        self.maxpool = nn.MaxPool1d if dim == 1 else nn.MaxPool2d
        self.avgpool = nn.AdaptiveAvgPool1d if dim == 1 else nn.AdaptiveAvgPool2d


def small_cnn(in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    o = _Ops(len(in_shape) - 1)
    c = in_shape[0]
    return nn.Sequential(
        o.conv(c, 32, 3, padding=1),
        o.bn(32),
        nn.ReLU(inplace=True),
        o.conv(32, 64, 3, padding=1),
        o.bn(64),
        nn.ReLU(inplace=True),
        o.maxpool(2),
        o.conv(64, 64, 3, padding=1),
        o.bn(64),
        nn.ReLU(inplace=True),
        o.avgpool(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


class _BasicBlock(nn.Module):
    def __init__(self, o: _Ops, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            o.conv(cin, cout, 3, stride, 1, bias=False),
            o.bn(cout),
            nn.ReLU(inplace=True),
            o.conv(cout, cout, 3, 1, 1, bias=False),
            o.bn(cout),
        )
        self.skip = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(o.conv(cin, cout, 1, stride, bias=False), o.bn(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet_tiny(in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    o = _Ops(len(in_shape) - 1)
    return nn.Sequential(
        o.conv(in_shape[0], 16, 3, 1, 1, bias=False),
        o.bn(16),
        nn.ReLU(inplace=True),
        _BasicBlock(o, 16, 16, 1),
        _BasicBlock(o, 16, 32, 2),
        _BasicBlock(o, 32, 64, 2),
        o.avgpool(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


def vgg_tiny(in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    o = _Ops(len(in_shape) - 1)
    layers: list[nn.Module] = []
    c = in_shape[0]
    for v in (32, "M", 64, "M", 128, 128):
        if v == "M":
            layers.append(o.maxpool(2))
        else:
            layers += [o.conv(c, v, 3, padding=1), o.bn(v), nn.ReLU(inplace=True)]
            c = v
    layers += [o.avgpool(1), nn.Flatten(), nn.Linear(c, num_classes)]
    return nn.Sequential(*layers)


def alexnet_tiny(in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    o = _Ops(len(in_shape) - 1)
    pooled = 2 ** (len(in_shape) - 1)  # 2 (1-D) or 2x2 (2-D) cells after adaptive pooling
    return nn.Sequential(
        o.conv(in_shape[0], 32, 5, padding=2),
        nn.ReLU(inplace=True),
        o.maxpool(2),
        o.conv(32, 64, 3, padding=1),
        nn.ReLU(inplace=True),
        o.conv(64, 64, 3, padding=1),
        nn.ReLU(inplace=True),
        o.avgpool(2),
        nn.Flatten(),
        nn.Dropout(0.5),
        nn.Linear(64 * pooled, 128),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.Linear(128, num_classes),
    )


class _SqueezeExcite(nn.Module):
    def __init__(self, o: _Ops, c: int, reduce: int = 4):
        super().__init__()
        self.pool = o.avgpool(1)
        self.fc = nn.Sequential(
            o.conv(c, c // reduce, 1),
            nn.ReLU(inplace=True),
            o.conv(c // reduce, c, 1),
            nn.Hardsigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.fc(self.pool(x))


class _InvertedResidual(nn.Module):
    def __init__(self, o: _Ops, cin: int, expand: int, cout: int, stride: int):
        super().__init__()
        self.residual = stride == 1 and cin == cout
        self.body = nn.Sequential(
            o.conv(cin, expand, 1, bias=False),
            o.bn(expand),
            nn.Hardswish(),
            o.conv(expand, expand, 3, stride, 1, groups=expand, bias=False),
            o.bn(expand),
            nn.Hardswish(),
            _SqueezeExcite(o, expand),
            o.conv(expand, cout, 1, bias=False),
            o.bn(cout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


def mobilenet_tiny(in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    o = _Ops(len(in_shape) - 1)
    return nn.Sequential(
        o.conv(in_shape[0], 16, 3, 1, 1, bias=False),
        o.bn(16),
        nn.Hardswish(),
        _InvertedResidual(o, 16, 32, 16, 1),
        _InvertedResidual(o, 16, 48, 24, 2),
        _InvertedResidual(o, 24, 72, 24, 1),
        _InvertedResidual(o, 24, 96, 40, 2),
        o.conv(40, 128, 1, bias=False),
        o.bn(128),
        nn.Hardswish(),
        o.avgpool(1),
        nn.Flatten(),
        nn.Linear(128, num_classes),
    )


Builder = Callable[[tuple[int, ...], int], nn.Module]

MODELS: dict[str, Builder] = {
    "small_cnn": small_cnn,
    "resnet_tiny": resnet_tiny,
    "vgg_tiny": vgg_tiny,
    "alexnet_tiny": alexnet_tiny,
    "mobilenet_tiny": mobilenet_tiny,
}


# tv_<name> is torchvision.models.get_model(<name>); tv_vgg11 keeps its earlier meaning, VGG-11 with
# batch norm (the paper trains VGG11 on CIFAR-100, where the plain one does not train from scratch).
TV_ALIASES = {"vgg11": "vgg11_bn"}
PAPER_TORCHVISION = (
    "tv_resnet18",
    "tv_resnet50",
    "tv_vgg11",
    "tv_alexnet",
    "tv_mobilenet_v3_large",
)


def _torchvision_builder(name: str) -> Builder:
    try:
        # only for tv_<name>: a broken torchvision names workload.model
        import torchvision.models as tvm
    except Exception as exc:  # noqa: BLE001 - ImportError, or a binary mismatch with this torch build
        raise ValueError(
            f"config key 'workload.model': {name} needs torchvision, which does not import here "
            f"({exc})"
        ) from None
    arch = TV_ALIASES.get(name[3:], name[3:])
    if arch not in tvm.list_models(module=tvm):
        raise ValueError(
            f"config key 'workload.model': torchvision has no classification model {arch!r} (from "
            f"{name!r}); e.g. {', '.join(PAPER_TORCHVISION)}"
        )

    def build(in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        if len(in_shape) != 3 or in_shape[0] != 3:
            raise ValueError(
                f"config key 'workload.model': torchvision's {arch} needs 3-channel images (3, H, "
                f"W); the dataset's samples are {tuple(in_shape)}"
            )
        return tvm.get_model(arch, weights=None, num_classes=num_classes)

    return build


def available() -> list[str]:
    """Names accepted by workload.model (besides package.module:callable)."""
    return [*MODELS, *PAPER_TORCHVISION]


def builder(spec: str) -> Builder:
    """The builder of a model name or ``package.module:callable``; errors name workload.model."""
    if spec in MODELS:
        return MODELS[spec]
    if spec.startswith("tv_"):
        return _torchvision_builder(spec)
    if ":" in spec:
        return import_callable(spec, "workload.model")
    raise ValueError(
        f"config key 'workload.model': unknown model {spec!r}; shipped: {', '.join(MODELS)}; "
        "torchvision: tv_<name> (e.g. tv_resnet18); yours: package.module:callable"
    )


def build_model(spec: str, in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build ``workload.model`` for samples of ``in_shape`` and ``num_classes`` classes."""
    try:
        model = builder(spec)(tuple(in_shape), num_classes)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's builder failed
        raise ValueError(
            f"config key 'workload.model': {spec}{tuple(in_shape), num_classes} raised "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"config key 'workload.model': {spec} returned a {type(model).__name__}, not a "
            "torch.nn.Module"
        )
    return model


def check_forward(spec: str, model: nn.Module, sample: torch.Tensor, num_classes: int) -> None:
    """One forward on a batch of two samples; the output must be (batch, num_classes)."""
    x = torch.stack([sample, sample])
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as exc:  # noqa: BLE001 - shape mismatch, wrong channel count, ...
        raise ValueError(
            f"config key 'workload.model': {spec} failed on a batch of dataset samples of shape "
            f"{tuple(x.shape)}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from None
    if not torch.is_tensor(out) or tuple(out.shape) != (2, num_classes):
        got = tuple(out.shape) if torch.is_tensor(out) else type(out).__name__
        raise ValueError(
            f"config key 'workload.model': {spec} must return logits of shape (batch, num_classes) "
            f"= (2, {num_classes}) for a batch of 2; got {got}"
        )


def check_workload(cfg) -> dict:
    """Everything about ``workload.model`` and ``workload.dataset`` that can be known without
    training: the data loads (files, folders, the user's callable, a first sample), the model
    builds and maps a batch of real samples to (batch, num_classes). Raises a ConfigError or
    ValueError naming the key; returns a description for results/workload.json."""
    d = data_mod.load_config(cfg)
    torch.manual_seed(cfg.workload.seed)
    model = build_model(cfg.workload.model, d.input_shape, d.num_classes)
    sample = d.as_input(d.train[0][0])
    check_forward(cfg.workload.model, model, sample, d.num_classes)
    params = sum(p.numel() for p in model.parameters())
    pairs = [d.train[i] for i in range(min(4, d.train_size))]
    xs = torch.stack([d.as_input(torch.as_tensor(p[0])) for p in pairs])
    training = recipe.check(cfg.train, model, xs, torch.as_tensor([int(p[1]) for p in pairs]))
    stored = data_mod.stored_image_size(d.train)
    # data.decode gpu on PNGs: refused here
    on_device = decode_on_device(cfg.data, cfg.hardware.device, d.train)
    return {
        **d.describe(),
        "model": cfg.workload.model,
        "parameters": params,
        "training": training,
        "stored_image_size": stored,
        "decode": ("gpu" if on_device else "cpu") if stored else None,
        "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        # an in-memory training set's stored bytes (None: read per sample): what a GPU keeps
        # of it where data.on_device lets it (tula.runtime.input.loader.keep_on_device)
        "train_bytes": resident_bytes(d),
    }


def compiled(module: torch.nn.Module) -> torch.nn.Module:
    """``train.compile: on``: torch.compile of the DDP module (its graph split at DDP's buckets, so
    the gradient all-reduce still overlaps backward). One graph per shape (``dynamic=False``):
    the full batch and an epoch's short last one each compile once, and a probe's sweep
    compiles each local batch it times, so the limit of graphs kept is raised."""
    import torch._dynamo  # only where train.compile is on

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 64))
    return torch.compile(module, dynamic=False)
