package protocol_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/procgroup"
	"nymph/runners/protocol"
)

func prepared(t *testing.T) protocol.Files {
	t.Helper()
	f, err := protocol.Prepare(runners.Spec{ScratchDir: t.TempDir(), Args: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestPrepareWritesArgsAndClearsStaleFiles(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{protocol.ResultFile, protocol.ErrorFile} {
		if err := os.WriteFile(dir+"/"+n, []byte("stale"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f, err := protocol.Prepare(runners.Spec{ScratchDir: dir, Args: []byte("args")})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(f.Args); string(b) != "args" {
		t.Fatalf("args file %q", b)
	}
	for _, p := range []string{f.Result, f.Error} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s not cleared: %v", p, err)
		}
	}
	if _, err := protocol.Prepare(runners.Spec{}); err == nil {
		t.Fatal("want an error without a scratch dir")
	}
}

func TestCollectSucceededWithoutResultFileIsEmpty(t *testing.T) {
	out := protocol.Collect(prepared(t), procgroup.Result{}, 0)
	if out.State != messages.StateSucceeded || out.Result == nil || len(out.Result) != 0 {
		t.Fatalf("outcome %+v", out)
	}
}

func TestCollectFailedFallsBackToNonZeroExit(t *testing.T) {
	f := prepared(t)
	if err := os.WriteFile(f.Error, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := protocol.Collect(f, procgroup.Result{ExitCode: 2, StderrTail: []byte("a\nb\n\n")}, 0)
	if out.State != messages.StateFailed || out.Error.Type != runners.ErrorTypeExit || out.Error.Message != "exit status 2: a\nb" {
		t.Fatalf("outcome %+v error %+v", out, out.Error)
	}
}

func TestCollectErrorFileWithoutTypeGetsOne(t *testing.T) {
	f := prepared(t)
	if err := os.WriteFile(f.Error, []byte(`{"message":"m","traceback":""}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := protocol.Collect(f, procgroup.Result{ExitCode: 1}, 0)
	if out.Error.Type != runners.ErrorTypeExit || out.Error.Message != "m" || out.Error.Traceback != nil {
		t.Fatalf("error %+v", out.Error)
	}
}

func TestCollectKilled(t *testing.T) {
	f := prepared(t)
	out := protocol.Collect(f, procgroup.Result{Stopped: procgroup.Timeout, ExitCode: -1}, 1500*time.Millisecond)
	if out.State != messages.StateKilled || out.Error.Type != runners.ErrorTypeTimeout || out.Error.Message != "timed out after 1.5s" {
		t.Fatalf("outcome %+v error %+v", out, out.Error)
	}
	out = protocol.Collect(f, procgroup.Result{Stopped: procgroup.Cancelled, Cause: context.Canceled}, 0)
	if out.Error.Type != runners.ErrorTypeCancelled || out.Error.Message != "cancelled" {
		t.Fatalf("error %+v", out.Error)
	}
	out = protocol.Collect(f, procgroup.Result{Stopped: procgroup.Cancelled, Cause: errors.New("daemon shutdown grace expired")}, 0)
	if out.Error.Message != "daemon shutdown grace expired" {
		t.Fatalf("error %+v", out.Error)
	}
}

func TestHostEnvPrecedence(t *testing.T) {
	t.Setenv("NYMPH_PROTOCOL_TEST", "daemon")
	spec := runners.Spec{
		InvocationID: "inv",
		Env:          map[string]string{"NYMPH_PROTOCOL_TEST": "spec", runners.EnvInvocationID: "forged"},
	}
	env := protocol.HostEnv(spec, protocol.FilesIn("/s"), map[string]string{"EXTRA": "x"})
	for _, want := range []string{"NYMPH_PROTOCOL_TEST=spec", "NYMPH_INVOCATION_ID=inv", "EXTRA=x", "NYMPH_ARGS_PATH=/s/args"} {
		if !slices.Contains(env, want) {
			t.Fatalf("env lacks %s", want)
		}
	}
}

func TestCheckEnvNamesTheField(t *testing.T) {
	for _, env := range []map[string]string{{"": "x"}, {"A=B": "x"}, {"A": "x\x00y"}} {
		if err := protocol.CheckEnv(env); err == nil || !strings.Contains(err.Error(), "run_config.env") {
			t.Fatalf("%q: %v", env, err)
		}
	}
	if err := protocol.CheckEnv(map[string]string{"A": "multi\nline"}); err != nil {
		t.Fatal(err)
	}
}

func TestExecReportsSpecErrorsAsFailedOutcomes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("as_user is only checked by a root daemon")
	}
	h := protocol.NewHost("test", zerolog.Nop())
	spec := runners.Spec{InvocationID: "inv", ScratchDir: t.TempDir(), Script: "true", AsUser: "nymph-no-such-user"}
	out, err := h.Exec(context.Background(), spec, protocol.Job{
		Build: func(f protocol.Files, _ string) (protocol.Launch, error) {
			argv, err := h.Command(spec, f)
			return protocol.Launch{Command: procgroup.Command{Argv: argv}}, err
		},
	})
	if err != nil || out.State != messages.StateFailed || out.Error.Type != messages.ErrorTypeDaemon ||
		!strings.HasPrefix(out.Error.Message, "as_user: ") {
		t.Fatalf("outcome %+v error %+v, %v", out, out.Error, err)
	}
	spec.AsUser = ""
	if _, err := h.Exec(context.Background(), spec, protocol.Job{Bin: "/nonexistent/nymph-cli"}); err == nil ||
		!strings.HasPrefix(err.Error(), "test runner: ") {
		t.Fatalf("missing Bin: %v, want a runner error", err)
	}
}
