"""``python -m gpurec.calibrate --out DIR --gpu-index 0 --budget-s 300``."""

from gpurec.calibrate.calibrate import main

raise SystemExit(main())
