#!/usr/bin/env bash
# The README tour's run: a stand-in for a training job that prints as it
# goes, so `lakeshore run` and `lakeshore invocations logs --follow` have
# output to stream. EPOCHS (default 3) epochs of a second each.
set -euo pipefail

epochs="${EPOCHS:-3}"
for ((i = 1; i <= epochs; i++)); do
  echo "epoch $i/$epochs: loss $(awk -v i="$i" 'BEGIN { printf "%.3f", 1 / (i + 1) }')"
  sleep 1
done
echo "trained"
