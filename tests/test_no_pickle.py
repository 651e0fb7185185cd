"""Nothing gpurec loads can run pickled code: the profiling worker loads modules weights-only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from gpurec.profile.worker import UnsafeModelFile, WorkerSpec, load_module_file, module_globals

ROOT = Path(__file__).resolve().parents[1]
RAN: list[str] = []


def _mark(text: str) -> str:
    """Stands in for os.system: records that unpickling called it."""
    RAN.append(text)
    return text


class Payload:
    def __reduce__(self) -> tuple:
        return (_mark, ("pickled code ran",))


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                        torch.nn.Flatten(), torch.nn.Linear(4, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_a_saved_module_loads_weights_only_and_matches(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = TinyNet().eval()
    f = tmp_path / "model.pt"
    torch.save(net, f)
    declared = module_globals(f)
    assert f"{__name__}.TinyNet" in declared and "torch.nn.modules.conv.Conv2d" in declared
    loaded = load_module_file(f, declared).eval()
    x = torch.randn(2, 3, 8, 8)
    assert isinstance(loaded, TinyNet) and torch.equal(loaded(x), net(x))


def test_a_replaced_file_with_a_code_payload_is_refused_unrun(tmp_path: Path) -> None:
    net = TinyNet()
    good = tmp_path / "good.pt"
    torch.save(net, good)
    declared = module_globals(good)
    net.hook = Payload()  # type: ignore[attr-defined]  # what a swapped file could carry
    bad = tmp_path / "model.pt"
    torch.save(net, bad)
    RAN.clear()
    with pytest.raises(UnsafeModelFile, match=r"did not declare: \['test_no_pickle\._mark'\]"):
        load_module_file(bad, declared)
    assert RAN == []
    assert load_module_file(good, declared) is not None  # the file its saver wrote still loads


def test_a_file_that_is_not_a_module_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(2)}, f)
    with pytest.raises(UnsafeModelFile, match="not an nn.Module"):
        load_module_file(f, [])


def test_worker_takes_the_declared_globals_from_its_spec(tmp_path: Path) -> None:
    spec = WorkerSpec(model="TinyNet", batch_size=1, model_file="m.pt", model_globals=("a.B", "c.D"),
                      out_dir=str(tmp_path))
    back = WorkerSpec.read(spec.write(tmp_path / "spec.json"))
    assert list(back.model_globals) == ["a.B", "c.D"]


def test_no_unsafe_load_in_the_package() -> None:
    """No pickle-based load anywhere gpurec reads files (models, data, profiling)."""
    files = [*sorted((ROOT / "gpurec").rglob("*.py")), ROOT / "cli.py"]
    unsafe = re.compile(r"weights_only\s*=\s*False|pickle\.loads?\(|joblib\.load|allow_pickle\s*=\s*True")
    safe_torch_load = re.compile(r"torch\.load\(.*weights_only=True")  # one line per call, by convention
    hits = [f"{f.relative_to(ROOT)}:{n}: {line.strip()}" for f in files
            for n, line in enumerate(f.read_text().splitlines(), 1)
            if unsafe.search(line) or ("torch.load(" in line and not safe_torch_load.search(line))]
    assert hits == []


def test_profile_an_nn_module_instance_end_to_end_on_cpu(tmp_path: Path) -> None:
    """profile_network saves the module, declares its globals, and the worker child loads it."""
    import torchvision

    from gpurec.profile import profile_network

    net = torchvision.models.resnet18(num_classes=7)
    r = profile_network(net, 1, resolution=32, mode="inference", out_dir=tmp_path, ncu=False, device="cpu",
                        trace_timeout_s=300, plots=False, max_warmup_iters=3, max_warmup_s=5.0)
    assert r.meta["num_classes"] == 7 and r.meta["n_params"] == sum(p.numel() for p in net.parameters())
    spec = json.loads((tmp_path / "worker_trace_spec.json").read_text())
    assert "torchvision.models.resnet.ResNet" in spec["model_globals"] and spec["model_file"]
