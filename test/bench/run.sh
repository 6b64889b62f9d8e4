#!/usr/bin/env bash
# make bench: figures as ratios against baselines measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/go/bin:$PATH"
bash test/infra/install.sh >/dev/null
exec go test -tags bench -run 'TestBench' -count=1 -v -timeout 30m ./test/bench/ "$@"
