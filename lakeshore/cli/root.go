package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"nymph/buildinfo"
	"nymph/lakeshore/localdaemon"
	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

// Env is everything lakeshore takes from the process around it, so tests
// can drive the whole command tree in-process.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// Whether each stream is a terminal: prompts need StdinTTY, live
	// tables StdoutTTY, progress lines StderrTTY.
	StdinTTY, StdoutTTY, StderrTTY bool
	Now                            func() time.Time
	// Procs finds and stops local daemons (daemon status / stop).
	Procs localdaemon.Scanner
	// ServerVerbs builds the verbs that run the control plane itself
	// (serve, blobs; package servecli). Only lakeshore-server links them;
	// when nil, those verbs are handed to it through Exec.
	ServerVerbs func(Host) []*cobra.Command
	// Exec replaces the process with another program (SystemExec); nil
	// means it cannot, and a verb only lakeshore-server has fails.
	Exec func(path string, argv, envv []string) error
	// WatchSignals, when set, has SIGINT and SIGTERM cancel the verb's
	// context from now on (Run's signalWatch): a verb calls it before it
	// asks the operator anything. Calling it again does nothing.
	WatchSignals func()
}

// SystemEnv is the real process environment.
func SystemEnv() Env {
	return Env{
		Stdin:     os.Stdin,
		Stdout:    os.Stdout,
		Stderr:    os.Stderr,
		Getenv:    os.Getenv,
		StdinTTY:  isTerminal(os.Stdin),
		StdoutTTY: isTerminal(os.Stdout),
		StderrTTY: isTerminal(os.Stderr),
		Now:       time.Now,
		Exec:      SystemExec,
	}
}

// watchSignals has signals cancel the verb from now on, where the
// environment watches them (Env.WatchSignals).
func (a *app) watchSignals() {
	if a.env.WatchSignals != nil {
		a.env.WatchSignals()
	}
}

func isTerminal(f *os.File) bool {
	return isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())
}

// app holds the global flags and the environment of one run.
type app struct {
	env Env
	// args is the command line (without the program name), for a verb
	// handed to lakeshore-server whole.
	args       []string
	server     string
	adminToken string
	namespace  string
	caFile     string
}

const (
	// annExec marks the exec verbs, whose own failures exit 125.
	annExec = "lakeshore/exec"
	// annWatch marks verbs taking --watch [seconds].
	annWatch = "lakeshore/watch"
)

// Run runs lakeshore as this process (its arguments, env and os.Exit are
// the caller's): SIGINT or SIGTERM cancels the verb, and a second one ends
// the process at once. Signals are watched from signalsAfter into the run,
// or from the moment a verb asks something (Env.WatchSignals); before
// that, one ends the process as it would any program.
func Run(env Env) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &signalWatch{cancel: cancel}
	env.WatchSignals = w.start
	t := time.AfterFunc(signalsAfter, w.start)
	defer t.Stop()
	return Main(ctx, os.Args[1:], env)
}

// signalsAfter is how long into a run signals start to be watched. The
// watch costs a thread of its own, blocked for the signal, and the hand-off
// of the processor away from it: half a millisecond of an 8 ms `daemon
// exec` (measured: 29-48 context switches a run instead of 61-69). A verb
// that is over sooner is over before anyone could press Ctrl-C; a signal
// from a script in that window ends the process unwatched, leaving what it
// queued to run.
const signalsAfter = 50 * time.Millisecond

// signalWatch turns the first SIGINT or SIGTERM into cancel, then gives
// the signals their default back, so that a second one ends the process.
// start is safe to call from any goroutine, any number of times.
type signalWatch struct {
	once   sync.Once
	cancel context.CancelFunc
}

func (w *signalWatch) start() {
	w.once.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		go func() {
			<-ch
			signal.Stop(ch)
			w.cancel()
		}()
	})
}

// Main runs lakeshore with args (without the program name) and returns the
// process exit code. Cancelling ctx (SIGINT, SIGTERM) interrupts the verb.
func Main(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if env.Now == nil {
		env.Now = time.Now
	}
	if env.Stdin == nil {
		env.Stdin = strings.NewReader("")
	}
	if env.Stdout == nil {
		env.Stdout = io.Discard
	}
	if env.Stderr == nil {
		env.Stderr = io.Discard
	}
	a := &app{env: env, args: args}
	if a.handsOff(args) {
		return a.finish(ctx, nil, a.handOff())
	}
	root := a.execTree(args)
	if root == nil {
		root = a.rootCmd()
	}
	root.SetArgs(joinWatchValue(root, args))
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	cmd, err := root.ExecuteContextC(ctx)
	return a.finish(ctx, cmd, err)
}

// finish prints err (if any) and picks the exit code.
func (a *app) finish(ctx context.Context, cmd *cobra.Command, err error) int {
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			a.printErr(ee.err)
		}
		return ee.code
	}
	inExec := cmd != nil && cmd.Annotations[annExec] != ""
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		fmt.Fprintln(a.env.Stderr, "lakeshore: interrupted")
		return ExitInterrupted
	}
	a.printErr(err)
	if isUsage(err) {
		if cmd != nil {
			fmt.Fprintf(a.env.Stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
		if inExec {
			return ExitExecCLIFailed
		}
		return ExitUsage
	}
	if inExec {
		return ExitExecCLIFailed
	}
	return ExitError
}

func (a *app) printErr(err error) {
	msg := err.Error()
	switch {
	case opclient.IsUnauthorized(err):
		msg += "; check " + EnvAdminToken + " or --admin-token"
	case opclient.IsTransport(err) && !errors.Is(err, context.Canceled):
		msg += "; is `lakeshore serve` running there?"
	}
	fmt.Fprintf(a.env.Stderr, "lakeshore: %s\n", msg)
}

func (a *app) rootCmd() *cobra.Command {
	root := a.rootGroup()
	root.AddCommand(
		a.tokenCmd(),
		a.daemonCmd(),
		a.queueExecCmd(),
		a.completionCmd(),
		a.versionCmd(),
		a.releaseCmd(), a.queueCmd(), a.providerCmd(),
		a.runCmd(), a.invocationsCmd(),
	)
	root.AddCommand(a.serverCmds()...)
	return root
}

// execTree is the tree of a run of `daemon exec` or `exec`: that verb and
// the groups above it. Every other command is left unbuilt, which takes a
// start of the CLI 13 µs instead of the whole tree's 0.3 to 0.8 ms
// (measured), in front of every remote command. It is nil for any other
// run, which gets the whole tree (help, completion, suggestions for a
// mistyped verb). The verbs are told by the names of the commands
// themselves, built first.
func (a *app) execTree(args []string) *cobra.Command {
	verbs := leadingVerbs(args, 2)
	if len(verbs) == 0 {
		return nil
	}
	root := a.rootGroup()
	if group := a.daemonGroup(); isNamed(group, verbs[0]) {
		if len(verbs) < 2 {
			return nil
		}
		exec := a.daemonExecCmd()
		if !isNamed(exec, verbs[1]) {
			return nil
		}
		group.AddCommand(exec)
		root.AddCommand(group)
		return root
	}
	if exec := a.queueExecCmd(); isNamed(exec, verbs[0]) {
		root.AddCommand(exec)
		return root
	}
	return nil
}

func isNamed(cmd *cobra.Command, name string) bool {
	return cmd.Name() == name || cmd.HasAlias(name)
}

// rootTakesValue reports whether flag is one of the root's flags that
// take a value in the next argument.
func rootTakesValue(flag string) bool {
	switch flag {
	case "--server", "--admin-token", "--namespace", "-n", "--ca-file":
		return true
	}
	return false
}

// leadingVerbs returns up to n words of args that name commands: the
// words before the first flag that is not the root's, skipping the root's
// flags and their values. A help flag or a "--" among them ends the list
// empty, as the whole tree answers those.
func leadingVerbs(args []string, n int) []string {
	var verbs []string
	for i := 0; i < len(args) && len(verbs) < n; i++ {
		arg := args[i]
		name, _, hasValue := strings.Cut(arg, "=")
		switch {
		case arg == "--" || arg == "-h" || arg == "--help":
			return nil
		case rootTakesValue(arg):
			i++
		case strings.HasPrefix(arg, "-") && hasValue && rootTakesValue(name):
		case strings.HasPrefix(arg, "-"):
			// A verb's own flag: the verbs end here.
			return verbs
		default:
			verbs = append(verbs, arg)
		}
	}
	return verbs
}

// rootGroup is the root command without its verbs.
func (a *app) rootGroup() *cobra.Command {
	root := &cobra.Command{
		Use:   "lakeshore",
		Short: "Control plane and operator CLI for a fleet of nymph daemons",
		Long: `lakeshore runs the control plane (lakeshore serve) and drives the nymph daemons
registered to it: list them, run commands on them, push setup scripts, pause,
reset and remove them.

The CLI finds its control plane through --server or $LAKESHORE_URL and its
admin token through --admin-token or $LAKESHORE_ADMIN_TOKEN; on the machine
that runs 'lakeshore serve' it falls back to the credentials file serve
writes ($LAKESHORE_CREDENTIALS, else $XDG_CONFIG_HOME/lakeshore/credentials.json,
else ~/.config/lakeshore/credentials.json), so no flag is needed there.

` + ExitCodeHelp,
		Example: `  lakeshore serve --data ~/.local/share/lakeshore
  lakeshore daemon list
  lakeshore daemon exec gpu-rig nvidia-smi
  lakeshore exec --queue training uname -a`,
		Version:           buildinfo.Version,
		SilenceUsage:      true,
		SilenceErrors:     true,
		Args:              cobra.ArbitraryArgs,
		RunE:              groupRun,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetVersionTemplate("lakeshore {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return flagError(err) })
	pf := root.PersistentFlags()
	pf.StringVar(&a.server, "server", "", "control plane URL (default $"+EnvURL+", else the credentials file)")
	pf.StringVar(&a.adminToken, "admin-token", "", "admin token (default $"+EnvAdminToken+", else the credentials file)")
	pf.StringVarP(&a.namespace, "namespace", "n", "", `namespace (default $`+EnvNamespace+`, else "default")`)
	pf.StringVar(&a.caFile, "ca-file", "", "PEM file of CA certificates to trust for an https control plane (default $"+EnvCAFile+")")
	return root
}

// groupRun is the body of a command that only groups others: without
// arguments it prints help, with one it reports an unknown verb.
func groupRun(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usagef("%s", msg)
}

// client builds an operator API client from flags, environment and the
// credentials file.
func (a *app) client() (*opclient.Client, error) {
	t, err := resolveTarget(a.server, a.adminToken, a.namespace, a.env.Getenv)
	if err != nil {
		return nil, err
	}
	hc, err := a.httpClient()
	if err != nil {
		return nil, err
	}
	return opclient.New(t.URL, t.Token, opclient.Options{Namespace: t.Namespace, HTTPClient: hc})
}

func (a *app) ns() string {
	if a.namespace != "" {
		return a.namespace
	}
	if ns := a.env.Getenv(EnvNamespace); ns != "" {
		return ns
	}
	return operatorapi.DefaultNamespace
}

// Argument validators that report usage errors.

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), strings.Join(args, " "))
	}
	return nil
}

func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s wants %s, got %d argument(s)", cmd.CommandPath(), names, len(args))
		}
		return nil
	}
}

// joinWatchValue rewrites "--watch 5" as "--watch=5" for the verbs that
// take an optional --watch value, so the number is not read as an argument.
func joinWatchValue(root *cobra.Command, args []string) []string {
	cmd, _, err := root.Find(args)
	if err != nil || cmd.Annotations[annWatch] == "" {
		return args
	}
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		if args[i] == "--" {
			return append(out, args[i:]...)
		}
		if args[i] == "--watch" && i+1 < len(args) {
			if _, err := strconv.ParseFloat(args[i+1], 64); err == nil {
				out = append(out, "--watch="+args[i+1])
				i++
				continue
			}
		}
		out = append(out, args[i])
	}
	return out
}

func (a *app) versionCmd() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print lakeshore's version",
		Example: "  lakeshore version\n  lakeshore version --json",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if jsonOut {
				return writeJSON(a.env.Stdout, map[string]string{"version": buildinfo.Version})
			}
			_, err := fmt.Fprintf(a.env.Stdout, "lakeshore %s\n", buildinfo.Version)
			return err
		},
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

// requestAndClient is the prologue of the verbs that submit work: the
// request the flags and the words make (stdin may feed it), then an
// operator API client.
func requestAndClient[R any](a *app, request func([]string, io.Reader) (R, error), words []string) (R, *opclient.Client, error) {
	req, err := request(words, a.env.Stdin)
	if err != nil {
		return req, nil, err
	}
	c, err := a.client()
	return req, c, err
}

// describe names a worker for messages: "label (id)".
func describe(w operatorapi.Worker) string {
	if w.Label == "" || w.Label == w.ID {
		return w.ID
	}
	return fmt.Sprintf("%s (%s)", w.Label, w.ID)
}
