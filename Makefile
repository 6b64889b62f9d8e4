# Entry points for building and testing nymph and lakeshore.
# CI runs `bash .ci/run`, which installs the test dependencies
# (test/infra/install.sh) and then runs `make test DEPS=`.

GO      ?= go
# -mod=readonly: never rewrite go.mod behind anyone's back. Test builds
# keep the default flags so they share the build cache with plain
# `go test`; binaries are built with -trimpath for reproducibility.
GOFLAGS ?= -mod=readonly
export GOFLAGS
BUILD_FLAGS ?= -trimpath -ldflags "$(LDFLAGS)"
# Binaries are static (no cgo): nymph is copied to hosts whose libc is not
# ours, and a static lakeshore starts faster, which every CLI call pays.
# (Only for binaries: the race detector of make test needs cgo.)

VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS      ?= -X nymph/buildinfo.Version=$(VERSION)
PKGS         ?= ./...
TEST_TIMEOUT ?= 12m
TEST_FLAGS   ?= -race -count=1 -timeout $(TEST_TIMEOUT)

.PHONY: all build deps test vet fuzz bench bench-scale chaos run clean

all: build

build:
	@if [ -d cmd ]; then \
		mkdir -p bin && CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o bin/ ./cmd/...; \
	else \
		echo "build: no cmd/ directory yet, nothing to build"; \
	fi

vet:
	$(GO) vet $(PKGS)

# make test first installs what the tests of real components need (runsc,
# podman, slurm, sshd, postgres: test/infra/install.sh, one dpkg-query when
# all is there), since those tests skip themselves when a part is missing
# and a fresh machine would otherwise pass them all without running one.
# DEPS= skips the step (.ci/run, which has run it already). On a machine
# without apt-get or root it fails and says so; DEPS= is the way round.
DEPS ?= bash test/infra/install.sh

deps:
	$(if $(DEPS),$(DEPS),@echo "deps: skipped (DEPS is empty)")

# make test ends with the fuzz step: every Fuzz* target of the module for
# FUZZTIME each (scripts/fuzz.sh); a crash fails it with the input saved.
test: deps vet
	$(GO) test $(TEST_FLAGS) $(PKGS)
	GO="$(GO)" FUZZTIME="$(FUZZTIME)" scripts/fuzz.sh

# Every fuzz target, FUZZTIME each (make fuzz FUZZTIME=1m for a longer hunt).
FUZZTIME ?= 4s

fuzz:
	GO="$(GO)" FUZZTIME="$(FUZZTIME)" scripts/fuzz.sh

bench:
	@if [ -x test/bench/run.sh ]; then \
		test/bench/run.sh; \
	else \
		echo "bench: test/bench/run.sh does not exist yet" >&2; exit 1; \
	fi

# The fleet-scale benchmark (test/scale, build tag scale; never run by make
# test): N simulated daemons in the test process long-poll a fresh
# `lakeshore serve` on SQLite while an operator queues execs at 100/s and
# then 1,000/s, for N = 1,000, 10,000 and 15,000, then two replicas on one
# PostgreSQL. It prints dispatch and round-trip p50/p99, the finished rate,
# errors, CPU and RSS, as ratios against N = 1,000, beside the targets.
# About 2.5 minutes. Knobs, all optional: SCALE_NS (fleet sizes,
# "1000,10000,15000"; 0 for none), SCALE_SECONDS (the 100/s phase, 20; the 1,000/s one
# is half), SCALE_REPLICAS (daemons of the two-replica run, 10000; 0 skips
# it). A quick look: make bench-scale SCALE_NS=1000 SCALE_REPLICAS=0.
bench-scale:
	SCALE_NS="$(SCALE_NS)" SCALE_SECONDS="$(SCALE_SECONDS)" SCALE_REPLICAS="$(SCALE_REPLICAS)" \
		$(GO) test -tags scale -run '^TestScale$$' -count=1 -v -timeout 15m ./test/scale/

# The soak: CHAOS_JOBS jobs of every kind (short, streaming and timing-out
# execs, runs, setups) on one daemon while its actors are crashed and
# stopped at random (TestChaosSoak in actors/chaos_test.go). It prints the
# lost, duplicated and orphaned counts, the goroutine delta and the
# throughput, and fails unless they are 0, 0, 0 and at most +8. Knobs, all
# optional: CHAOS_SEED (printed by every run, to replay one),
# CHAOS_MAX_INVOCATIONS (permits, 48), CHAOS_KILL_EVERY (mean pause between
# two blows, 150ms), CHAOS_LOG (keep the daemon's log there).
CHAOS_JOBS  ?= 10000
CHAOS_FLAGS ?= -race -timeout 15m
export CHAOS_JOBS

chaos:
	$(GO) test $(CHAOS_FLAGS) -count=1 -v -run '^TestChaosSoak$$' ./actors/

run:
	@if [ -x scripts/run-local.sh ]; then \
		scripts/run-local.sh; \
	else \
		echo "run: scripts/run-local.sh does not exist yet" >&2; exit 1; \
	fi

clean:
	rm -rf bin
