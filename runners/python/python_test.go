package python_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/python"
	"nymph/runners/runnertest"
)

// interpreter prefers the system python3: version-manager shims in PATH
// add seconds of startup under load.
func interpreter() string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	p, _ := exec.LookPath("python3")
	return p
}

func requirePython(t *testing.T) {
	t.Helper()
	if interpreter() == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("python3 not found")
		}
		t.Skip("python3 not found")
	}
}

func newRunner(t *testing.T) runners.Runner {
	return python.New(zerolog.New(zerolog.NewTestWriter(t)),
		python.WithPython(interpreter()), python.WithKillGrace(500*time.Millisecond))
}

func TestConformance(t *testing.T) {
	requirePython(t)
	runnertest.Run(t, newRunner, runnertest.Caps{Python: true, Script: true, HostPIDs: true})
}

// The shim's codec must agree with the Go side on every type it claims.
func TestCodecRoundTrip(t *testing.T) {
	requirePython(t)
	dir := t.TempDir()
	mod := "def same(v):\n    return v\n"
	if err := os.WriteFile(filepath.Join(dir, "roundtrip.py"), []byte(mod), 0o644); err != nil {
		t.Fatal(err)
	}
	values := []any{
		nil, true, false, 0, 1, 127, 128, 255, 256, 65535, 65536, int64(1) << 40, uint64(1) << 63,
		-1, -32, -33, -128, -129, -32768, -32769, int64(-1) << 40, int64(-1) << 63,
		1.5, -0.25, "", "short", strings.Repeat("x", 31), strings.Repeat("y", 32), strings.Repeat("z", 300),
		strings.Repeat("w", 70000), "ünïcødé", []byte{}, []byte{0, 1, 2}, make([]byte, 300), make([]byte, 70000),
		[]any{}, []any{1, "a", nil}, make([]any, 20), make([]any, 70000),
		map[string]any{}, map[string]any{"a": 1, "b": []any{true}},
	}
	big := map[string]any{}
	for i := range 20 {
		big[strings.Repeat("k", i+1)] = i
	}
	values = append(values, big)
	// One run carries every value: one positional argument, the list.
	args, err := msgpack.Marshal([]any{values})
	if err != nil {
		t.Fatal(err)
	}
	spec := runners.Spec{
		InvocationID: "rt",
		Function:     messages.FunctionRef{Module: "roundtrip", Qualname: "same"},
		Args:         args,
		Workdir:      dir,
		ScratchDir:   t.TempDir(),
	}
	out := runnertest.Outcome(t, newRunner(t), spec)
	if out.State != messages.StateSucceeded {
		t.Fatalf("outcome %+v error %+v", out, out.Error)
	}
	var got []any
	if err := msgpack.Unmarshal(out.Result, &got); err != nil {
		t.Fatalf("result not msgpack: %v", err)
	}
	if len(got) != len(values) {
		t.Fatalf("got %d values, want %d", len(got), len(values))
	}
	for i, v := range values {
		// Integer widths may differ between encoders; compare printed values.
		wantB, _ := msgpack.Marshal(v)
		var want any
		_ = msgpack.Unmarshal(wantB, &want)
		if fmt.Sprint(got[i]) != fmt.Sprint(want) {
			t.Fatalf("value %d (%T) did not round-trip: got %v", i, v, got[i])
		}
	}
}

func TestBadFunctionRefs(t *testing.T) {
	requirePython(t)
	r := newRunner(t)
	cases := []struct {
		fn       messages.FunctionRef
		wantType string
		wantMsg  string
	}{
		{messages.FunctionRef{}, messages.ErrorTypeDaemon, "function.module"},
		{messages.FunctionRef{Module: "json"}, messages.ErrorTypeDaemon, "function.qualname"},
		{messages.FunctionRef{Module: "no_such_module_nymph", Qualname: "f"}, "ModuleNotFoundError", "no_such_module_nymph"},
		{messages.FunctionRef{Module: "json", Qualname: "nope"}, "AttributeError", "nope"},
	}
	for _, c := range cases {
		out := runnertest.Outcome(t, r, runners.Spec{InvocationID: "bad", Function: c.fn, ScratchDir: t.TempDir()})
		if out.State != messages.StateFailed || out.Error == nil || out.Error.Type != c.wantType ||
			!strings.Contains(out.Error.Message, c.wantMsg) {
			t.Fatalf("%+v: outcome %+v error %+v", c.fn, out, out.Error)
		}
	}
}

func TestUnencodableResult(t *testing.T) {
	requirePython(t)
	spec := runners.Spec{
		InvocationID: "obj",
		Function:     messages.FunctionRef{Module: "builtins", Qualname: "object"},
		ScratchDir:   t.TempDir(),
	}
	out := runnertest.Outcome(t, newRunner(t), spec)
	if out.State != messages.StateFailed || out.Error == nil || out.Error.Type != "TypeError" {
		t.Fatalf("outcome %+v error %+v", out, out.Error)
	}
}
