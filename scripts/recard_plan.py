"""Write datasets/plans/recard_fp32.json: fp32 networks already measured host-free on the H200,
to measure again on another H200 card.

Why: the H200/H100 energy-ratio error is -3 to -6 pp on CNN pairs and +1 to +5 pp on sequence
pairs, and each family was measured on its own set of H200 cards, so family and card cannot be
told apart (DEVELOPERS, "Experiments").  The same networks of both families on one new card can.
Items are copied verbatim from the main and sequence plans (batch 32 and 128, both modes), CNN
and sequence items interleaved, so a call cut short still holds both families.
    python3 scripts/recard_plan.py
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

PLANS = Path("datasets/plans")
BATCHES = ("b32", "b128")


def _networks(name: str) -> list[dict]:
    plan = json.loads((PLANS / f"{name}.json").read_text())
    return [i for i in plan["items"] if i["item"] == "network" and i["key"].split(":")[1] in BATCHES]


def main() -> None:
    cnn, seq = _networks("main"), _networks("seq")
    items = [i for pair in itertools.zip_longest(cnn, seq) for i in pair if i is not None]
    torch_version = json.loads((PLANS / "main.json").read_text())["torch"]
    out = PLANS / "recard_fp32.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"items": items, "torch": torch_version}, separators=(",", ":")))
    tmp.replace(out)
    print(f"{out}: {len(items)} network items ({len(cnn)} CNN, {len(seq)} sequence)")


if __name__ == "__main__":
    main()
