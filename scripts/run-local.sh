#!/usr/bin/env bash
# Brings up a control plane on its embedded store plus one local nymph
# registered to it, prints what to type next, and stops both on Ctrl-C.
#
# Environment, all optional: LAKESHORE_ADDR (127.0.0.1:7700),
# LAKESHORE_RUN_DIR (.run: the store, the daemon's workdir, config, logs),
# LAKESHORE_BIN_DIR (bin: where both programs are built).
set -euo pipefail
# The braces make bash read the whole file before it runs any of it: a
# make run waits for hours, and a checkout or an edit of this file meanwhile
# must not change what its Ctrl-C does.
{
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

addr="${LAKESHORE_ADDR:-127.0.0.1:7700}"
url="http://$addr"
mkdir -p "${LAKESHORE_RUN_DIR:-.run}"/{cp,nymph/work} "${LAKESHORE_BIN_DIR:-bin}"
# Absolute, because the nymph's config names them and every message
# printed here should work from any directory.
run="$(cd "${LAKESHORE_RUN_DIR:-.run}" && pwd)"
bin="$(cd "${LAKESHORE_BIN_DIR:-bin}" && pwd)"
chmod 700 "$run"

# listener_pid prints the pid listening on $addr's port, when ss can see it.
listener_pid() {
  ss -Hltnp "sport = :${addr##*:}" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2 || true
}

# answers_healthz: $addr answers GET /healthz with 200, as lakeshore serve does.
answers_healthz() (
  exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}" || exit 1
  printf 'GET /healthz HTTP/1.0\r\nHost: %s\r\n\r\n' "$addr" >&3
  IFS= read -r -t 5 status <&3 || exit 1
  [[ $status == HTTP/1.?" 200"* ]]
)

# serve_data_dir prints the --data directory of the lakeshore serve with
# pid $1, resolved against its working directory.
serve_data_dir() {
  local arg prev="" dir=""
  while IFS= read -r -d '' arg; do
    if [[ $prev == --data ]]; then dir="$arg"; fi
    if [[ $arg == --data=* ]]; then dir="${arg#--data=}"; fi
    prev="$arg"
  done <"/proc/$1/cmdline"
  [[ -n $dir ]] || return 0
  if [[ $dir != /* ]]; then dir="$(readlink "/proc/$1/cwd")/$dir"; fi
  (cd "$dir" 2>/dev/null && pwd) || echo "$dir"
}

# One `make run` at a time. A second one would rebuild the binaries under
# the first, truncate its logs, and start a nymph on its workdir; so before
# touching anything, find out whether one is up: this script's own lock
# (held on fd 9 for its life), then the lock a nymph holds on its workdir,
# then the control plane's address, and say which instance it is and how
# to reach or stop it.
exec 9>>"$run/run-local.lock"
if ! flock -n 9; then
  pid="$(cat "$run/run-local.pid" 2>/dev/null || true)"
  echo "make run is already running${pid:+ (pid $pid)}: control plane on $url, logs in $run/." >&2
  echo "Use that one (export PATH=\"$bin:\$PATH\"; lakeshore daemon list), or stop it first:" >&2
  echo "  Ctrl-C in its terminal${pid:+, or: kill $pid}" >&2
  exit 1
fi
if ! flock -n "$run/nymph/work/nymph.lock" true; then
  pid="$(cat "$run/nymph/work/nymph.lock" 2>/dev/null || true)"
  echo "a nymph${pid:+ (pid $pid)} is already using $run/nymph/work, without its make run (left from an earlier one?)." >&2
  echo "Stop it first${pid:+: kill $pid}" >&2
  exit 1
fi
if (exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null; then
  pid="$(listener_pid)"
  if answers_healthz 2>/dev/null; then
    data="$([[ -n $pid && -r /proc/$pid/cmdline ]] && serve_data_dir "$pid" || true)"
    if [[ $data == "$run/cp" ]]; then
      echo "a control plane${pid:+ (pid $pid)} on this make run's store ($run/cp) is still serving $url, without its make run (left from an earlier one?)." >&2
      echo "Use it (export PATH=\"$bin:\$PATH\"; lakeshore daemon list), or stop it first${pid:+: kill $pid}" >&2
    else
      echo "another lakeshore control plane${pid:+ (pid $pid${data:+, store in $data})} already answers on $url." >&2
      echo "Stop it${pid:+ (kill $pid)}, or start this one on another address: LAKESHORE_ADDR=127.0.0.1:$(( ${addr##*:} + 1 )) make run" >&2
    fi
  else
    cmd="$([[ -n $pid && -r /proc/$pid/comm ]] && cat "/proc/$pid/comm" || true)"
    echo "something${pid:+ (pid $pid${cmd:+, $cmd})} is already listening on $addr, and it is not a lakeshore control plane." >&2
    echo "Stop it, or start this one on another address: LAKESHORE_ADDR=127.0.0.1:$(( ${addr##*:} + 1 )) make run" >&2
  fi
  exit 1
fi
echo $$ > "$run/run-local.pid"

version="$(git describe --tags --always --dirty 2>/dev/null || echo dev)"
echo "==> building lakeshore and nymph ($version)"
CGO_ENABLED=0 go build -ldflags "-X nymph/buildinfo.Version=$version" -o "$bin/" ./cmd/lakeshore ./cmd/lakeshore-server ./cmd/nymph

if [ ! -s "$run/daemon-token" ]; then
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$run/daemon-token"
  chmod 600 "$run/daemon-token"
fi

cat > "$run/nymph.toml" <<TOML
[server]
url = "$url"
token_file = "$run/daemon-token"

[daemon]
machine_id = "auto"
label = "local"
tags = ["env=dev"]

[runtime]
runners = ["process", "echo", "python"]
default_runner = "process"
workdir = "$run/nymph/work"
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

# until_up waits (up to a minute) for "$2" to succeed while the child with
# pid $1 lives; $3 names the child and $4 its log for the failure message.
until_up() {
  local _
  for _ in $(seq 1 600); do
    if eval "$2" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$1" 2>/dev/null; then echo "$3 exited; see $4:" >&2; cat "$4" >&2; exit 1; fi
    sleep 0.1
  done
  echo "$3 is not up after a minute; see $4" >&2
  exit 1
}

echo "==> starting the control plane on $url (data in $run/cp, log in $run/lakeshore.log)"
LAKESHORE_DAEMON_TOKEN="$(cat "$run/daemon-token")" \
  "$bin/lakeshore" serve --addr "$addr" --data "$run/cp" --public-url "$url" >"$run/lakeshore.log" 2>&1 9>&- &
pids+=($!)
# Up means our own serve says it listens (not just anything answering on
# $addr) and answers the CLI.
until_up "${pids[0]}" 'grep -q "\"control plane listening\"" "$run/lakeshore.log" && "$bin/lakeshore" --server "$url" daemon list' \
  "lakeshore serve" "$run/lakeshore.log"
grep -i "admin token" "$run/lakeshore.log" || true

echo "==> starting nymph (log in $run/nymph.log)"
"$bin/nymph" run --config "$run/nymph.toml" >"$run/nymph.log" 2>&1 9>&- &
pids+=($!)
# Our own nymph's word that the control plane took its hello: the store
# kept from an earlier make run already knows a daemon labelled "local".
until_up "${pids[1]}" 'grep -q "\"daemon registered\"" "$run/nymph.log"' "nymph" "$run/nymph.log"

cat <<MSG

  lakeshore is up at $url with one daemon labelled "local". In another terminal:

    export PATH="$bin:\$PATH"
    lakeshore daemon list
    lakeshore daemon show local
    lakeshore daemon exec local uname -a
    lakeshore daemon exec local 'for i in 1 2 3; do echo tick \$i; sleep 1; done'
    lakeshore run --queue default --runner echo --args-json '{"hello":"world"}' demo:echo

  The README's tour goes on from there. Ctrl-C here stops both.
  The dashboard is at $url/ in a browser; log in with the admin token kept in
  $run/cp/admin-token (unless \$LAKESHORE_ADMIN_TOKEN set another).
MSG

wait -n "${pids[@]}" || true
exit
}
