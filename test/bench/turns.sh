#!/usr/bin/env bash
# turns.sh compares the back-to-back exec loop (TestExecLoop) of two trees
# in turns: A, then B, then A again, ROUNDS times, SECS seconds each. On a
# shared machine whose speed swings by half within a minute, only runs
# taken in turns can be compared; a figure from an earlier minute is one of
# another machine.
#
#   test/bench/turns.sh REV_A [REV_B] [ROUNDS] [SECS]
#
# REV_A and REV_B are git revisions (HEAD, main, a commit); REV_B "." (the
# default) is the working tree as it is. ROUNDS defaults to 4, SECS to 16.
# Each arm's first thousand execs of every run are warm-up and not counted.
# It prints, per arm, the mean rate and each process's CPU per exec, then
# B's rate over A's. BENCH_CP_ENV and BENCH_NYMPH_ENV, if set, apply to
# both arms (see TestExecLoop).
#
#   test/bench/turns.sh HEAD          # the working tree against its HEAD
#   test/bench/turns.sh HEAD~1 HEAD 6 # the last commit, six rounds
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/go/bin:$PATH"

rev_a=${1:?usage: test/bench/turns.sh REV_A [REV_B] [ROUNDS] [SECS]}
rev_b=${2:-.}
rounds=${3:-4}
secs=${4:-16}
case "$rounds$secs" in *[!0-9]*) echo "turns.sh: ROUNDS and SECS are whole numbers, got '$rounds' and '$secs'" >&2; exit 2 ;; esac

work=$(mktemp -d)
trees=()
cleanup() {
	for t in "${trees[@]}"; do git worktree remove --force "$t" >/dev/null 2>&1 || true; done
	rm -rf "$work"
	git worktree prune
}
trap cleanup EXIT

# tree REV ARM sets dir_ARM to the directory holding REV: the working tree
# for ".", otherwise a worktree of its own.
tree() {
	local dir=$PWD
	if [ "$1" != . ]; then
		dir="$work/tree-$2"
		git worktree add --quiet --detach "$dir" "$1"
		trees+=("$dir")
	fi
	printf -v "dir_$2" '%s' "$dir"
}

tree "$rev_a" a
tree "$rev_b" b
for arm in a b; do
	dir=dir_$arm
	(cd "${!dir}" && go test -tags bench -c -o "$work/bench-$arm.test" ./test/bench/)
done

for i in $(seq "$rounds"); do
	for arm in a b; do
		dir=dir_$arm
		echo "round $i/$rounds: ${arm^^}" >&2
		(cd "${!dir}/test/bench" && BENCH_LOOP_S=$secs "$work/bench-$arm.test" -test.run '^TestExecLoop$' -test.v 2>&1) |
			grep -a 'execs:' | tail -n +2 | sed "s/^/${arm^^} /" >>"$work/lines"
	done
done

# A line: "A ... 3000 execs: 201 /s; CPU per exec: lakeshore serve 2.40 ms,
# nymph 1.41 ms, bash 2.21 ms, client 0.53 ms".
awk -v a="$rev_a" -v b="$rev_b" '
{
	arm = $1
	for (i = 2; i <= NF; i++) {
		if ($i == "/s;") rate[arm] += $(i - 1)
		if ($i == "serve") serve[arm] += $(i + 1)
		if ($i == "nymph") nymph[arm] += $(i + 1)
		if ($i == "bash") bash[arm] += $(i + 1)
		if ($i == "client") client[arm] += $(i + 1)
	}
	n[arm]++
}
END {
	if (!n["A"] || !n["B"]) { print "turns.sh: a tree gave no figures (is SECS long enough for two thousand execs?)" > "/dev/stderr"; exit 1 }
	name["A"] = a; name["B"] = b
	for (k = 0; k < 2; k++) {
		arm = k ? "B" : "A"; m = n[arm]
		printf "%s (%s): %d figures, %.0f execs/s; CPU per exec: lakeshore serve %.2f ms, nymph %.2f ms, bash %.2f ms, client %.2f ms\n",
			arm, name[arm], m, rate[arm] / m, serve[arm] / m, nymph[arm] / m, bash[arm] / m, client[arm] / m
	}
	printf "B/A rate: %.3f\n", (rate["B"] / n["B"]) / (rate["A"] / n["A"])
}' "$work/lines"
