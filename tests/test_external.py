"""NeuSight ingest: a small synthetic artifact in NeuSight's layout goes through the real ingest."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import gpurec
from gpurec.dataset.external import HOST_DOMINATED_FACTOR, ExternalDataError, ingest_neusight

COMMIT = "6945927d9afcca2b9daf021f8395e53edc5b4eef"
_META = "Torch Version,CUDNN Version,Kernel Name,Warps per SM,Blocks per SM,Grid x,Grid y,Grid z,Block x,Block y,Block z,CUDA Version"


def _gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(text)


def _meta(device: str) -> str:
    return f"{device},p2.1.0,8902,k,1.0,0.5,2,3,4,128,1,1,cu121"


def _artifact(root: Path) -> Path:
    src = root / "neusight"
    src.mkdir()
    (src / "LICENSE").write_text("MIT License\n")
    (src / "SOURCE").write_text(f"sitar-lab/NeuSight commit {COMMIT}\n")
    head = f"OPName,Latency,Device,{_META},Kernels,B,M,N,K\n"
    _gz(src / "ops_train/linear/Tesla_T4.csv.gz",
        head + f"linear,0.05,{_meta('Tesla T4')},,1,8,8,8\n" + f"linear,2.05,{_meta('Tesla T4')},,1,1024,512,256\n")
    _gz(src / "ops_train/add/Tesla_P4.csv.gz",
        f"OPName,Latency,Device,{_META},B,H\n" + f"add,0.025,{_meta('Tesla P4')},4,8\n"
        + f"add,0.06,{_meta('Tesla P4')},1024,1024\n")
    _gz(src / "ops_train/conv/Tesla_T4.csv.gz",
        f"OPName,Latency,Device,{_META},Kernels,B,Input_Channel,Output_Channel,Kernel_Szie,Input_Size,Stride,Padding\n"
        + f"conv,0.07,{_meta('Tesla T4')},,1,3,8,3,8,1,1\n" + f"conv,1.0,{_meta('Tesla T4')},,2,16,32,3,32,2,1\n")
    _gz(src / "ops_train/ln/Tesla_P4.csv.gz",
        f"OPName,Latency,Device,{_META},Kernels,B,H\n" + f"ln,0.045,{_meta('Tesla P4')},,4,8\n")
    _gz(src / "ops_test/ln.csv.gz",
        f"OPName,Latency,Device,{_META},B,H,large\n" + f"ln,0.5,{_meta('Tesla T4')},32768,1024,True\n")
    _gz(src / "ops_test/elem.csv.gz",
        f"OPName,Latency,Device,{_META},B,H,large\n" + f"add,0.9,{_meta('Tesla P4')},32768,1024,True\n")
    (src / "models/Tesla_T4").mkdir(parents=True)
    (src / "models/Tesla_T4/bert_large-inf-512-8.json").write_text(json.dumps(
        {"num_layer": 24, "e2e_latency": 694.5, "fw_latency": 694.5, "bwall_latency": 0}))
    _gz(src / "models/Tesla_T4/bert_large-inf-512-8.csv.gz",
        "op,target,input_shapes,output_shape,latency,fw_latency,bw_latency,acc_latency,Name\n"
        'call_module,bert.encoder.layer.0.attention.self.query,"[[8, 512, 1024]]","(8, 512, 1024)",0.5,0.5,0,0,q\n')
    return src


def test_ingest_maps_features_gpus_and_host_floor(tmp_path: Path) -> None:
    src = _artifact(tmp_path)
    summary = ingest_neusight(src, tmp_path / "datasets")
    out = tmp_path / "datasets/external/neusight"
    assert (out / "LICENSE").read_text() == "MIT License\n" and COMMIT in (out / "SOURCE").read_text()
    assert summary.rows == {"operations": 9, "models": 1, "nodes": 1}
    ops = gpurec.load_dataset(source="neusight", root=tmp_path / "datasets")
    assert set(ops["gpu"]) == {"Tesla T4", "Tesla P4"}  # catalogue NVML names
    assert (ops["source_commit"] == COMMIT).all() and (ops["licence"] == "MIT").all()
    big = ops[(ops["neusight_op"] == "linear") & (ops["m"] == 1024)].iloc[0]
    assert big["op_kind"] == "Linear" and big["flops"] == 2.0 * 1024 * 512 * 256
    assert big["bytes_read"] == 4 * (1024 * 512 + 512 * 256) and big["output_elements"] == 1024 * 256
    conv = ops[(ops["neusight_op"] == "conv") & (ops["b"] == 2)].iloc[0]
    # 32x32 input, 3x3 kernel, stride 2, padding 1 -> 16x16 output
    assert conv["output_elements"] == 2 * 32 * 16 * 16 and conv["flops"] == 2.0 * 2 * 32 * 16 * 16 * 16 * 9
    # host floor: the smallest row of (GPU, op) in the train split; host-dominated below 3x of it
    assert big["host_floor_ms"] == pytest.approx(0.05) and big["gpu_time_ms"] == pytest.approx(2.0)
    tiny = ops[(ops["neusight_op"] == "linear") & (ops["m"] == 8)].iloc[0]
    assert tiny["host_dominated"] and np.isnan(tiny["gpu_time_ms"])
    add = ops[(ops["neusight_op"] == "add")].set_index("split")
    assert add.loc["test", "host_floor_ms"] == pytest.approx(0.025)  # from the train split
    assert bool(add.loc["test", "host_dominated"]) is False
    # a (GPU, op) with only large test shapes takes the op's floor on the other GPUs
    ln_t4 = ops[(ops["neusight_op"] == "ln") & (ops["gpu"] == "Tesla T4")].iloc[0]
    assert ln_t4["host_floor_ms"] == pytest.approx(0.045) and ln_t4["gpu_time_ms"] == pytest.approx(0.455)
    mid = ops[(ops["neusight_op"] == "add") & (ops["b"] == 1024)].iloc[0]
    assert mid["latency_ms"] < HOST_DOMINATED_FACTOR * 0.025 and mid["host_dominated"]
    models = gpurec.load_dataset(source="neusight", root=tmp_path / "datasets", table="models")
    assert models.iloc[0]["e2e_latency_ms"] == 694.5 and bool(models.iloc[0]["has_trace"])
    # the default source never sees the public rows
    with pytest.raises(FileNotFoundError):
        gpurec.load_dataset(root=tmp_path / "datasets")


def test_ingest_refuses_without_licence_or_known_gpu(tmp_path: Path) -> None:
    src = _artifact(tmp_path)
    (src / "LICENSE").unlink()
    with pytest.raises(ExternalDataError, match="LICENSE"):
        ingest_neusight(src, tmp_path / "datasets")
    (src / "LICENSE").write_text("MIT License\n")
    _gz(src / "ops_train/add/Tesla_K80.csv.gz", f"OPName,Latency,Device,{_META},B,H\nadd,0.03,{_meta('Tesla K80')},4,8\n")
    with pytest.raises(ExternalDataError, match="K80"):
        ingest_neusight(src, tmp_path / "datasets")


def test_shipped_neusight_tables_carry_licence_and_fit_in_the_repo() -> None:
    root = Path(__file__).resolve().parents[1] / "datasets/external/neusight"
    assert (root / "LICENSE").exists() and (root / "SOURCE").exists()
    assert sum(p.stat().st_size for p in root.glob("*.parquet")) < 12 * 2**20
    ops = gpurec.load_dataset(source="neusight", table="operations")
    assert set(ops["gpu"]) == {"Tesla P4", "Tesla P100-PCIE-16GB", "Tesla T4", "Tesla V100-PCIE-32GB",
                               "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"}
