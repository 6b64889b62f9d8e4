// Command lakeshore-server is the whole of lakeshore: the control plane
// (lakeshore-server serve, and blobs migrate) besides every verb of the
// operator CLI. The lakeshore CLI hands `lakeshore serve` and
// `lakeshore blobs` to it, so the CLI links none of the stores, blob SDKs
// and metrics the control plane needs and starts in a fraction of the time.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/localdaemon"
	"nymph/lakeshore/servecli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal the context is done; give the default
	// behaviour back so a second Ctrl-C ends the process at once.
	go func() {
		<-ctx.Done()
		stop()
	}()
	env := cli.SystemEnv()
	env.Procs = localdaemon.Scanner{}
	env.ServerVerbs = servecli.Verbs
	code := cli.Main(ctx, os.Args[1:], env)
	stop()
	os.Exit(code)
}
