"""ctypes wrapper around ``libmembench`` (cuda/membench.cu).

Python drives the microbenchmark so that it can read the NVML energy counter around each
sequence of launches; one process runs every configuration.  ``python -m
gpurec.calibrate.microbench SPEC.json`` is the probe that ncu profiles: for each
configuration in the spec file it launches the warm-up-only kernel once, then the full one
(see :func:`run_probe_spec`; there is no argument parser).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from gpurec.calibrate.errors import MicrobenchError
from gpurec.calibrate.fit import LEVELS  # the offline fit owns the level names

LEVEL_INDEX = {name: i for i, name in enumerate(LEVELS)}


@dataclass(frozen=True)
class BenchConfig:
    """One kernel shape: memory level, per-block array, grid and block size, DIV variant."""

    level: str
    array_bytes: int
    blocks: int
    threads: int
    div: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunResult:
    """What one call to ``mb_run`` reports; counts are analytic (see cuda/membench.cu)."""

    elapsed_ms: float
    launches: int
    steps_per_pass: int
    meas_loads_per_thread: int
    array_bytes_used: int
    stride_bytes: int
    sectors_per_launch: float
    warm_sectors_per_launch: float
    wavefronts_per_launch: float
    div_warp_insts_per_launch: float
    loads_per_launch: float

    @property
    def ms_per_launch(self) -> float:
        return self.elapsed_ms / max(self.launches, 1)


@dataclass(frozen=True)
class DeviceProps:
    """CUDA's view of the device (cache sizes drive the array-size choice)."""

    name: str
    cc_major: int
    cc_minor: int
    sm_count: int
    l2_bytes: int
    smem_per_sm_bytes: int
    smem_per_block_bytes: int
    smem_per_block_optin_bytes: int
    max_threads_per_block: int
    global_mem_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Runner(Protocol):
    """What the sweep needs; :class:`Microbench` and the tests' fake both provide it."""

    def prepare(self, cfg: BenchConfig) -> None: ...

    def run(self, cfg: BenchConfig, iters: int, warmup_only: bool, launches: int = 1) -> RunResult: ...


class _Result(ctypes.Structure):
    _fields_ = [
        ("elapsed_ms", ctypes.c_double),
        ("launches", ctypes.c_longlong),
        ("steps_per_pass", ctypes.c_longlong),
        ("meas_loads_per_thread", ctypes.c_longlong),
        ("array_bytes_used", ctypes.c_longlong),
        ("stride_bytes", ctypes.c_longlong),
        ("sectors_per_launch", ctypes.c_double),
        ("warm_sectors_per_launch", ctypes.c_double),
        ("wavefronts_per_launch", ctypes.c_double),
        ("div_warp_insts_per_launch", ctypes.c_double),
        ("loads_per_launch", ctypes.c_double),
    ]


class _Device(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 256),
        ("cc_major", ctypes.c_int),
        ("cc_minor", ctypes.c_int),
        ("sm_count", ctypes.c_int),
        ("l2_bytes", ctypes.c_longlong),
        ("smem_per_sm_bytes", ctypes.c_longlong),
        ("smem_per_block_bytes", ctypes.c_longlong),
        ("smem_per_block_optin_bytes", ctypes.c_longlong),
        ("max_threads_per_block", ctypes.c_int),
        ("global_mem_bytes", ctypes.c_longlong),
    ]


class Microbench:
    """The real runner: one CUDA context, one device, one chain buffer reused across runs."""

    def __init__(self, lib_path: Path, device: int = 0):
        # NVML numbers GPUs in PCI order; make CUDA agree so gpu_index means the same board.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        self.device = device
        self._lib = ctypes.CDLL(str(lib_path))
        L = self._lib
        L.mb_last_error.restype = ctypes.c_char_p
        L.mb_device_info.argtypes = [ctypes.c_int, ctypes.POINTER(_Device)]
        L.mb_prepare.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_int, ctypes.c_int]
        L.mb_run.argtypes = [
            ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_int, ctypes.c_int,
            ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.POINTER(_Result),
        ]
        L.mb_release.restype = None
        self._props = self._device_info()

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = (self._lib.mb_last_error() or b"").decode(errors="replace")
            raise MicrobenchError(f"{what} failed (rc={rc}): {msg}")

    def _device_info(self) -> DeviceProps:
        d = _Device()
        self._check(self._lib.mb_device_info(self.device, ctypes.byref(d)), f"mb_device_info({self.device})")
        return DeviceProps(
            name=d.name.decode(errors="replace"),
            cc_major=d.cc_major,
            cc_minor=d.cc_minor,
            sm_count=d.sm_count,
            l2_bytes=d.l2_bytes,
            smem_per_sm_bytes=d.smem_per_sm_bytes,
            smem_per_block_bytes=d.smem_per_block_bytes,
            smem_per_block_optin_bytes=d.smem_per_block_optin_bytes,
            max_threads_per_block=d.max_threads_per_block,
            global_mem_bytes=d.global_mem_bytes,
        )

    def device_props(self) -> DeviceProps:
        return self._props

    def unroll(self) -> int:
        return int(self._lib.mb_unroll())

    def prepare(self, cfg: BenchConfig) -> None:
        rc = self._lib.mb_prepare(LEVEL_INDEX[cfg.level], cfg.array_bytes, cfg.blocks, cfg.threads)
        self._check(rc, f"mb_prepare({cfg})")

    def run(self, cfg: BenchConfig, iters: int, warmup_only: bool, launches: int = 1) -> RunResult:
        r = _Result()
        rc = self._lib.mb_run(
            LEVEL_INDEX[cfg.level], cfg.array_bytes, int(iters), cfg.blocks, cfg.threads,
            int(bool(warmup_only)), int(bool(cfg.div)), int(launches), ctypes.byref(r),
        )
        self._check(rc, f"mb_run({cfg}, iters={iters}, warmup_only={warmup_only})")
        return RunResult(**{name: getattr(r, name) for name, _ in _Result._fields_})

    def release(self) -> None:
        self._lib.mb_release()


def run_probe(lib: Path, spec: list[dict[str, Any]], device: int = 0) -> list[dict[str, Any]]:
    """For each spec entry launch warm-up-only once, then warm-up+measurement once.

    ncu profiles these launches; the returned analytic counts line up with its rows in order.
    """
    mb = Microbench(lib, device)
    out = []
    try:
        for entry in spec:
            cfg = BenchConfig(
                level=entry["level"], array_bytes=int(entry["array_bytes"]), blocks=int(entry["blocks"]),
                threads=int(entry["threads"]), div=bool(entry.get("div", False)),
            )
            mb.prepare(cfg)
            warm = mb.run(cfg, 0, True, 1)
            full = mb.run(cfg, int(entry.get("iters", 2)), False, 1)
            out.append({"config": cfg.as_dict(), "warm": asdict(warm), "full": asdict(full)})
    finally:
        mb.release()
    return out


def run_probe_spec(spec_file: Path) -> list[dict[str, Any]]:
    """The probe of a spec file ``{"lib", "configs", "device", "result"}``; writes the
    analytic counts to ``result`` (when given) and returns them."""
    spec = json.loads(Path(spec_file).read_text())
    res = run_probe(Path(spec["lib"]), spec["configs"], int(spec.get("device", 0)))
    if spec.get("result"):
        Path(spec["result"]).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    run_probe_spec(Path(sys.argv[1]))  # the subprocess ncu profiles: one spec file, no parser
