package cli

import (
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// What follows lets the verbs of package servecli fail, print and exit as
// every verb here does.

// Usagef is a usage error (exit 2, "Run '... --help' for usage.").
func Usagef(format string, args ...any) error { return usagef(format, args...) }

// UsageError makes err a usage error.
func UsageError(err error) error { return &usageError{err: err} }

// ExitWith makes lakeshore exit with code, printing err if it is not nil.
func ExitWith(code int, err error) error { return exitWith(code, err) }

// WriteJSON prints v as the --json output of a verb.
func WriteJSON(w io.Writer, v any) error { return writeJSON(w, v) }

// GroupRun is the RunE of a command that only groups verbs.
func GroupRun(cmd *cobra.Command, args []string) error { return groupRun(cmd, args) }

// NoArgs refuses any argument, as a usage error.
func NoArgs(cmd *cobra.Command, args []string) error { return noArgs(cmd, args) }

// FloatVar is pflag's Float64Var whose parse error names a number.
func FloatVar(fs *pflag.FlagSet, p *float64, name string, def float64, usage string) {
	floatVar(fs, p, name, def, usage)
}

// ByteSize renders a size the way ls -h does.
func ByteSize(n int64) string { return byteSize(n) }

// WithScheme lets "host:port" stand for "http://host:port".
func WithScheme(u string) string { return withScheme(u) }
