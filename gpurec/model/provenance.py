"""Provenance of a training run: library versions, JSON dumping, and the collection hosts.

Kept apart from training and persistence so that ``persist`` and ``training`` need not
import each other.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from gpurec.dataset.store import json_safe


def library_versions() -> dict[str, str]:
    """Versions of the libraries a saved model depends on.

    optuna (training only) is read from its installed metadata unless already imported, so that
    checking a model on load never imports it."""
    import sys
    from importlib import metadata

    import gpurec

    out = {"gpurec": gpurec.__version__, "python": platform.python_version()}
    for mod in ("xgboost", "sklearn", "torch", "numpy", "pandas", "optuna"):
        try:
            if mod == "optuna" and mod not in sys.modules:
                out[mod] = metadata.version("optuna")
            else:
                out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = "missing"
    return out


def dumps(obj: Any) -> str:
    """Stable, NaN-safe JSON for manifests and reports."""
    return json.dumps(json_safe(obj), indent=1, sort_keys=True)


def host_profiles_by_run(data_root: Path | str | None) -> dict[str, list[Any]]:
    """run_id -> the HostProfiles its provenance carries under ``host_bench`` (measured
    at the start and end of every collection run). Runs without one are absent."""
    from gpurec.dataset.load import default_root
    from gpurec.host import profiles_of

    root = Path(data_root) if data_root is not None else default_root()
    out: dict[str, list[Any]] = {}
    if not root.exists():
        return out
    for path in sorted(root.glob("*/raw/provenance-*.json")):
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        profiles = profiles_of(d.get("host_bench"))
        if profiles:
            run_id = str(d.get("run_id", path.stem.replace("provenance-", "")))
            out.setdefault(run_id, []).extend(profiles)
    return out
