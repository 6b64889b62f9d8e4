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

	"nymph/lakeshore/cli"
	"nymph/lakeshore/localdaemon"
)

func main() {
	env := cli.SystemEnv()
	env.Procs = localdaemon.Scanner{}
	os.Exit(cli.Run(env))
}
