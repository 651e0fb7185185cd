"""``python -m gpurec.collect SPEC.json``: one collection worker, started by
:func:`gpurec.collect.api.launch_devices` with a :class:`CollectOptions` spec file (people
run ``gpurec collect``).  Exit codes: 0 done, 3 CUDA context lost (the parent restarts it),
1 any other failure.
"""

from __future__ import annotations

import json
import sys

from gpurec.collect.api import CONTEXT_LOST_EXIT, CollectOptions, collect
from gpurec.collect.runner import ContextLost


def main(spec_path: str) -> int:
    try:
        result = collect(CollectOptions.read(spec_path))
    except ContextLost as exc:
        print(f"gpurec collect worker: {exc}", file=sys.stderr, flush=True)
        return CONTEXT_LOST_EXIT
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m gpurec.collect SPEC.json (people run `gpurec collect`)", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
