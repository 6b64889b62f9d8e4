package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// ServerBinary is the program that has the verbs running the control plane
// itself (serve, blobs migrate) besides every verb of this CLI.
const ServerBinary = "lakeshore-server"

// EnvServerBinary names the lakeshore-server to hand those verbs to when it
// is neither beside lakeshore nor on $PATH.
const EnvServerBinary = "LAKESHORE_SERVER_BINARY"

// annHandOff marks the stand-ins of the verbs lakeshore-server runs.
const annHandOff = "lakeshore/hand-off"

// serverVerbNames are the verbs only lakeshore-server has.
var serverVerbNames = []string{"serve", "blobs"}

// Host is what a verb built outside this package (Env.ServerVerbs) gets of
// the run around it.
type Host struct{ a *app }

// Env is the run's environment.
func (h Host) Env() Env { return h.a.env }

// AdminToken is the root's --admin-token, once the flags are parsed (the
// verb's RunE): serve's own admin token when one is given.
func (h Host) AdminToken() string { return h.a.adminToken }

// serverCmds are the verbs that run the control plane: env.ServerVerbs's
// when it has them (lakeshore-server), otherwise one stand-in for each
// that hands the whole command line to lakeshore-server. The operator CLI
// does not link the stores, the blob SDKs or the metrics those verbs need,
// so every one-shot verb (`daemon exec`) starts in a third of the time.
func (a *app) serverCmds() []*cobra.Command {
	if a.env.ServerVerbs != nil {
		return a.env.ServerVerbs(Host{a: a})
	}
	shorts := map[string]string{
		"serve": "Run the control plane (lakeshore-server)",
		"blobs": "Manage where payloads and releases are kept (lakeshore-server)",
	}
	examples := map[string]string{
		"serve": "  lakeshore serve --data ~/.local/share/lakeshore\n  lakeshore serve --help",
		"blobs": "  lakeshore blobs migrate --to s3://lakeshore-blobs/prod\n  lakeshore blobs --help",
	}
	var cmds []*cobra.Command
	for _, name := range serverVerbNames {
		cmds = append(cmds, &cobra.Command{
			Use:   name,
			Short: shorts[name],
			Long: fmt.Sprintf(`'lakeshore %s' runs in %s, which has every verb of lakeshore and the
control plane besides: this lakeshore hands it the whole command line.
It is looked for in $%s, then beside this lakeshore, then on $PATH.
'lakeshore %s --help' shows its own help.`, name, ServerBinary, EnvServerBinary, name),
			Example:            examples[name],
			Annotations:        map[string]string{annHandOff: ServerBinary},
			DisableFlagParsing: true,
			RunE:               func(*cobra.Command, []string) error { return a.handOff() },
		})
	}
	return cmds
}

// handsOff reports whether args (without the program name) are a run of a
// verb only lakeshore-server has, including a shell's completion request
// for one, so Main hands them over before building any command.
func (a *app) handsOff(args []string) bool {
	if a.env.ServerVerbs != nil {
		return false
	}
	if len(args) > 0 && strings.HasPrefix(args[0], "__complete") {
		args = args[1:]
	}
	verbs := leadingVerbs(args, 1)
	return len(verbs) == 1 && slices.Contains(serverVerbNames, verbs[0])
}

// handOff replaces this process with lakeshore-server running the same
// command line: its pid, streams, signals and exit code are the verb's.
// It returns only when that cannot be done.
func (a *app) handOff() error {
	path, err := a.serverBinary()
	if err != nil {
		return err
	}
	if a.env.Exec == nil {
		return fmt.Errorf("this run cannot start %s (its environment has no Exec)", path)
	}
	argv := append([]string{ServerBinary}, a.args...)
	if err := a.env.Exec(path, argv, os.Environ()); err != nil {
		return fmt.Errorf("start %s: %w", path, err)
	}
	return nil
}

// serverBinary finds lakeshore-server: $LAKESHORE_SERVER_BINARY, beside
// this executable, then on $PATH.
func (a *app) serverBinary() (string, error) {
	if p := a.env.Getenv(EnvServerBinary); p != "" {
		if err := isExecutable(p); err != nil {
			return "", fmt.Errorf("$%s=%s: %w", EnvServerBinary, p, err)
		}
		return p, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), ServerBinary)
		if isExecutable(p) == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath(ServerBinary); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("this verb runs in %s, which is neither beside this lakeshore nor on $PATH: install it there (make build puts both in bin/), or set $%s to its path",
		ServerBinary, EnvServerBinary)
}

func isExecutable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errors.New("no such file")
	case err != nil:
		return err
	case fi.IsDir():
		return errors.New("is a directory")
	case fi.Mode()&0o111 == 0:
		return errors.New("not executable")
	}
	return nil
}

// Tree is the whole command tree of a run in env, built without running
// anything: for tests that walk every verb.
func Tree(env Env) *cobra.Command {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	return (&app{env: env}).rootCmd()
}

// SystemExec is the real Env.Exec: execve(2).
func SystemExec(path string, argv, envv []string) error { return syscall.Exec(path, argv, envv) }
