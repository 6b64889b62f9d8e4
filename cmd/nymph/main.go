// Command nymph is the host daemon: it dials out to the control plane,
// long-polls for commands, runs them and posts the results back.
//
//	nymph run --config PATH [--queue Q]
//	nymph version
//
// Exit codes: 0 after a clean stop (a signal, or the idle policy), 1 when
// the daemon fails while running or another nymph holds its workdir, 2 for
// a bad command line or config, 3 when the control plane rejects the hello.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"nymph/buildinfo"
	"nymph/messages"
)

// Exit codes.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitRejected = 3
)

// exitError carries an exit code out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func main() {
	root := &cobra.Command{
		Use:           "nymph",
		Short:         "nymph host daemon",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var configPath, queue string
	run := &cobra.Command{
		Use:   "run --config PATH [--queue Q]",
		Short: "Run the daemon",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDaemon(cmd.Context(), configPath, queue)
		},
	}
	run.Flags().StringVar(&configPath, "config", "", "path of the TOML config (required)")
	run.Flags().StringVar(&queue, "queue", "", "queue to poll (overrides DREAMLAKE_QUEUE and [daemon] queue)")
	_ = run.MarkFlagRequired("config")
	version := &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "nymph %s (protocol %s)\n", buildinfo.Version, messages.ProtocolVersion)
		},
	}
	root.AddCommand(run, version)
	err := root.Execute()
	if err == nil {
		os.Exit(exitOK)
	}
	fmt.Fprintln(os.Stderr, "nymph:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	os.Exit(exitUsage)
}
