// Package scale is the fleet-scale benchmark of `make bench-scale`: a load
// generator of N simulated daemons in the test process, each on its own
// keep-alive connection speaking the real daemon wire (msgpack hello, long
// polls that echo the cursor, exec results), and an operator queuing execs
// through the operator API at a fixed rate, open loop, against a real
// `lakeshore serve` it starts itself (SQLite, and two replicas on one real
// PostgreSQL). It prints registration time, dispatch and round-trip
// latency, the finished rate under overload, errors, and the control
// plane's CPU and memory, each also as a ratio against the smallest fleet of
// the same run; and the targets beside them. The benchmark itself is
// behind the "scale" build tag; the pure pieces it stands on (percentiles,
// the rate pacer, /proc parsing) are not, so `make test` covers them.
package scale
