#!/usr/bin/env bash
# Brings up a control plane on its embedded store plus one local nymph
# registered to it, prints what to type next, and stops both on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

addr="${LAKESHORE_ADDR:-127.0.0.1:7700}"
url="http://$addr"
run=".run"
mkdir -p "$run/cp" "$run/nymph/work"
chmod 700 "$run"

# One `make run` at a time. A second one would rebuild the binaries under
# the first, truncate its logs, and start a nymph on its workdir; so before
# touching anything, find out whether one is up: this script's own lock
# (held on fd 9 for its life), then the lock a nymph holds on its workdir,
# then the control plane's address.
exec 9>>"$run/run-local.lock"
if ! flock -n 9; then
  pid="$(cat "$run/run-local.pid" 2>/dev/null || true)"
  echo "make run is already running${pid:+ (pid $pid)}: control plane on $url, logs in $run/." >&2
  echo "Use that one (export PATH=\"\$PWD/bin:\$PATH\"; lakeshore daemon list), or stop it first:" >&2
  echo "  Ctrl-C in its terminal${pid:+, or: kill $pid}" >&2
  exit 1
fi
if ! flock -n "$run/nymph/work/nymph.lock" true; then
  pid="$(cat "$run/nymph/work/nymph.lock" 2>/dev/null || true)"
  echo "a nymph${pid:+ (pid $pid)} is already using $run/nymph/work (left from an earlier make run?)." >&2
  echo "Stop it first${pid:+: kill $pid}" >&2
  exit 1
fi
if (exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null; then
  echo "something is already listening on $addr (an earlier lakeshore serve?); stop it, or set LAKESHORE_ADDR." >&2
  exit 1
fi
echo $$ > "$run/run-local.pid"

version="$(git describe --tags --always --dirty 2>/dev/null || echo dev)"
echo "==> building lakeshore and nymph ($version)"
CGO_ENABLED=0 go build -ldflags "-X nymph/buildinfo.Version=$version" -o bin/ ./cmd/lakeshore ./cmd/nymph

if [ ! -s "$run/daemon-token" ]; then
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$run/daemon-token"
  chmod 600 "$run/daemon-token"
fi

cat > "$run/nymph.toml" <<TOML
[server]
url = "$url"
token_file = "$PWD/$run/daemon-token"

[daemon]
machine_id = "auto"
label = "local"
tags = ["env=dev"]

[runtime]
runners = ["process", "echo", "python"]
default_runner = "process"
workdir = "$PWD/$run/nymph/work"
keep_alive_s = -1

[log]
level = "info"
format = "json"
TOML

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "==> stopping"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  echo "==> stopped (state kept in $run/; rm -rf $run to start over)"
}
trap cleanup INT TERM EXIT

echo "==> starting the control plane on $url (data in $run/cp, log in $run/lakeshore.log)"
LAKESHORE_DAEMON_TOKEN="$(cat "$run/daemon-token")" \
  bin/lakeshore serve --addr "$addr" --data "$run/cp" --public-url "$url" >"$run/lakeshore.log" 2>&1 9>&- &
pids+=($!)

for _ in $(seq 1 200); do
  if bin/lakeshore --server "$url" daemon list >/dev/null 2>&1; then break; fi
  if ! kill -0 "${pids[0]}" 2>/dev/null; then echo "lakeshore serve exited; see $run/lakeshore.log" >&2; cat "$run/lakeshore.log" >&2; exit 1; fi
  sleep 0.1
done
grep -i "admin token" "$run/lakeshore.log" || true

echo "==> starting nymph (log in $run/nymph.log)"
bin/nymph run --config "$run/nymph.toml" >"$run/nymph.log" 2>&1 9>&- &
pids+=($!)

for _ in $(seq 1 200); do
  if bin/lakeshore --server "$url" daemon show local >/dev/null 2>&1; then break; fi
  if ! kill -0 "${pids[1]}" 2>/dev/null; then echo "nymph exited; see $run/nymph.log" >&2; cat "$run/nymph.log" >&2; exit 1; fi
  sleep 0.1
done

cat <<MSG

  lakeshore is up at $url with one daemon labelled "local". In another terminal:

    export PATH="\$PWD/bin:\$PATH"
    lakeshore daemon list
    lakeshore daemon show local
    lakeshore daemon exec local uname -a
    lakeshore daemon exec local -- 'for i in 1 2 3; do echo tick \$i; sleep 1; done'
    lakeshore run --queue default --runner echo --args-json '{"hello":"world"}' demo:echo

  Ctrl-C here stops both.
MSG

wait -n "${pids[@]}" || true
