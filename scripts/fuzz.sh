#!/usr/bin/env bash
# Runs every fuzz target of the module (each Fuzz* function of every
# package) for FUZZTIME (default 4s) with two workers: `make fuzz`, and the
# last step of `make test`. Targets are discovered, not listed here, so one
# added anywhere is run from then on.
#
# Each package's fuzz binary is built once and runs its targets in turn.
# A crash fails the step loudly: its output, the input that crashed (saved
# under the package's testdata/fuzz/<target>/, where plain `go test` then
# replays it as a regression test) and, at the end, the list of failures.
set -euo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"
FUZZTIME="${FUZZTIME:-4s}"
cache="$("$GO" env GOCACHE)/fuzz"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Packages that may hold a target; the test binary itself says which do
# (build tags and all).
mapfile -t dirs < <(grep -rl --include='*_test.go' -E '^func Fuzz[A-Z0-9_]' . | grep -v '/testdata/' | xargs -r -n1 dirname | sort -u)

start=$SECONDS
ran=0
failed=()
for dir in "${dirs[@]}"; do
  bin="$work/$(echo "${dir#./}" | tr / _).test"
  if ! "$GO" test -c -fuzz=. -o "$bin" "$dir"; then
    failed+=("$dir: the fuzz binary does not build")
    continue
  fi
  mapfile -t targets < <(cd "$dir" && "$bin" -test.list '^Fuzz' | grep '^Fuzz' || true)
  for target in "${targets[@]}"; do
    ran=$((ran + 1))
    out="$work/out"
    t0=$SECONDS
    fuzz() { # $1: the -fuzztime budget
      (cd "$dir" && "$bin" -test.run='^$' -test.fuzz="^${target}\$" -test.fuzztime="$1" \
        -test.fuzzminimizetime=0 -test.parallel=2 -test.fuzzcachedir="$cache") >"$out" 2>&1
    }
    note=""
    ok=0
    if fuzz "$FUZZTIME"; then
      ok=1
    elif ! grep -q 'Failing input written to' "$out" && grep -q 'context deadline exceeded' "$out"; then
      # Go's fuzz coordinator can report its own -fuzztime deadline as a
      # failure, with no input written (golang/go#75804, fixed in Go 1.27).
      # Not a crash: run the target again on a budget of executions, which
      # has no deadline to race; a real crash fails that run too.
      n=$(grep -o 'execs: [0-9]*' "$out" | tail -1 | grep -o '[0-9]*' || true)
      n=$(( ${n:-0} > 2000 ? n : 2000 ))
      if fuzz "${n}x"; then
        ok=1
        note=", again by ${n} executions after Go's fuzz deadline race"
      fi
    fi
    if ((ok)); then
      printf 'fuzz %-40s %-28s ok (%ss, %s%s)\n' "$dir" "$target" "$((SECONDS - t0))" \
        "$(grep -o 'execs: [0-9]*' "$out" | tail -1)" "$note"
    else
      failed+=("$dir $target")
      {
        echo
        echo "================================================================"
        echo "FUZZ FAILURE: $target in $dir"
        echo "================================================================"
        cat "$out"
        echo "----------------------------------------------------------------"
        echo "The input is saved under $dir/testdata/fuzz/$target/; replay it with:"
        echo "  $GO test -run '^${target}\$' $dir"
        echo "================================================================"
      } >&2
    fi
  done
done

echo "fuzz: $ran targets, ${FUZZTIME} each, in $((SECONDS - start))s"
if ((${#failed[@]} > 0)); then
  echo "fuzz: FAILED:" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
if ((ran == 0)); then
  echo "fuzz: no target found" >&2
  exit 1
fi
