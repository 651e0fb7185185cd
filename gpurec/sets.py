"""Model-input sets and the architecture lists both halves of gpurec share.

The GPU side plans and measures these sets; the CPU side trains on and reports them.  They
live here, with no imports, so that modelling and recommending never load collection code.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# The modes every operation and network is extracted, measured and predicted in.
MODES: tuple[str, ...] = ("inference", "training")

# The architectures measured per operation (the training set) ...
DATASET_ARCHS: tuple[str, ...] = (
    "alexnet", "vgg11", "vgg16", "resnet18", "resnet34", "resnet50", "resnet101", "resnext50_32x4d",
    "wide_resnet50_2", "densenet121", "squeezenet1_0", "googlenet", "mobilenet_v2", "mobilenet_v3_large",
    "mnasnet1_0", "shufflenet_v2_x1_0", "efficientnet_b0", "efficientnet_b3", "regnet_y_400mf",
    "regnet_y_1_6gf", "convnext_tiny", "vit_b_16", "vit_b_32", "swin_t",
)
DATASET_BATCH_SIZES: tuple[int, ...] = (1, 8, 32, 128)
# ... and the unseen test architectures: only ever measured as whole networks, never trained on.
TEST_ARCHS: tuple[str, ...] = (
    "vgg13_bn", "resnext101_32x8d", "densenet169", "efficientnet_b1", "regnet_x_800mf", "mnasnet0_5",
    "shufflenet_v2_x0_5", "swin_s", "squeezenet1_1",
)
TEST_BATCH_SIZES: tuple[int, ...] = (8, 64)
# Hand-written architectures (built by gpurec.synthsets, never torchvision classifiers) that
# target the operation kinds carrying the time error on unseen networks: measured per
# operation and whole, they join the training data like DATASET_ARCHS.
SYNTH_ARCHS: tuple[str, ...] = ("synthgconv", "synthdense", "synthwin", "synthse", "synthsd")
SYNTH_BATCH_SIZES: tuple[int, ...] = (8, 32, 128)
# Operation sweeps: many shapes of one kind side by side, measured per operation only (as a
# network they are not a meaningful step, and the wide ones would not fit in training).
SWEEP_ARCHS: tuple[str, ...] = ("sweepgconv", "sweepwindow")
SWEEP_BATCH_SIZES: tuple[int, ...] = (8, 32)


@dataclass(frozen=True)
class ModelInputSet:
    """A torchvision architecture on one input: ``arch:bBATCH:rRESOLUTION`` as a key."""

    arch: str
    batch: int
    resolution: int = 224

    @property
    def key(self) -> str:
        return f"{self.arch}:b{self.batch}:r{self.resolution}"

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, 3, self.resolution, self.resolution)

    @staticmethod
    def parse(key: str) -> ModelInputSet:
        """The set of a key such as ``resnet50:b32:r224``; ValueError names a malformed key."""
        try:
            arch, b, r = key.split(":")
            if not (b.startswith("b") and r.startswith("r")):
                raise ValueError
            return ModelInputSet(arch, int(b[1:]), int(r[1:]))
        except ValueError:
            raise ValueError(f"a model-input set key looks like 'resnet50:b32:r224', not {key!r}") from None


def model_input_sets(archs: Iterable[str], batch_sizes: Iterable[int],
                     resolutions: Iterable[int] = (224,)) -> list[ModelInputSet]:
    """Every (architecture, resolution, batch size) combination, in that nesting order."""
    batch_sizes = list(batch_sizes)
    resolutions = list(resolutions)
    return [ModelInputSet(a, b, r) for a in archs for r in resolutions for b in batch_sizes]
