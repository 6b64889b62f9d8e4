// Command lakeshore is the operator CLI of a nymph fleet, and starts its
// control plane: `lakeshore serve` (and `lakeshore blobs`) are handed to
// lakeshore-server, beside it, which links the stores and everything else
// the control plane needs, so this binary stays small and a one-shot verb
// such as `daemon exec` starts quickly. The commands live in package cli;
// this file only wires the process to them: arguments, streams, signals
// and the exit code.
package main

import (
	"os"
	"runtime"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/localdaemon"
)

func main() {
	// A verb is one request after another: with a processor per CPU each
	// hand-off inside net/http's client woke an idle thread, 0.1-0.5 ms of
	// a 10 ms `daemon exec`. $GOMAXPROCS, when set, wins; serve's own
	// process (lakeshore-server) chooses for itself.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	env := cli.SystemEnv()
	env.Procs = localdaemon.Scanner{}
	os.Exit(cli.Run(env))
}
