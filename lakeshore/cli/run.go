package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmihailenco/msgpack/v5"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// Exit codes of `lakeshore run` (see runExitHelp).
const (
	ExitRunFailed = 1
	ExitRunKilled = 2
)

const runExitHelp = `Exit codes:
  0    the invocation succeeded
  1    it failed (the function raised or exited non-zero, the daemon was lost,
       ...), or lakeshore itself failed (bad input refused, control plane
       unreachable)
  2    it was killed or cancelled; also a usage error
  130  interrupted with Ctrl-C; the invocation is cancelled
  253  --wait ran out before the outcome; the invocation may still finish`

type runFlags struct {
	queue    string
	runner   string
	image    string
	timeout  float64
	env      []string
	workdir  string
	asUser   string
	argsJSON string
	argsFile string
	script   string
	jsonOut  bool
	noWait   bool
	wait     float64
}

func (a *app) runCmd() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run [flags] (module:qualname | --script FILE)",
		Short: "Run a function on a daemon of a queue and print its result",
		Long: `Submit a function invocation to a queue. The control plane hands it to a member
of the queue (see 'lakeshore queue --help': the same daemons 'lakeshore exec
--queue' reaches) that offers the runner (process, python, docker,
gvisor, slurm or echo; without --runner the daemon's default), and lakeshore
waits for the outcome (a progress line on a terminal) and prints the result.
While it runs, what the function writes is printed as it comes: its stdout
to stdout, its stderr to stderr (not with --json; 'lakeshore invocations logs'
has it then).

The function is "module:qualname": for the python runner a Python function
(package.module:Class.method); for process, docker, gvisor and slurm the
module is the command to run and the qualname its one argument. --script FILE
runs a bash script instead (- reads it from stdin).

Arguments: --args-json converts JSON to msgpack here, so the python runner
gets real values (a list is *args, an object **kwargs); --args-file sends a
file's bytes as they are (- for stdin). Args above 256 KiB travel through
the control plane's payload store; the limit is 100 MiB.

The result's raw bytes are printed as they are, or as JSON when they decode
as one msgpack value. --json prints the whole invocation instead
{id, state, function, run_config, worker_id, result (base64), error, ...}.
--no-wait prints the invocation id and returns at once.

` + runExitHelp,
		Example: `  lakeshore run --queue gpu --runner python --args-json '[2, 3]' mathx.ops:add
  lakeshore run --queue gpu --runner docker --image busybox --args-file in.bin cat
  lakeshore run --queue default --script ./train.sh --timeout 3600 --env EPOCHS=3
  lakeshore run --queue bench --runner echo --args-json '{"x": 1}' --json m:f
  id=$(lakeshore run --no-wait --queue gpu --runner python jobs:nightly)`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("want one module:qualname, got %d arguments (put flags before it)", len(args))
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
			return a.runInvocation(ctx, c, f, req)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.queue, "queue", operatorapi.DefaultQueue, "queue to submit to; its members (by their queues, or the queue they poll, or a matching 'prefix*') take it")
	fs.StringVar(&f.runner, "runner", "", "runner kind: process, python, docker, gvisor, slurm or echo (default: the daemon's)")
	fs.StringVar(&f.image, "image", "", "container image (required for --runner docker; optional for gvisor)")
	floatVar(fs, &f.timeout, "timeout", 0, "kill the function after N seconds (0: no limit)")
	fs.StringArrayVar(&f.env, "env", nil, "environment variable K=V for the function (repeatable)")
	fs.StringVar(&f.workdir, "workdir", "", "working directory on the daemon (default: a fresh scratch directory)")
	fs.StringVar(&f.asUser, "as-user", "", "run as this user on the daemon (runuser -u)")
	fs.StringVar(&f.argsJSON, "args-json", "", "arguments as JSON, sent as msgpack")
	fs.StringVar(&f.argsFile, "args-file", "", "arguments: this file's raw bytes (- for stdin)")
	fs.StringVar(&f.script, "script", "", "run this bash script file instead of a function (- for stdin)")
	fs.BoolVar(&f.jsonOut, "json", false, "print the final invocation as JSON")
	fs.BoolVar(&f.noWait, "no-wait", false, "print the invocation id and return without waiting")
	floatVar(fs, &f.wait, "wait", 0, "give up waiting after N seconds, exit 253 (0: wait as long as it takes)")
	_ = cmd.RegisterFlagCompletionFunc("queue", a.completeQueue)
	_ = cmd.RegisterFlagCompletionFunc("runner", cobra.FixedCompletions(messages.RunnerKinds, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// request builds the InvocationRequest from the flags and arguments.
func (f *runFlags) request(args []string, stdin io.Reader) (operatorapi.InvocationRequest, error) {
	req := operatorapi.InvocationRequest{Queue: f.queue}
	switch {
	case len(args) == 1 && f.script != "":
		return req, usagef("give either module:qualname or --script, not both")
	case len(args) == 1:
		req.Function = args[0]
	case f.script != "":
		text, err := readInput("--script", f.script, stdin)
		if err != nil {
			return req, err
		}
		if strings.TrimSpace(string(text)) == "" {
			return req, usagef("--script %s: the script is empty", f.script)
		}
		req.Script = string(text)
	default:
		return req, usagef("missing the function to run: give module:qualname or --script FILE")
	}
	if f.argsJSON != "" && f.argsFile != "" {
		return req, usagef("give either --args-json or --args-file, not both")
	}
	if f.script == "-" && f.argsFile == "-" {
		return req, usagef("--script - and --args-file - cannot both read stdin")
	}
	if f.timeout < 0 || math.IsNaN(f.timeout) || math.IsInf(f.timeout, 0) {
		return req, usagef("--timeout %v: want a non-negative number of seconds", f.timeout)
	}
	if f.wait < 0 || math.IsNaN(f.wait) || math.IsInf(f.wait, 0) {
		return req, usagef("--wait %v: want a non-negative number of seconds", f.wait)
	}
	env, err := ParseEnv(f.env)
	if err != nil {
		return req, &usageError{err: err}
	}
	req.RunConfig = operatorapi.RunConfig{Image: f.image, TimeoutS: f.timeout, Env: env, Workdir: f.workdir}
	if f.runner != "" {
		r := f.runner
		req.RunConfig.Runner = &r
	}
	req.AsUser = f.asUser
	switch {
	case f.argsJSON != "":
		b, err := JSONToMsgpack([]byte(f.argsJSON))
		if err != nil {
			return req, usagef("--args-json: %v", err)
		}
		req.Args = b
	case f.argsFile != "":
		b, err := readInput("--args-file", f.argsFile, stdin)
		if err != nil {
			return req, err
		}
		if len(b) > messages.MaxPayload {
			return req, fmt.Errorf("--args-file %s: %d bytes is over the %d byte payload limit", f.argsFile, len(b), messages.MaxPayload)
		}
		req.Args = b
	}
	return req, nil
}

// readInput reads a file named by a flag, or stdin for "-", at most one
// byte past the payload limit so an oversized file is refused, not slurped.
func readInput(flag, name string, stdin io.Reader) ([]byte, error) {
	var r io.Reader = stdin
	if name != "-" {
		fh, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		defer fh.Close()
		r = fh
	}
	b, err := io.ReadAll(io.LimitReader(r, messages.MaxPayload+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, name, err)
	}
	return b, nil
}

// JSONToMsgpack converts one JSON document to the equivalent msgpack value:
// integers stay integers, other numbers become floats.
func JSONToMsgpack(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not valid JSON: more than one value")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("not valid JSON: trailing data")
	}
	v, err := fromJSONNumbers(v)
	if err != nil {
		return nil, err
	}
	return messages.Marshal(v)
}

func fromJSONNumbers(v any) (any, error) {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, nil
		}
		if u, err := parseUint(x.String()); err == nil {
			return u, nil
		}
		f, err := x.Float64()
		if err != nil || math.IsInf(f, 0) {
			return nil, fmt.Errorf("number %s does not fit a 64-bit float", x)
		}
		return f, nil
	case map[string]any:
		for k, e := range x {
			c, err := fromJSONNumbers(e)
			if err != nil {
				return nil, err
			}
			x[k] = c
		}
		return x, nil
	case []any:
		for i, e := range x {
			c, err := fromJSONNumbers(e)
			if err != nil {
				return nil, err
			}
			x[i] = c
		}
		return x, nil
	}
	return v, nil
}

func parseUint(s string) (uint64, error) {
	var u uint64
	_, err := fmt.Sscanf(s, "%d", &u)
	if err != nil || fmt.Sprint(u) != s {
		return 0, errors.New("not an unsigned integer")
	}
	return u, nil
}

// MsgpackToJSON renders data as indented JSON when it is exactly one
// msgpack value; ok is false otherwise. Map keys that are not strings are
// printed as strings, bin as base64, non-finite floats as null.
func MsgpackToJSON(data []byte) (out []byte, ok bool) {
	if len(data) == 0 {
		return nil, false
	}
	// The shape check first: declared lengths the bytes cannot hold are
	// refused before the decoder allocates for them.
	var probe msgpack.RawMessage
	if messages.Unmarshal(data, &probe) != nil {
		return nil, false
	}
	rd := bytes.NewReader(data)
	dec := msgpack.NewDecoder(rd)
	dec.SetMapDecoder(func(d *msgpack.Decoder) (any, error) { return d.DecodeUntypedMap() })
	v, err := dec.DecodeInterface()
	if err != nil || rd.Len() != 0 {
		return nil, false
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(jsonable(v)); err != nil {
		return nil, false
	}
	return buf.Bytes(), true
}

func jsonable(v any) any {
	switch x := v.(type) {
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[fmt.Sprint(k)] = jsonable(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonable(e)
		}
		return out
	case float32:
		return jsonable(float64(x))
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil
		}
		return x
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case nil, bool, string, []byte, int8, int16, int32, int64, uint8, uint16, uint32, uint64, int, uint:
		return x
	default:
		return fmt.Sprint(x)
	}
}

// runInvocation submits, follows and reports one invocation.
func (a *app) runInvocation(ctx context.Context, c *opclient.Client, f runFlags, req operatorapi.InvocationRequest) error {
	// Args over the inline threshold go to the payload store first,
	// straight to the URL presign answers (the control plane's bucket,
	// when it has one), so the submission carries a key, not the bytes.
	if len(req.Args) > messages.InlineThreshold {
		ref, err := c.UploadPayload(ctx, req.Args, "args")
		if err != nil {
			return fmt.Errorf("upload the %d byte args: %w", len(req.Args), err)
		}
		req.Args, req.ArgsKey = nil, ref.Key
	}
	// A Ctrl-C must not cut the submission short: the invocation may be
	// queued already, and only the answer names it so it can be cancelled.
	// A second Ctrl-C still ends lakeshore at once.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), submitBudget)
	sub, err := c.SubmitInvocation(sctx, req)
	cancel()
	if err != nil {
		return err
	}
	inv := sub.Invocation
	if ctx.Err() != nil && !f.noWait {
		return a.runInterrupted(c, inv.ID)
	}
	if f.noWait {
		if f.jsonOut {
			return writeJSON(a.env.Stdout, sub)
		}
		_, err := fmt.Fprintln(a.env.Stdout, inv.ID)
		return err
	}
	where := fmt.Sprintf("queue %q", inv.Queue)
	if sub.EligibleWorkers == 0 {
		runnerText := "its default runner"
		if req.RunConfig.Runner != nil {
			runnerText = "runner " + *req.RunConfig.Runner
		}
		a.warnWaiting(fmt.Sprintf("no daemon in %s with %s is active right now", where, runnerText), "invocation "+inv.ID, "one")
	}
	prog := startProgress(a.env.Stderr, a.env.StderrTTY && !f.jsonOut, fmt.Sprintf("invocation %s queued on %s", inv.ID, where))
	defer prog.Stop()

	wctx, cancel := ctx, context.CancelFunc(func() {})
	if f.wait > 0 {
		wctx, cancel = context.WithTimeout(ctx, time.Duration(f.wait*float64(time.Second)))
	}
	defer cancel()
	last := inv
	// The output prints as it comes (not with --json, whose stdout is the
	// one document); the progress line leaves the terminal to it.
	final, err := a.followRun(wctx, c, inv.ID, f.jsonOut, prog.Stop, func(cur operatorapi.Invocation, err error) {
		if err != nil {
			prog.Set(fmt.Sprintf("control plane unreachable, retrying (invocation %s)", inv.ID))
			return
		}
		last = cur
		prog.Set(progressText(cur, where))
	})
	prog.Stop()
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return a.runInterrupted(c, inv.ID)
	case wctx.Err() != nil:
		if f.jsonOut {
			_ = writeJSON(a.env.Stdout, last)
		}
		return gaveUp(fmt.Sprintf("%gs", f.wait), "invocation "+inv.ID, last.State)
	default:
		return err
	}
	if f.jsonOut {
		if err := writeJSON(a.env.Stdout, final); err != nil {
			return err
		}
		return exitWith(runExit(final.State), nil)
	}
	return a.runDone(final)
}

func progressText(inv operatorapi.Invocation, where string) string {
	switch inv.State {
	case operatorapi.InvocationQueued:
		return fmt.Sprintf("invocation %s queued on %s", inv.ID, where)
	case operatorapi.InvocationRunning:
		msg := fmt.Sprintf("invocation %s running on %s", inv.ID, workerName(inv))
		if tail := lastLine(inv.StdoutTail); tail != "" {
			msg += ": " + tail
		}
		return msg
	default:
		return fmt.Sprintf("invocation %s %s", inv.ID, inv.State)
	}
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\r\n")
	if i := strings.LastIndexAny(s, "\r\n"); i >= 0 {
		s = s[i+1:]
	}
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, s)
	if len(s) > 60 {
		s = "…" + s[len(s)-60:]
	}
	return s
}

func workerName(inv operatorapi.Invocation) string {
	if inv.WorkerLabel == "" || inv.WorkerLabel == inv.WorkerID {
		return orDash(inv.WorkerID)
	}
	return fmt.Sprintf("%s (%s)", inv.WorkerLabel, inv.WorkerID)
}

// runExit is the exit code of a terminal invocation.
func runExit(state string) int {
	switch state {
	case operatorapi.InvocationSucceeded:
		return ExitOK
	case operatorapi.InvocationKilled, operatorapi.InvocationCancelled:
		return ExitRunKilled
	default:
		return ExitRunFailed
	}
}

// runDone prints the outcome of a terminal invocation.
func (a *app) runDone(inv operatorapi.Invocation) error {
	code := runExit(inv.State)
	if inv.State == operatorapi.InvocationSucceeded {
		if err := writeResult(a.env.Stdout, inv.Result); err != nil {
			return err
		}
		return exitWith(code, nil)
	}
	a.printFailure(inv)
	return exitWith(code, nil)
}

// writeResult prints result bytes: as JSON when they are one msgpack
// value, else as they are.
func writeResult(w io.Writer, result []byte) error {
	if js, ok := MsgpackToJSON(result); ok {
		_, err := w.Write(js)
		return err
	}
	_, err := w.Write(result)
	return err
}

func (a *app) printFailure(inv operatorapi.Invocation) {
	what := inv.State
	if inv.State == operatorapi.InvocationKilled {
		what = "was killed"
	} else if inv.State == operatorapi.InvocationCancelled {
		what = "was cancelled"
	}
	msg := fmt.Sprintf("lakeshore: invocation %s %s", inv.ID, what)
	if inv.WorkerID != "" {
		msg += " on " + workerName(inv)
	}
	if e := inv.Error; e != nil {
		msg += ": " + e.Type
		if e.Message != "" {
			msg += ": " + e.Message
		}
	}
	fmt.Fprintln(a.env.Stderr, msg)
	if e := inv.Error; e != nil && e.Traceback != nil && *e.Traceback != "" {
		fmt.Fprintln(a.env.Stderr, strings.TrimRight(*e.Traceback, "\n"))
	}
}

// runInterrupted cancels the invocation the operator walked away from,
// with a short budget of its own.
func (a *app) runInterrupted(c *opclient.Client, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cancelBudget)
	defer cancel()
	if _, err := c.CancelInvocation(ctx, id); err != nil && opclient.StatusOf(err) != http.StatusConflict {
		return exitWith(ExitInterrupted, fmt.Errorf("interrupted; cancelling invocation %s failed: %w", id, err))
	}
	return exitWith(ExitInterrupted, fmt.Errorf("interrupted; invocation %s is being cancelled", id))
}
