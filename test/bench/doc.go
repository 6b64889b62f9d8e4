// Package bench measures nymph and lakeshore against baselines taken in the
// same run (a bare bash spawn, ssh over a real sshd on loopback, raw pipe
// throughput), because the machines are shared and noisy. Run it with
// `make bench`; it is behind the "bench" build tag so `make test` skips it.
package bench
