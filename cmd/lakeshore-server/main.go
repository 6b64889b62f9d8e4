// Command lakeshore-server is the whole of lakeshore: the control plane
// (lakeshore-server serve, and blobs migrate) besides every verb of the
// operator CLI. The lakeshore CLI hands `lakeshore serve` and
// `lakeshore blobs` to it, so the CLI links none of the stores, blob SDKs
// and metrics the control plane needs and starts in a fraction of the time.
package main

import (
	"os"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/localdaemon"
	"nymph/lakeshore/servecli"
)

func main() {
	env := cli.SystemEnv()
	env.Procs = localdaemon.Scanner{}
	env.ServerVerbs = servecli.Verbs
	os.Exit(cli.Run(env))
}
