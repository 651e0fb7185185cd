"""Snapshot of what extraction gives for every torchvision classifier, to check that a change
to gpurec.ops leaves the operation lists as they were.

    PYTHONPATH=. python3 scripts/extraction_snapshot.py write before.json   # on the old code
    PYTHONPATH=. python3 scripts/extraction_snapshot.py write after.json    # on the new code
    python3 scripts/extraction_snapshot.py compare before.json after.json

Each classifier (299 px for Inception, else 224, batch 2) in both modes, by name and as a fresh
nn.Module (the prediction fast path): kind, signature, FLOPs (forward, backward,
element-wise), parameters and bytes of every operation, in order.  About 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _rows(ops: list[Any]) -> list[list[Any]]:
    return [[o.kind, o.signature, o.flops, o.flops_bwd, o.flops_elementwise, o.params, o.bytes_read,
             o.bytes_written] for o in ops]


def snapshot() -> dict[str, list[list[Any]]]:
    import torch
    import torchvision

    from gpurec.ops import classification_models, extract_operations

    out: dict[str, list[list[Any]]] = {}
    for name in classification_models():
        res = 299 if name.startswith("inception") else 224
        for mode in ("inference", "training"):
            out[f"{name}|{mode}|name"] = _rows(extract_operations(name, (2, 3, res, res), mode=mode,
                                                                  keep_sources=False))
            try:
                with torch.device("meta"):
                    module = torchvision.models.get_model(name)
            except Exception:  # RegNets initialise with data-dependent ops
                module = torchvision.models.get_model(name)
            out[f"{name}|{mode}|module"] = _rows(extract_operations(module, (2, 3, res, res), mode=mode,
                                                                    keep_sources=False))
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "write":
        snap = snapshot()
        Path(argv[1]).write_text(json.dumps(snap))
        print(f"wrote {argv[1]}: {len(snap)} operation lists")
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        a, b = (json.loads(Path(p).read_text()) for p in argv[1:])
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        print(f"{len(a)} vs {len(b)} operation lists; {len(differ)} differ" + (": " + ", ".join(differ[:20])
                                                                            if differ else ""))
        return 1 if differ else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
