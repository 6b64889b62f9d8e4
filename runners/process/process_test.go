package process_test

import (
	"context"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/process"
	"nymph/runners/runnertest"
)

func newRunner(t *testing.T) runners.Runner {
	return process.New(zerolog.New(zerolog.NewTestWriter(t)), process.WithKillGrace(500*time.Millisecond))
}

func TestConformance(t *testing.T) {
	runnertest.Run(t, newRunner, runnertest.Caps{Script: true, HostPIDs: true})
}

func baseSpec(t *testing.T) runners.Spec {
	return runners.Spec{InvocationID: "inv-1", ScratchDir: t.TempDir()}
}

func TestFunctionIsExecutableWithQualnameAsArgument(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "fn.sh")
	script := "#!/bin/sh\nprintf 'arg=%s' \"$1\" > \"$NYMPH_RESULT_PATH\"\n"
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := baseSpec(t)
	spec.Function = messages.FunctionRef{Module: exe, Qualname: "first"}
	out := runnertest.Outcome(t, newRunner(t), spec)
	if out.State != messages.StateSucceeded || string(out.Result) != "arg=first" {
		t.Fatalf("outcome = %+v", out)
	}
}

func TestMissingModuleIsFailedOutcome(t *testing.T) {
	out := runnertest.Outcome(t, newRunner(t), baseSpec(t))
	if out.State != messages.StateFailed || out.Error == nil || !strings.Contains(out.Error.Message, "function.module") {
		t.Fatalf("outcome = %+v", out)
	}
}

func TestMissingExecutableIsError(t *testing.T) {
	spec := baseSpec(t)
	spec.Function = messages.FunctionRef{Module: "/nonexistent/nymph-fn"}
	if _, err := newRunner(t).Run(context.Background(), spec); err == nil {
		t.Fatal("want an error for a missing executable")
	}
}

func TestInvalidEnvNamesTheField(t *testing.T) {
	spec := baseSpec(t)
	spec.Script = "true"
	spec.Env = map[string]string{"A=B": "x"}
	out := runnertest.Outcome(t, newRunner(t), spec)
	if out.State != messages.StateFailed || !strings.Contains(out.Error.Message, "run_config.env") {
		t.Fatalf("outcome = %+v", out)
	}
}

func TestOrphansDieWhenLeaderExits(t *testing.T) {
	marker := "nymph-orphan-" + strings.ReplaceAll(t.Name(), "/", "-")
	spec := baseSpec(t)
	spec.Script = "sh -c 'sleep 1000; :' " + marker + " &\nexit 0\n"
	out := runnertest.Outcome(t, newRunner(t), spec)
	if out.State != messages.StateSucceeded {
		t.Fatalf("outcome = %+v", out)
	}
	runnertest.NoneNaming(t, marker, "orphan survived")
}

func TestKillGraceEscalatesToSigkill(t *testing.T) {
	spec := baseSpec(t)
	spec.Script = "trap '' TERM\necho armed\nwhile :; do sleep 0.05; done\n"
	spec.Timeout = 300 * time.Millisecond
	r := process.New(zerolog.Nop(), process.WithKillGrace(200*time.Millisecond))
	start := time.Now()
	out := runnertest.Outcome(t, r, spec)
	if out.State != messages.StateKilled || out.Error.Type != runners.ErrorTypeTimeout {
		t.Fatalf("outcome = %+v", out)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("took %s; SIGKILL should follow the 200ms grace", el)
	}
}

func TestAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("as_user needs root")
		}
		t.Skip("as_user needs root")
	}
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skip("no user nobody")
	}
	spec := baseSpec(t)
	// The user must be able to reach the scratch dir through its parents.
	if err := os.Chmod(filepath.Dir(spec.ScratchDir), 0o755); err != nil {
		t.Fatal(err)
	}
	spec.AsUser = "nobody"
	spec.Args = []byte("x")
	spec.Script = "{ id -un; cat \"$NYMPH_ARGS_PATH\"; } > \"$NYMPH_RESULT_PATH\"\n"
	out := runnertest.Outcome(t, newRunner(t), spec)
	if out.State != messages.StateSucceeded || string(out.Result) != "nobody\nx" {
		t.Fatalf("outcome = %+v (error %+v)", out, out.Error)
	}
}
