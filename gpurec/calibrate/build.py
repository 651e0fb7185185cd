"""Build cuda/membench.cu with nvcc into a cache keyed by arch and source hash.

The shared library is what Python drives through ctypes; the optional executable is the
same code with a ``main`` for manual runs.  Builds land in ``cuda/bin/<arch>/`` (git-ignored)
and are reused until the source, flags or nvcc change.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from gpurec.calibrate.errors import BuildError, NvccNotFound

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE = REPO_ROOT / "cuda" / "membench.cu"
CACHE_DIR = REPO_ROOT / "cuda" / "bin"
DEFAULT_ARCH = "sm_90"
# Searched after PATH; tests empty it to simulate a machine without the toolkit.
DEFAULT_CUDA_DIRS: tuple[str, ...] = ("/usr/local/cuda/bin",)
NVCC_FIX = (
    "nvcc (the CUDA compiler) was not found on PATH, in $CUDA_HOME/bin, $CUDA_PATH/bin or "
    "/usr/local/cuda/bin. Install the CUDA toolkit (12.x or newer) and put its bin/ on PATH "
    "(e.g. `export PATH=/usr/local/cuda/bin:$PATH`) or set CUDA_HOME; calibration needs it to "
    "build cuda/membench.cu."
)


def find_nvcc() -> Path:
    """Locate nvcc or raise :class:`NvccNotFound` with the fix."""
    found = shutil.which("nvcc")
    if found:
        return Path(found)
    dirs = [os.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH")]
    for d in [str(Path(x) / "bin") for x in dirs if x] + list(DEFAULT_CUDA_DIRS):
        cand = Path(d) / "nvcc"
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    raise NvccNotFound(NVCC_FIX)


def nvcc_version(nvcc: Path | None = None) -> str:
    """``'13.0.88'``-style version of nvcc (``'unknown'`` when it cannot be parsed)."""
    nvcc = nvcc or find_nvcc()
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def arch_flag(arch: str) -> str:
    """``'90'``, ``'sm_90'``, ``'sm_90a'`` or ``'native'`` -> the ``-arch=`` value nvcc expects."""
    a = arch.strip().lower()
    if a == "native" or a.startswith(("sm_", "compute_")):
        return a
    if re.fullmatch(r"\d+a?", a):
        return f"sm_{a}"
    raise ValueError(f"Unrecognised CUDA arch {arch!r}: use e.g. 'sm_90', '90' or 'native'.")


def _flags(arch: str, shared: bool) -> list[str]:
    flags = ["-O3", f"-arch={arch_flag(arch)}", "-std=c++17", "-lineinfo"]
    if shared:
        flags += ["-shared", "-Xcompiler", "-fPIC"]
    else:
        flags += ["-DMEMBENCH_MAIN"]
    return flags


def _build(arch: str, shared: bool, force: bool, cache_dir: Path | None, nvcc: Path | None) -> Path:
    nvcc = nvcc or find_nvcc()
    flags = _flags(arch, shared)
    key = hashlib.sha256(
        SOURCE.read_bytes() + " ".join(flags).encode() + nvcc_version(nvcc).encode()
    ).hexdigest()[:12]
    out_dir = (cache_dir or CACHE_DIR) / arch_flag(arch)
    name = f"libmembench-{key}.so" if shared else f"membench-{key}"
    target = out_dir / name
    if target.exists() and not force:
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.{os.getpid()}.tmp"
    cmd = [str(nvcc), *flags, str(SOURCE), "-o", str(tmp)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"nvcc timed out after 600 s: {' '.join(cmd)}") from exc
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"nvcc failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    os.replace(tmp, target)
    return target


def build_library(
    arch: str = DEFAULT_ARCH, force: bool = False, cache_dir: Path | None = None, nvcc: Path | None = None
) -> Path:
    """Path of ``libmembench-<hash>.so`` for ``arch``, building it if needed."""
    return _build(arch, True, force, cache_dir, nvcc)


def build_executable(
    arch: str = DEFAULT_ARCH, force: bool = False, cache_dir: Path | None = None, nvcc: Path | None = None
) -> Path:
    """Path of the standalone ``membench`` CLI for ``arch``, building it if needed."""
    return _build(arch, False, force, cache_dir, nvcc)
