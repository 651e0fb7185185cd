"""The allocator-history replay behind `gpurec tools peak-breakdown` (a fake snapshot in the
format of torch.cuda.memory._snapshot(); the GPU run itself needs a GPU)."""

from __future__ import annotations

import pytest

from gpurec.collect.peak_breakdown import live_at_peak, peak_breakdown


def _frames(line: int) -> list[dict]:
    return [{"filename": "/x/site-packages/torch/nn/modules/conv.py", "line": 543, "name": "_conv_forward"},
            {"filename": "/x/gpurec/collect/runner.py", "line": line, "name": "step"}]


def test_live_at_peak_replays_allocations_and_requested_frees() -> None:
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": _frames(10)},
        {"action": "alloc", "addr": 2, "size": 300, "frames": _frames(10)},
        {"action": "free_requested", "addr": 1, "size": 100},
        {"action": "free_completed", "addr": 1, "size": 100},  # counted once, when requested
        {"action": "alloc", "addr": 3, "size": 250, "frames": _frames(20)},  # 550 + baseline: the peak
        {"action": "free_requested", "addr": 2, "size": 300},
        {"action": "alloc", "addr": 4, "size": 200, "frames": []},
        {"action": "free_requested", "addr": 99, "size": 5},  # allocated before recording: ignored
    ]
    out = live_at_peak({"device_traces": [trace]}, baseline_bytes=1000)
    assert out["peak_bytes"] == 1550 and out["peak_event"] == 4
    assert [(g["bytes"], g["blocks"]) for g in out["groups"]] == [(300, 1), (250, 1)]
    assert out["groups"][0]["where"] == "runner.py:10 step > conv.py:543 _conv_forward"
    assert out["groups"][0]["largest"] == [300]
    with pytest.raises(ValueError, match="_record_memory_history"):
        live_at_peak({"device_traces": []}, 0)


def test_peak_breakdown_says_it_needs_a_gpu() -> None:
    import torch

    from gpurec.device.errors import NVMLUnavailable

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(NVMLUnavailable, match="needs a CUDA GPU"):
        peak_breakdown("resnet18:b1:r224")


def test_backward_allocations_are_named_by_their_autograd_node_when_cpp_frames_are_recorded() -> None:
    native = [{"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc(void**, int)"},
              {"filename": "??", "line": 0, "name": "at::native::empty_cuda(c10::ArrayRef<long>)"},
              {"filename": "??", "line": 0,
               "name": "torch::autograd::generated::LogSoftmaxBackward0::apply(std::vector<at::Tensor>&&)"}]
    trace = [{"action": "alloc", "addr": 1, "size": 40, "frames": native},
             {"action": "alloc", "addr": 2, "size": 60, "frames": native},
             {"action": "alloc", "addr": 3, "size": 10, "frames": []}]
    out = live_at_peak({"device_traces": [trace]}, baseline_bytes=0)
    first = out["groups"][0]
    assert first["where"] == ("(C++) torch::autograd::generated::LogSoftmaxBackward0::apply > "
                              "at::native::empty_cuda")
    assert (first["bytes"], first["blocks"], first["largest"]) == (100, 2, [60, 40])
    assert out["groups"][1]["where"] == "(no Python frame)"
    with pytest.raises(ValueError, match="python' or 'all"):
        peak_breakdown("resnet18:b1:r224", stacks="cpp")
