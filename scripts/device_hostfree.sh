#!/usr/bin/env bash
# Host-free collection of one plan on every GPU of the machine, whatever the card.
#   bash scripts/device_hostfree.sh BUDGET_S
# GPUREC_PLAN picks the work order (default datasets/plans/main.json), e.g.
#   GPUREC_PLAN=datasets/plans/seq.json bash scripts/device_hostfree.sh 540
# The same resumable runner as scripts/device_round2.sh (output in ./out/r2_<tag>/, seeded from
# datasets/<tag>/raw, packed into $OUT), with the one plan for every card.
set -u
PLAN="${GPUREC_PLAN:-datasets/plans/main.json}"
export PLANS_H100="$PLAN" PLANS_H200="$PLAN"
TAG=$(python3 -c "import torch; n=torch.cuda.get_device_name(0); print('h200' if 'H200' in n else 'h100' if 'H100' in n else n.split()[-1].lower())")
export "PLANS_$(echo "$TAG" | tr a-z A-Z)=$PLAN"
exec bash "$(dirname "$0")/device_round2.sh" "${1:-540}"
