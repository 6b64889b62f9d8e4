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

func TestLayering(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	// Each rule: packages under `from` must not depend (directly or not)
	// on packages under any of `banned`.
	rules := []struct {
		from   string
		banned []string
		why    string
	}{
		{"nymph/messages", []string{"nymph/"}, "the vocabulary imports nothing of ours"},
		{"nymph/config", []string{"nymph/actors", "nymph/runners", "nymph/uplink", "nymph/controlplane", "nymph/store"}, "config is leaf-level"},
		{"nymph/identity", []string{"nymph/actors", "nymph/controlplane", "nymph/store", "nymph/uplink"}, "identity is shared by both sides"},
		{"nymph/operatorapi", []string{"nymph/actors", "nymph/controlplane", "nymph/store", "nymph/runners", "nymph/cli"}, "the operator contract is shared"},
		{"nymph/controlplane", []string{"nymph/actors", "nymph/runners", "nymph/uplink", "nymph/outbox", "nymph/cli"}, "the control plane never imports the daemon"},
		{"nymph/store", []string{"nymph/actors", "nymph/runners", "nymph/uplink", "nymph/controlplane", "nymph/cli"}, "the store is below the control plane"},
		{"nymph/actors", []string{"nymph/store", "nymph/controlplane", "nymph/cli", "nymph/opclient"}, "the daemon never imports the store"},
		{"nymph/runners", []string{"nymph/actors", "nymph/store", "nymph/controlplane", "nymph/uplink"}, "runners only know the contract"},
		{"nymph/uplink", []string{"nymph/actors", "nymph/store", "nymph/controlplane"}, "the daemon's client is below the actors"},
		{"nymph/cmd/nymph", []string{"nymph/store", "nymph/controlplane", "nymph/cli"}, "the daemon binary carries no control plane"},
	}
	for _, r := range rules {
		for path, p := range pkgs {
			if !under(path, r.from) || strings.HasPrefix(path, "nymph/test/") {
				continue
			}
			for _, d := range ours(p.Deps) {
				for _, b := range r.banned {
					bad := under(d, strings.TrimSuffix(b, "/"))
					if b == "nymph/" {
						bad = d != path && !under(d, r.from)
					}
					if bad {
						t.Errorf("%s depends on %s: %s", path, d, r.why)
					}
				}
			}
		}
	}
	// Nothing imports cmd/, and only tests import test/.
	for path, p := range pkgs {
		for _, d := range ours(p.Imports) {
			if under(d, "nymph/cmd") {
				t.Errorf("%s imports %s: nothing imports a main package", path, d)
			}
			if under(d, "nymph/test") && !under(path, "nymph/test") {
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
