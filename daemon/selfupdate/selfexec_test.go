package selfupdate

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"nymph/test/realparts"
)

// buildSelfUpdate compiles testdata/selfupdate stamped with version (and any
// extra -X flags) into dir/name.
func buildSelfUpdate(t *testing.T, dir, name, ldflags string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, statErr := os.Stat(goBin); statErr != nil {
			realparts.Unavailable(t, "go toolchain not found to build the self-update program: %v", err)
		}
	}
	out := filepath.Join(dir, name)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", out, "-ldflags", ldflags, "./testdata/selfupdate")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build selfupdate (%s): %v\n%s", ldflags, err, b)
	}
	return out
}

// serveFile serves path's bytes and returns the URL and their sha256.
func serveFile(t *testing.T, path string) (string, string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/nymph", sum(b)
}

func runSelfUpdate(t *testing.T, exe, url, sha string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "alpha", "beta")
	cmd.Env = append(os.Environ(), "OTA_TEST_MARK=kept", "OTA_TARGET_VERSION=v2", "OTA_URL="+url, "OTA_SHA256="+sha)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", exe, err, stdout.String(), stderr.String())
	}
	return stdout.String(), cmd.Process.Pid
}

// TestSelfExec runs a real program that updates itself to a second build.
// With the self-exec on, the same PID must print the new version with the
// original arguments and environment. Built with -X nymph/daemon/selfupdate.selfExec=false
// it installs the new build but keeps running, and the next start is v2.
func TestSelfExec(t *testing.T) {
	build := t.TempDir()
	v2 := buildSelfUpdate(t, build, "v2", "-X main.version=v2")
	url, sha := serveFile(t, v2)

	t.Run("exec", func(t *testing.T) {
		installDir := t.TempDir()
		exe := buildSelfUpdate(t, installDir, "nymph", "-X main.version=v1")
		out, pid := runSelfUpdate(t, exe, url, sha)

		want := fmt.Sprintf("pid=%d version=v1 args=alpha,beta mark=kept\npid=%d version=v2 args=alpha,beta mark=kept\n", pid, pid)
		if out != want {
			t.Fatalf("output:\n%s\nwant:\n%s", out, want)
		}
		installed, _ := os.ReadFile(exe)
		if sum(installed) != sha {
			t.Fatal("the installed file is not the v2 build")
		}
		assertNoTemp(t, installDir)
	})

	t.Run("disabled at link time", func(t *testing.T) {
		installDir := t.TempDir()
		exe := buildSelfUpdate(t, installDir, "nymph", "-X main.version=v1 -X nymph/daemon/selfupdate.selfExec=false")
		out, pid := runSelfUpdate(t, exe, url, sha)
		want := fmt.Sprintf("pid=%d version=v1 args=alpha,beta mark=kept\ninstalled; self-exec disabled\n", pid)
		if out != want {
			t.Fatalf("output:\n%s\nwant:\n%s", out, want)
		}
		out, pid = runSelfUpdate(t, exe, url, sha)
		if want := fmt.Sprintf("pid=%d version=v2 ", pid); !strings.HasPrefix(out, want) {
			t.Fatalf("next start printed %q, want the v2 build", out)
		}
	})
}
