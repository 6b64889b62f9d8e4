// Package archtest holds the rules of the house that the compiler does not
// enforce: which package may import which. A new dependency that breaks the
// layering fails here, with the path that brings it in.
package archtest

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func listPackages(t *testing.T) map[string]pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "nymph/...")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = p
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	return pkgs
}

func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// ours filters deps down to this module's packages.
func ours(deps []string) []string {
	var out []string
	for _, d := range deps {
		if under(d, "nymph") || strings.HasPrefix(d, "nymph/") {
			out = append(out, d)
		}
	}
	return out
}

// A rule: no package under any of from may depend, directly or not, on a
// package under any of banned. Every prefix is a package path of this
// module; a rule naming a prefix that no package lives under fails, so a
// move cannot quietly turn a rule into one that checks nothing.
type rule struct {
	from   []string
	banned []string
	why    string
}

// ourModule stands for "any package of this module outside from".
const ourModule = "nymph"

var rules = []rule{
	{[]string{"nymph/messages"}, []string{ourModule}, "the vocabulary imports nothing of ours"},
	{[]string{"nymph/buildinfo", "nymph/backoff", "nymph/atomicfile", "nymph/batch", "nymph/timerslack", "nymph/gopool"}, []string{ourModule}, "buildinfo, backoff, atomicfile, batch, timerslack and gopool are leaves both sides use"},
	{[]string{"nymph/config"}, []string{"nymph/actors", "nymph/daemon", "nymph/runners", "nymph/lakeshore", "nymph/identity", "nymph/dist"}, "config knows only the vocabulary"},
	{[]string{"nymph/dist"}, []string{"nymph/actors", "nymph/daemon", "nymph/runners", "nymph/lakeshore", "nymph/identity", "nymph/config"}, "dist is neutral: both sides use it"},
	{[]string{"nymph/identity"}, []string{"nymph/actors", "nymph/daemon", "nymph/runners", "nymph/lakeshore"}, "identity is shared by both sides"},
	{[]string{"nymph/daemon", "nymph/actors", "nymph/runners"}, []string{"nymph/lakeshore"}, "the daemon carries no control plane"},
	{[]string{"nymph/lakeshore"}, []string{"nymph/actors", "nymph/daemon"}, "the control plane and the CLI never import the daemon"},
	{[]string{"nymph/runners"}, []string{"nymph/actors", "nymph/daemon", "nymph/config", "nymph/identity"}, "runners only know the contract and the vocabulary"},
	{[]string{"nymph/daemon"}, []string{"nymph/actors"}, "the daemon's plumbing sits below the actors"},
	{[]string{"nymph/lakeshore/store"}, []string{"nymph/lakeshore/controlplane", "nymph/lakeshore/cli", "nymph/lakeshore/opclient"}, "the store is below the control plane"},
	{[]string{"nymph/lakeshore/operatorapi"}, []string{"nymph/lakeshore/controlplane", "nymph/lakeshore/store", "nymph/lakeshore/cli"}, "the operator contract is shared by the CLI and the control plane"},
	{[]string{"nymph/cmd/nymph"}, []string{"nymph/lakeshore"}, "the daemon binary carries no control plane"},
}

func TestLayering(t *testing.T) {
	pkgs := listPackages(t)
	exists := func(prefix string) bool {
		for path := range pkgs {
			if under(path, prefix) {
				return true
			}
		}
		return false
	}
	for _, r := range rules {
		for _, prefix := range append(append([]string{}, r.from...), r.banned...) {
			if prefix != ourModule && !exists(prefix) {
				t.Errorf("rule %q names %s, but no package lives there any more: update the rule", r.why, prefix)
			}
		}
	}
	for path, p := range pkgs {
		if under(path, "nymph/test") {
			continue
		}
		for _, r := range rules {
			from := ""
			for _, f := range r.from {
				if under(path, f) {
					from = f
				}
			}
			if from == "" {
				continue
			}
			for _, d := range ours(p.Deps) {
				for _, b := range r.banned {
					if b == ourModule && !under(d, from) || b != ourModule && under(d, b) {
						t.Errorf("%s depends on %s: %s", path, d, r.why)
					}
				}
			}
		}
	}
	// Nothing imports cmd/, and only tests and the shared suites
	// (runnertest, storetest) import test/.
	for path, p := range pkgs {
		for _, d := range ours(p.Imports) {
			if under(d, "nymph/cmd") {
				t.Errorf("%s imports %s: nothing imports a main package", path, d)
			}
			if under(d, "nymph/test") && !under(path, "nymph/test") && !strings.HasSuffix(path, "test") {
				t.Errorf("%s imports %s: test support is for tests only", path, d)
			}
		}
	}
}

// TestNoGlobalLoggers forbids zerolog's global logger outside main
// packages: one logger is injected, never global.
func TestNoGlobalLoggers(t *testing.T) {
	// The pattern is split so this file does not match itself.
	pattern := `"github.com/rs/zerolog` + `/log"`
	out, err := exec.Command("git", "grep", "-n", "-F", pattern, "--", "*.go").CombinedOutput()
	if err != nil && len(out) == 0 {
		return // no match
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line != "" {
			t.Errorf("global zerolog logger imported: %s", line)
		}
	}
}
