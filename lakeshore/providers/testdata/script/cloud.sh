#!/bin/bash
# A fake cloud behind the script provider protocol (providers.ScriptProtocol),
# for tests. Its machines are files; it records what it was asked and how
# many launches were in flight at once.
#
# Environment:
#   LAUNCHER_STATE         directory of its state (required; made if missing)
#   LAUNCHER_HOLD          a launch stays in flight until at least this many
#                          launches have been in flight at once (default 1:
#                          no hold), so that overlapping calls really overlap
#   LAUNCHER_HOLD_SECONDS  bound on that hold (default 10); a launch that
#                          times out holding still succeeds
#
# What it leaves in $LAUNCHER_STATE:
#   peak                 the most launches in flight at once, ever
#   inflight             launches in flight now
#   calls                one line per event: "launch-start WORKER_ID N",
#                        "launch-end WORKER_ID N" (N in flight after it),
#                        "terminate INSTANCE_ID", "console-log INSTANCE_ID"
#   instances/ID         one file per running machine: its launch request
#                        (the JSON, bootstrap included)
# Instance ids are "inst-WORKER_ID". console-log answers {"gone":true} for an
# instance that is not (or no longer) running.
set -euo pipefail

state=${LAUNCHER_STATE:?cloud.sh: set LAUNCHER_STATE to a state directory}
mkdir -p "$state/instances"
req=$(cat)

# field NAME: the string field NAME of the request (compact JSON, as the
# control plane writes it; a bootstrap's own quotes are escaped, so they
# never match).
field() { sed -n 's/.*"'"$1"'":"\([^"\\]*\)".*/\1/p' <<<"$req" | head -n1; }

# count DELTA EVENT: under the state lock, add DELTA to inflight, raise peak,
# and log EVENT with the new count.
count() {
	exec 9>>"$state/lock"
	flock 9
	local n peak
	n=$(($(cat "$state/inflight" 2>/dev/null || echo 0) + $1))
	echo "$n" >"$state/inflight"
	peak=$(cat "$state/peak" 2>/dev/null || echo 0)
	if ((n > peak)); then echo "$n" >"$state/peak"; fi
	echo "$2 $n" >>"$state/calls"
	flock -u 9
	exec 9>&-
}

log() {
	exec 9>>"$state/lock"
	flock 9
	echo "$*" >>"$state/calls"
	flock -u 9
	exec 9>&-
}

case ${1:-} in
launch)
	wid=$(field worker_id)
	[[ $wid =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "cloud.sh: no worker_id in the request" >&2; exit 2; }
	count 1 "launch-start $wid"
	trap 'count -1 "launch-end $wid"' EXIT
	hold=${LAUNCHER_HOLD:-1}
	deadline=$((SECONDS + ${LAUNCHER_HOLD_SECONDS:-10}))
	while (($(cat "$state/peak") < hold && SECONDS < deadline)); do
		sleep 0.01
	done
	printf '%s\n' "$req" >"$state/instances/inst-$wid"
	chmod 600 "$state/instances/inst-$wid"
	printf '{"instance_id":"inst-%s"}\n' "$wid"
	;;
terminate)
	id=$(field instance_id)
	log "terminate $id"
	rm -f "$state/instances/$id"
	echo '{}'
	;;
console-log)
	id=$(field instance_id)
	log "console-log $id"
	if [[ -n $id && -f $state/instances/$id ]]; then
		printf '{"output":"console of %s\\nbooted\\n"}\n' "$id"
	else
		echo '{"gone":true}'
	fi
	;;
*)
	echo "usage: cloud.sh launch|terminate|console-log <request" >&2
	exit 2
	;;
esac
