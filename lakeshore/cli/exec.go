package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"nymph/backoff"
	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// Exec tuning.
const (
	defaultExecWait = 600 * time.Second
	maxLongPoll     = 20 * time.Second
	// requestSlack is added to a long poll's own wait for the HTTP deadline.
	requestSlack = 15 * time.Second
	retryMin     = 100 * time.Millisecond
	retryMax     = 2 * time.Second
	cancelBudget = 5 * time.Second
	// progressFirstWait bounds the wait folded into a submission when a
	// progress line is shown.
	progressFirstWait = 2 * time.Second
	// submitBudget bounds a submission that a Ctrl-C does not interrupt.
	submitBudget = 30 * time.Second
)

type execFlags struct {
	byID    bool
	timeout float64
	env     []string
	workdir string
	stdin   string
	wait    float64
	jsonOut bool
	queue   string
}

func (f *execFlags) register(cmd *cobra.Command, withID bool) {
	fs := cmd.Flags()
	// Everything after the daemon (or, for `exec`, the first word of the
	// command) belongs to the remote command, flags included.
	fs.SetInterspersed(false)
	if withID {
		fs.BoolVar(&f.byID, "id", false, "take <daemon> as a literal worker id")
	}
	floatVar(fs, &f.timeout, "timeout", 0, "SIGTERM the command after N seconds, SIGKILL 5 s later (exit 254)")
	fs.StringArrayVar(&f.env, "env", nil, "extra environment variable K=V, merged over the daemon's (repeatable)")
	fs.StringVar(&f.workdir, "workdir", "", "working directory on the daemon")
	fs.StringVar(&f.stdin, "stdin", "", "feed a file to the command's stdin, or - for this terminal's stdin")
	floatVar(fs, &f.wait, "wait", defaultExecWait.Seconds(), "total seconds to wait for the result (exit 253 when it runs out)")
	fs.BoolVar(&f.jsonOut, "json", false, "print the final exec envelope as JSON instead of streaming output")
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annExec] = "1"
}

// request builds the ExecRequest from the flags and the remote words.
func (f *execFlags) request(words []string, stdin io.Reader) (operatorapi.ExecRequest, error) {
	if len(words) > 0 && words[0] == "--" {
		words = words[1:]
	}
	if len(words) == 0 {
		return operatorapi.ExecRequest{}, usagef("missing the command to run")
	}
	env, err := ParseEnv(f.env)
	if err != nil {
		return operatorapi.ExecRequest{}, &usageError{err: err}
	}
	if f.timeout < 0 {
		return operatorapi.ExecRequest{}, usagef("--timeout %v: must not be negative", f.timeout)
	}
	if f.wait <= 0 {
		return operatorapi.ExecRequest{}, usagef("--wait %v: must be positive", f.wait)
	}
	req := operatorapi.ExecRequest{
		Command:  remoteCommand(words),
		Env:      env,
		Workdir:  f.workdir,
		TimeoutS: f.timeout,
		Stream:   !f.jsonOut,
		Queue:    f.queue,
	}
	switch f.stdin {
	case "":
	case "-":
		b, err := io.ReadAll(stdin)
		if err != nil {
			return req, fmt.Errorf("--stdin -: %w", err)
		}
		req.Stdin = b
	default:
		b, err := os.ReadFile(f.stdin)
		if err != nil {
			return req, fmt.Errorf("--stdin: %w", err)
		}
		req.Stdin = b
	}
	return req, nil
}

// remoteCommand joins the remote words with spaces, as ssh does: the daemon
// runs the result with bash -c, so one quoted argument can carry a whole
// script and several words read like a typed command line.
func remoteCommand(words []string) string {
	return strings.Join(words, " ")
}

func (a *app) daemonExecCmd() *cobra.Command {
	var f execFlags
	cmd := &cobra.Command{
		Use:   "exec [flags] <daemon> CMD...",
		Short: "Run a shell command on a daemon and stream its output back",
		Long: `Run a shell command on one daemon (through bash -c) and stream its output as it
is produced. Everything after <daemon> is the remote command, so lakeshore's
own flags go first; no "--" is needed. Several words are joined with spaces,
as ssh does; quote a whole script as one argument.

Output streams to stdout (the daemon interleaves the command's stdout and
stderr). --json instead waits and prints the final exec envelope
{execId, workerId, command, state, createdAt, ..., result: {exit_code, stdout,
stderr, duration_ms, error, ...}}. Ctrl-C cancels the remote command.

` + execExitHelp,
		Example: `  lakeshore daemon exec gpu-rig nvidia-smi
  lakeshore daemon exec --timeout 30 --env CUDA_VISIBLE_DEVICES=0 gpu-rig python3 train.py
  lakeshore daemon exec --stdin ./data.csv gpu-rig 'wc -l'
  lakeshore daemon exec gpu-rig 'for i in 1 2 3; do echo tick $i; sleep 1; done'
  lakeshore daemon exec --json gpu-rig uname -a | jq .result.exitCode`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 {
				return usagef("missing <daemon> and the command to run")
			}
			return nil
		},
		ValidArgsFunction: a.completeExecDaemon,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			req, c, err := requestAndClient(a, f.request, args[1:])
			if err != nil {
				return err
			}
			ref := args[0]
			if f.byID {
				// The control plane would take a label too: --id means an id.
				w, err := workerByID(ctx, c, ref)
				if err != nil {
					return err
				}
				ref = w.ID
			}
			return a.runExec(ctx, c, f, req, "", func(ctx context.Context, wait time.Duration) (operatorapi.ExecAccepted, *operatorapi.Exec, error) {
				// The control plane knows ids and labels that name one
				// worker: one request. Anything else (a label prefix, a
				// label shared by several) is resolved here, from the list.
				acc, ex, err := c.SubmitExec(ctx, ref, req, wait)
				if f.byID || !needsLocalResolve(err) {
					return acc, ex, err
				}
				w, err := a.resolve(ctx, c, args[0])
				if err != nil {
					return acc, nil, err
				}
				return c.SubmitExec(ctx, w.ID, req, wait)
			})
		},
	}
	f.register(cmd, true)
	return cmd
}

func (a *app) queueExecCmd() *cobra.Command {
	var f execFlags
	cmd := &cobra.Command{
		Use:   "exec [flags] CMD...",
		Short: "Run a shell command on a daemon picked by queue, or from a list",
		Long: `Run a shell command on some daemon. With --queue the control plane routes it to
an eligible member of that queue (active, not stale). Without --queue, on a
terminal, lakeshore lists the active daemons to choose from: type to filter
(every word must appear in the label, id, queues or tags), move with the
arrow keys, Enter runs the command there; Ctrl-C cancels (exit 130), as does
Esc (exit 125). Without a terminal that is an error.

Flags come first; everything after them is the remote command. Otherwise
this is 'lakeshore daemon exec' (see its help for streaming and --json).

` + execExitHelp,
		Example: `  lakeshore exec --queue training uname -a
  lakeshore exec --queue gpu --timeout 60 nvidia-smi
  lakeshore exec hostname            # pick a daemon interactively`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 {
				return usagef("missing the command to run")
			}
			return nil
		},
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			req, c, err := requestAndClient(a, f.request, args)
			if err != nil {
				return err
			}
			if f.queue != "" {
				return a.runExec(ctx, c, f, req, "queue "+strconv.Quote(f.queue), func(ctx context.Context, wait time.Duration) (operatorapi.ExecAccepted, *operatorapi.Exec, error) {
					return c.SubmitQueueExec(ctx, req, wait)
				})
			}
			if !a.env.StdinTTY {
				return usagef("no daemon chosen: pass --queue Q, or use `lakeshore daemon exec <daemon> CMD...` (the picker needs a terminal)")
			}
			if f.stdin == "-" {
				return usagef("--stdin - cannot share the terminal with the daemon picker; pass --queue or use `lakeshore daemon exec`")
			}
			w, err := a.pickDaemon(ctx, c)
			if err != nil {
				return err
			}
			req.Queue = ""
			return a.runExec(ctx, c, f, req, describe(w), func(ctx context.Context, wait time.Duration) (operatorapi.ExecAccepted, *operatorapi.Exec, error) {
				return c.SubmitExec(ctx, w.ID, req, wait)
			})
		},
	}
	f.register(cmd, false)
	cmd.Flags().StringVar(&f.queue, "queue", "", "let the control plane pick an eligible member of this queue")
	_ = cmd.RegisterFlagCompletionFunc("queue", a.completeQueue)
	return cmd
}

// pickDaemon lets the operator choose one of the active daemons on the
// terminal.
func (a *app) pickDaemon(ctx context.Context, c *opclient.Client) (operatorapi.Worker, error) {
	ws, err := c.ListWorkers(ctx)
	if err != nil {
		return operatorapi.Worker{}, err
	}
	var active []operatorapi.Worker
	for _, w := range sortedWorkers(ws) {
		if w.State == operatorapi.StateActive {
			active = append(active, w)
		}
	}
	if len(active) == 0 {
		return operatorapi.Worker{}, fmt.Errorf("no active daemon in namespace %q to pick from", c.Namespace())
	}
	a.watchSignals()
	return pick(ctx, a.env.Stdin, a.env.Stderr, active)
}

// runExec submits an exec, follows it to its end and turns the remote exit
// code into this process's. submit may wait up to
// the given time for the first news of the exec in the same request (see
// opclient.SubmitExec); where names the target in messages, and when empty
// is taken from the answer.
func (a *app) runExec(ctx context.Context, c *opclient.Client, f execFlags, req operatorapi.ExecRequest, where string,
	submit func(context.Context, time.Duration) (operatorapi.ExecAccepted, *operatorapi.Exec, error)) error {
	wait := time.Duration(f.wait * float64(time.Second))
	deadline := time.Now().Add(wait)
	// The submission waits for the first output or the end, but only
	// briefly on a terminal, whose progress line should show when the
	// daemon picks the command up.
	firstWait := min(wait, maxLongPoll)
	if a.env.StderrTTY && !f.jsonOut {
		firstWait = min(firstWait, progressFirstWait)
	}
	acc, first, err := submit(ctx, firstWait)
	if err != nil {
		return err
	}
	if where == "" {
		where = describe(operatorapi.Worker{ID: acc.WorkerID, Label: acc.Label})
	}
	if why := targetNotReady(acc, where, a.env.Now()); why != "" && (first == nil || first.State != operatorapi.ExecFinished) {
		a.warnWaiting(why, "exec "+acc.ExecID, fmt.Sprintf("it for up to --wait %gs", f.wait))
	}
	prog := startProgress(a.env.Stderr, a.env.StderrTTY && !f.jsonOut, fmt.Sprintf("waiting for %s (exec %s, queued)", where, acc.ExecID))
	defer prog.Stop()

	var (
		offset   int64
		last     operatorapi.Exec
		retry    = backoff.New(retryMin, retryMax)
		draining bool
	)
	for {
		left := time.Until(deadline)
		// News already in hand, and the output of an exec that has
		// finished, are read before giving up.
		if left <= 0 && first == nil && !draining {
			prog.Stop()
			return a.execGaveUp(ctx, c, f, acc, where, last)
		}
		poll := min(left, maxLongPoll)
		if draining {
			poll = 0
		}
		var ex operatorapi.Exec
		if first != nil {
			ex, first, err = *first, nil, nil
		} else {
			rctx, cancel := context.WithTimeout(ctx, poll+requestSlack)
			ex, err = c.GetExec(rctx, acc.ExecID, poll, offset)
			cancel()
		}
		if err != nil {
			if ctx.Err() != nil {
				prog.Stop()
				return a.execInterrupted(c, acc, where)
			}
			if !opclient.Retryable(err) && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			prog.Set(fmt.Sprintf("control plane unreachable, retrying (exec %s on %s)", acc.ExecID, where))
			if !backoff.Sleep(ctx, min(retry.Next(), time.Until(deadline))) && ctx.Err() != nil {
				prog.Stop()
				return a.execInterrupted(c, acc, where)
			}
			continue
		}
		retry.Reset()
		last = ex
		if chunk := newOutput(ex, offset); len(chunk) > 0 && !f.jsonOut {
			prog.Stop()
			if _, err := a.env.Stdout.Write(chunk); err != nil {
				return fmt.Errorf("write output: %w", err)
			}
		}
		if ex.NextOffset > offset {
			offset = ex.NextOffset
		} else if n := ex.Offset + int64(len(ex.Output)); n > offset {
			offset = n
		}
		if ex.State == operatorapi.ExecFinished && ex.Result == nil {
			prog.Stop()
			return fmt.Errorf("exec %s on %s finished without a result", acc.ExecID, where)
		}
		if ex.State == operatorapi.ExecFinished {
			if len(ex.Output) > 0 && !f.jsonOut {
				// Output may still trail the result; read, without
				// waiting, until a call brings nothing new.
				draining = true
				continue
			}
			prog.Stop()
			return a.execDone(ctx, c, f, ex, where)
		}
		prog.Set(fmt.Sprintf("waiting for %s (exec %s, %s)", where, acc.ExecID, orDash(ex.State)))
	}
}

// needsLocalResolve reports whether the control plane turned a daemon
// argument down in a way the CLI's own resolution may still answer: no
// worker with that id or label (it may be a label prefix), or a label
// several workers share (one of them may be the only live one).
func needsLocalResolve(err error) bool {
	var e *opclient.Error
	if !errors.As(err, &e) || e.Field != "id" {
		return false
	}
	return e.Status == http.StatusNotFound || e.Status == http.StatusConflict
}

// newOutput returns the bytes of ex.Output past offset, trimming any
// overlap with what was already written.
func newOutput(ex operatorapi.Exec, offset int64) []byte {
	out := ex.Output
	if skip := offset - ex.Offset; skip > 0 {
		if skip >= int64(len(out)) {
			return nil
		}
		out = out[skip:]
	}
	return out
}

func (a *app) execDone(ctx context.Context, c *opclient.Client, f execFlags, ex operatorapi.Exec, where string) error {
	res := ex.Result
	code := RemoteExitCode(res.ExitCode)
	if f.jsonOut {
		// A fresh read from offset 0 is the whole envelope, independent of
		// how the wait went.
		if full, err := c.GetExec(ctx, ex.ExecID, 0, 0); err == nil {
			ex = full
		}
		if err := writeJSON(a.env.Stdout, ex); err != nil {
			return err
		}
		return exitWith(code, nil)
	}
	// A daemon that did not stream ships its output in the result.
	if res.Stdout != "" {
		if _, err := io.WriteString(a.env.Stdout, res.Stdout); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
	}
	if res.Stderr != "" {
		_, _ = io.WriteString(a.env.Stderr, res.Stderr)
	}
	detail := ""
	if res.Error != nil && *res.Error != "" {
		detail = ": " + *res.Error
	}
	switch {
	case res.ExitCode == messages.ExitTimeout:
		fmt.Fprintf(a.env.Stderr, "lakeshore: exec %s on %s timed out and was killed%s\n", ex.ExecID, where, detail)
	case code == ExitExecFailed:
		fmt.Fprintf(a.env.Stderr, "lakeshore: exec %s on %s failed (exit_code %d)%s\n", ex.ExecID, where, res.ExitCode, detail)
	case detail != "":
		fmt.Fprintf(a.env.Stderr, "lakeshore: exec %s%s\n", ex.ExecID, detail)
	}
	return exitWith(code, nil)
}

func (a *app) execGaveUp(ctx context.Context, c *opclient.Client, f execFlags, acc operatorapi.ExecAccepted, where string, last operatorapi.Exec) error {
	// A fresh read tells the state now, which the last one (if any: the
	// wait may run out before the first answer) may not.
	rctx, cancel := context.WithTimeout(ctx, cancelBudget)
	full, err := c.GetExec(rctx, acc.ExecID, 0, 0)
	cancel()
	ex := last
	if err == nil {
		ex = full
	}
	if f.jsonOut {
		out := ex
		if out.ExecID == "" {
			out = operatorapi.Exec{ExecID: acc.ExecID, WorkerID: acc.WorkerID}
		}
		if err := writeJSON(a.env.Stdout, out); err != nil {
			return err
		}
	}
	state := ex.State
	if ex.ExecID == "" {
		state = ""
	}
	return gaveUp(fmt.Sprintf("%gs", f.wait), fmt.Sprintf("exec %s on %s", acc.ExecID, where), state)
}

// execInterrupted asks the daemon to cancel the exec the operator walked
// away from, with a short budget of its own.
func (a *app) execInterrupted(c *opclient.Client, acc operatorapi.ExecAccepted, where string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cancelBudget)
	defer cancel()
	if _, err := c.Cancel(ctx, acc.WorkerID, operatorapi.CancelRequest{ExecID: acc.ExecID}); err != nil {
		return exitWith(ExitInterrupted, fmt.Errorf("interrupted; cancelling exec %s on %s failed: %w", acc.ExecID, where, err))
	}
	return exitWith(ExitInterrupted, fmt.Errorf("interrupted; exec %s on %s is being cancelled", acc.ExecID, where))
}
