#!/bin/bash
# Throttles (exit 75) the first two calls made with this $LAUNCHER_STATE,
# then behaves as cloud.sh. It counts its refusals in $LAUNCHER_STATE/throttled.
set -euo pipefail
state=${LAUNCHER_STATE:?throttle-twice.sh: set LAUNCHER_STATE to a state directory}
mkdir -p "$state"
exec 9>>"$state/lock"
flock 9
n=$(cat "$state/throttled" 2>/dev/null || echo 0)
if ((n < 2)); then
	echo $((n + 1)) >"$state/throttled"
	echo "RequestLimitExceeded: slow down (refusal $((n + 1)))" >&2
	exit 75
fi
flock -u 9
exec 9>&-
exec "$(dirname "$0")/cloud.sh" "$@"
