package cli_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// camelKey is the operator JSON's key convention.
var camelKey = regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)

// badKeys walks a JSON document and returns the object keys, by path, that
// are not camelCase.
func badKeys(path string, v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if !camelKey.MatchString(k) {
				out = append(out, path+"."+k)
			}
			out = append(out, badKeys(path+"."+k, e)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, badKeys(path+"[]", e)...)
		}
	}
	return out
}

// Every key of what the daemon verbs print with --json is camelCase,
// capabilities included (they were Runners, MaxInvocations, Workdir).
func TestDaemonJSONKeysAreCamelCase(t *testing.T) {
	cp := newRealCP(t)
	cp.hello("gpu-rig", "x86_64")
	for _, args := range [][]string{
		{"daemon", "list", "--json"},
		{"daemon", "show", "gpu-rig", "--json"},
		{"daemon", "hibernate", "gpu-rig", "--until", "+1h", "--json"},
		{"daemon", "wake", "gpu-rig", "--json"},
		{"daemon", "commands", "gpu-rig", "--json"},
		{"daemon", "reset", "gpu-rig", "--json"},
		{"daemon", "target-version", "--json"},
		{"token", "create", "--json"},
		{"token", "list", "--json"},
		{"queue", "list", "--json"},
		{"release", "list", "--json"},
	} {
		r := cp.run(runOpts{}, args...)
		var v any
		if err := json.Unmarshal([]byte(r.stdout), &v); r.code != 0 || err != nil {
			t.Fatalf("%v: %v %+v", args, err, r)
		}
		if bad := badKeys("", v); len(bad) > 0 {
			t.Errorf("%s: keys not camelCase: %v", strings.Join(args, " "), bad)
		}
	}
	r := cp.run(runOpts{}, "daemon", "show", "gpu-rig", "--json")
	if !strings.Contains(r.stdout, `"maxInvocations"`) {
		t.Fatalf("capabilities: %s", r.stdout)
	}
	// The CLI reads them back: runners show in the table.
	if r := cp.run(runOpts{}, "daemon", "show", "gpu-rig"); !strings.Contains(r.stdout, "runners=process") {
		t.Fatalf("daemon show: %+v", r)
	}
}
