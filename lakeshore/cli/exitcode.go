package cli

import (
	"errors"
	"fmt"

	"nymph/messages"
)

// Exit codes of lakeshore. The exec verbs pass the remote exit code
// through and use the Exec* codes for everything else.
const (
	ExitOK          = 0
	ExitError       = 1
	ExitUsage       = 2
	ExitNotRunning  = 3
	ExitInterrupted = 130

	ExitExecCLIFailed   = 125 // lakeshore itself failed during an exec verb
	ExitExecWaitExpired = 253 // --wait ran out; the exec may still be running
	ExitExecTimeout     = 254 // remote exit_code -2: killed after --timeout
	ExitExecFailed      = 255 // remote exit_code -1: spawn failure, cancelled, daemon shutdown
)

// ExitCodeHelp is the exit-code table shown in help texts.
const ExitCodeHelp = `Exit codes:
  0    success; also a confirmation declined or skipped on a non-terminal
  1    error (printed as "lakeshore: <message>")
  2    usage error (unknown verb or flag, missing or extra argument)
  3    daemon status: no nymph runs on this machine
  130  interrupted (Ctrl-C)`

// execExitHelp is the extra table of the exec verbs.
const execExitHelp = `Exit codes:
  0-252  the remote command's own exit code
  125    lakeshore itself failed (bad flag, unknown daemon, control plane unreachable, ...)
  130    interrupted with Ctrl-C; the remote exec, if one was sent, is cancelled
  253    --wait ran out before the result; the exec may still be running
  254    the remote command timed out (--timeout) and was killed
  255    the daemon could not run the command, or it was cancelled`

// RemoteExitCode maps an exec result's exit_code to this process's exit
// code: 0..255 pass through, the daemon's sentinels get codes of their own,
// and anything else a process cannot exit with reads as a failure.
func RemoteExitCode(code int32) int {
	switch {
	case code == messages.ExitTimeout:
		return ExitExecTimeout
	case code == messages.ExitFailed:
		return ExitExecFailed
	case code < 0 || code > 255:
		return ExitExecFailed
	default:
		return int(code)
	}
}

// exitError ends the program with code; a nil err prints nothing.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func exitWith(code int, err error) error { return &exitError{code: code, err: err} }

// usageError is a mistake in how lakeshore was called.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

func isUsage(err error) bool {
	var u *usageError
	return errors.As(err, &u)
}
