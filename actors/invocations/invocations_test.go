package invocations

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"nymph/actors/jobparent"
	"nymph/actors/ledger"
	"nymph/daemon/uplink"
	"nymph/messages"
	"nymph/runners"
	"nymph/runners/echo"
	"nymph/test/fakecp"
)

// recorder is a runner that remembers the specs it was asked to run.
type recorder struct {
	kind  string
	mu    sync.Mutex
	specs []runners.Spec
}

func (r *recorder) Kind() string { return r.kind }

func (r *recorder) Run(_ context.Context, spec runners.Spec) (runners.Outcome, error) {
	r.mu.Lock()
	r.specs = append(r.specs, spec)
	r.mu.Unlock()
	return runners.Outcome{State: messages.StateSucceeded, Result: append([]byte(r.kind+":"), spec.Args...)}, nil
}

func (r *recorder) calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.specs)
}

type fixture struct {
	cp    *fakecp.CP
	d     *Deps
	proc  *recorder
	other *recorder
}

func newFixture(t *testing.T) *fixture {
	cp := fakecp.New(t)
	client, err := uplink.New(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{cp: cp, proc: &recorder{kind: "process"}, other: &recorder{kind: "python"}}
	f.d = &Deps{
		Wiring:        jobparent.Wiring{Ledger: ledger.New(nil), Log: zerolog.New(zerolog.NewTestWriter(t)), Jobs: &sync.WaitGroup{}},
		Runners:       map[string]runners.Runner{"process": f.proc, "python": f.other, "echo": echo.New()},
		DefaultRunner: "process",
		Workdir:       t.TempDir(),
		Payloads:      client,
		Namespace:     "default",
	}
	return f
}

func ref(key string, data []byte, sum string) *messages.PayloadRef {
	if sum == "" {
		s := sha256.Sum256(data)
		sum = hex.EncodeToString(s[:])
	}
	return &messages.PayloadRef{Bucket: "b", Key: key, Size: uint64(len(data)), SHA256: &sum}
}

func TestRunnerChoice(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	run := func(runner *string) *messages.Ack {
		return f.d.execute(ctx, &messages.Run{InvocationID: "i1", RunConfig: messages.RunConfig{Runner: runner},
			ArgsBlob: messages.Bytes("a")}, &ledger.Tail{})
	}
	if a := run(nil); a.State != messages.StateSucceeded || string(a.ResultBlob) != "process:a" {
		t.Fatalf("absent runner: %+v", a)
	}
	py := "python"
	if a := run(&py); a.State != messages.StateSucceeded || string(a.ResultBlob) != "python:a" {
		t.Fatalf("python: %+v", a)
	}
	bad := "teleport"
	a := run(&bad)
	if a.State != messages.StateFailed || a.Error == nil || a.Error.Type != messages.ErrorTypeDaemon ||
		a.Error.Message != "unknown runner kind: teleport" || len(a.ResultBlob) != 0 {
		t.Fatalf("unknown kind: %+v %+v", a, a.Error)
	}
	if f.proc.calls() != 1 || f.other.calls() != 1 {
		t.Fatalf("calls: process %d, python %d", f.proc.calls(), f.other.calls())
	}
}

func TestPayloadRefResolvedBeforeTheRunner(t *testing.T) {
	f := newFixture(t)
	data := []byte(strings.Repeat("large args ", 40000))
	f.cp.PutBlob("k1", data)
	a := f.d.execute(context.Background(), &messages.Run{InvocationID: "i2", PayloadRef: ref("k1", data, "")}, &ledger.Tail{})
	if a.State != messages.StateSucceeded || string(a.ResultBlob) != "process:"+string(data) {
		t.Fatalf("ack %s %+v", a.State, a.Error)
	}
	if len(f.proc.specs) != 1 || string(f.proc.specs[0].Args) != string(data) {
		t.Fatal("runner did not get the payload bytes")
	}
}

func TestPayloadProblemsFailWithoutSpawning(t *testing.T) {
	f := newFixture(t)
	data := []byte("the real bytes")
	f.cp.PutBlob("k2", data)
	for _, c := range []struct {
		name string
		ref  *messages.PayloadRef
		want string
	}{
		{"sha256", ref("k2", data, strings.Repeat("0", 64)), "payload sha256 mismatch: want " + strings.Repeat("0", 64)},
		{"size", &messages.PayloadRef{Key: "k2", Size: 3}, "payload size mismatch"},
		{"missing", ref("nosuch", data, ""), "payload presign"},
		{"no key", &messages.PayloadRef{}, "payload_ref.key: missing"},
		{"oversize", &messages.PayloadRef{Key: "k2", Size: messages.MaxPayload + 1}, "over the"},
	} {
		a := f.d.execute(context.Background(), &messages.Run{InvocationID: "i-" + c.name, PayloadRef: c.ref}, &ledger.Tail{})
		if a.State != messages.StateFailed || a.Error == nil || a.Error.Type != messages.ErrorTypeDaemon ||
			!strings.Contains(a.Error.Message, c.want) {
			t.Errorf("%s: %s %+v, want failed with %q", c.name, a.State, a.Error, c.want)
		}
	}
	if n := f.proc.calls(); n != 0 {
		t.Fatalf("the runner was called %d times for bad payloads", n)
	}
}

func TestCancelledWhileFetchingIsKilled(t *testing.T) {
	f := newFixture(t)
	f.cp.PutBlob("k3", []byte("x"))
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errShutdown{})
	a := f.d.execute(ctx, &messages.Run{InvocationID: "i3", PayloadRef: ref("k3", []byte("x"), "")}, &ledger.Tail{})
	if a.State != messages.StateKilled || a.Error == nil || a.Error.Type != messages.ErrorTypeCancelled ||
		a.Error.Message != messages.CancelledShutdownMessage {
		t.Fatalf("ack %s %+v", a.State, a.Error)
	}
	if f.proc.calls() != 0 {
		t.Fatal("runner called after cancellation")
	}
}

type errShutdown struct{}

func (errShutdown) Error() string { return messages.CancelledShutdownMessage }
