// Package cli owns the lakeshore command line: the cobra command tree, how
// it finds its control plane and admin token, how it prints (tables for
// people, stable JSON for scripts) and what its exit codes mean. `lakeshore
// serve` is wired here too; the server itself lives in package controlplane.
//
// Exit codes (see ExitCodeHelp):
//
//	0    success; also a confirmation declined or skipped on a non-terminal
//	1    an error (the message is printed as "lakeshore: ...")
//	2    a usage error: unknown verb or flag, missing or extra argument
//	3    daemon status: no nymph runs on this machine
//	130  interrupted (Ctrl-C)
//
// The exec verbs pass the remote exit code through instead, and keep a few
// codes of their own: 125 lakeshore itself failed, 253 --wait ran out before
// the result, 254 the remote command timed out (--timeout), 255 the daemon
// could not run it or it was cancelled.
package cli
