#!/usr/bin/env bash
# The README tour's setup step: the shape of a host setup script, with
# nothing to install. Setup scripts run one at a time, in order, and a
# daemon may run one again after a restart, so they check before they act.
set -euo pipefail

for tool in python3 git rsync; do
  if command -v "$tool" >/dev/null 2>&1; then
    echo "$tool: $(command -v "$tool")"
  else
    # A real one would install it here (apt-get install -y "$tool"),
    # queued with --sudo, and --refresh-capabilities would then advertise
    # whatever runner it brings.
    echo "$tool: missing"
  fi
done
