// Package bench measures nymph and lakeshore against baselines taken in the
// same run (a bare bash spawn, ssh over a real sshd on loopback, raw pipe
// throughput), because the machines are shared and noisy. Run it with
// `make bench`; it is behind the "bench" build tag so `make test` skips it.
//
// A change to the single exec path is judged by turns.sh, which runs the
// back-to-back exec loop (TestExecLoop) of two revisions in turns and
// prints the ratio of their rates: `test/bench/turns.sh HEAD` compares the
// working tree with its HEAD.
package bench
