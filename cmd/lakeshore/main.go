// Command lakeshore is the control plane (lakeshore serve) and the operator
// CLI of a nymph fleet. The commands live in package cli; this file only
// wires the process to them: arguments, streams, signals and the exit code.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/localdaemon"
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
	code := cli.Main(ctx, os.Args[1:], env)
	stop()
	os.Exit(code)
}
