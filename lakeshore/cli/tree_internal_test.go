package cli

import (
	"slices"
	"testing"

	"github.com/spf13/pflag"
)

func TestLeadingVerbs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"daemon", "exec", "gpu", "true"}, []string{"daemon", "exec"}},
		{[]string{"--server", "http://x", "-n", "ns", "daemon", "exec", "gpu"}, []string{"daemon", "exec"}},
		{[]string{"--server=http://x", "--ca-file=ca.pem", "daemons", "exec"}, []string{"daemons", "exec"}},
		{[]string{"exec", "--queue", "q", "true"}, []string{"exec"}},
		{[]string{"daemon", "--id", "exec"}, []string{"daemon"}},
		{[]string{"--wait", "3", "daemon", "exec"}, nil},
		{[]string{"exec", "--help"}, nil},
		{[]string{"-h", "daemon", "exec"}, nil},
		{[]string{"--", "daemon", "exec"}, nil},
		{[]string{"--server"}, nil},
		{nil, nil},
	} {
		if got := leadingVerbs(tc.args, 2); !slices.Equal(got, tc.want) {
			t.Errorf("leadingVerbs(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}

// Every root flag that takes a value is skipped with its value, so a
// value is never taken for a verb.
func TestRootTakesValueKnowsEveryRootValueFlag(t *testing.T) {
	a := &app{env: Env{Getenv: func(string) string { return "" }}}
	a.rootGroup().PersistentFlags().VisitAll(func(f *pflag.Flag) {
		if f.Value.Type() == "bool" {
			return
		}
		if !rootTakesValue("--" + f.Name) {
			t.Errorf("--%s takes a value but rootTakesValue does not know it", f.Name)
		}
		if f.Shorthand != "" && !rootTakesValue("-"+f.Shorthand) {
			t.Errorf("-%s takes a value but rootTakesValue does not know it", f.Shorthand)
		}
	})
}

// The exec verbs built alone are the ones of the whole tree: same command
// path, usage, help and flags; any other run gets the whole tree.
func TestExecTreeIsTheWholeTreesExec(t *testing.T) {
	newApp := func() *app { return &app{env: Env{Getenv: func(string) string { return "" }}} }
	for _, args := range [][]string{
		{"daemon", "exec", "gpu", "true"},
		{"daemons", "exec", "--timeout", "3", "gpu", "true"},
		{"--namespace", "ns", "exec", "--queue", "q", "true"},
	} {
		part := newApp().execTree(args)
		if part == nil {
			t.Fatalf("%q: no exec tree", args)
		}
		got, _, err := part.Find(args)
		if err != nil {
			t.Fatalf("%q in the exec tree: %v", args, err)
		}
		want, _, err := newApp().rootCmd().Find(args)
		if err != nil {
			t.Fatalf("%q in the whole tree: %v", args, err)
		}
		if got.CommandPath() != want.CommandPath() || got.UsageString() != want.UsageString() ||
			got.Long != want.Long || got.Example != want.Example || got.Annotations[annExec] != want.Annotations[annExec] {
			t.Errorf("%q: the exec tree's %s differs from the whole tree's %s", args, got.CommandPath(), want.CommandPath())
		}
	}
	for _, args := range [][]string{
		{"daemon", "list"},
		{"daemon", "exce", "gpu"},
		{"help", "daemon", "exec"},
		{"__complete", "daemon", "exec", ""},
		{"daemon"},
		{"version"},
	} {
		if part := newApp().execTree(args); part != nil {
			t.Errorf("%q got the exec tree", args)
		}
	}
}
