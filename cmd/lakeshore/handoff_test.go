package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	built     string
	buildErr  error
	buildOut  []byte
)

// cliBinary builds this command once per test process.
func cliBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lakeshore-cli-")
		if err != nil {
			buildErr = err
			return
		}
		built = filepath.Join(dir, "lakeshore")
		cmd := exec.Command("go", "build", "-o", built, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build: %v\n%s", buildErr, buildOut)
	}
	return built
}

// fakeServer writes an executable standing in for lakeshore-server that
// records its argv (one per line) and its stdin in out, then exits 7.
func fakeServer(t *testing.T, path, out string) {
	t.Helper()
	script := "#!/bin/sh\nfor a in \"$0\" \"$@\"; do printf '%s\\n' \"$a\"; done > " + out + "\ncat >> " + out + "\necho from-server\nexit 7\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

type run struct {
	stdout, stderr string
	code           int
}

func runIn(t *testing.T, bin string, env []string, stdin string, args ...string) run {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()}, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return run{out.String(), errb.String(), code}
}

// lakeshore serve (and blobs) become lakeshore-server running the same
// command line, in the same process: its argv, streams and exit code.
func TestServeIsHandedToLakeshoreServer(t *testing.T) {
	bin := cliBinary(t)
	dir := t.TempDir()
	server, out := filepath.Join(dir, "my-server"), filepath.Join(dir, "argv")
	fakeServer(t, server, out)
	env := []string{"LAKESHORE_SERVER_BINARY=" + server}
	for _, args := range [][]string{
		{"--admin-token", "tok", "serve", "--addr", "127.0.0.1:0", "--data", "d"},
		{"serve", "--help"},
		{"blobs", "migrate", "--to", "s3://b/p"},
		{"__complete", "serve", "--blo"},
	} {
		r := runIn(t, bin, env, "the-stdin\n", args...)
		if r.code != 7 || r.stdout != "from-server\n" {
			t.Errorf("lakeshore %v: exit %d, stdout %q, stderr %q; want lakeshore-server's exit 7 and output", args, r.code, r.stdout, r.stderr)
			continue
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		want := server + "\n" + strings.Join(args, "\n") + "\nthe-stdin\n"
		if string(got) != want {
			t.Errorf("lakeshore %v: lakeshore-server got\n%s\nwant\n%s", args, got, want)
		}
	}
	// The operator's verbs stay here.
	if r := runIn(t, bin, env, "", "version"); r.code != 0 || !strings.HasPrefix(r.stdout, "lakeshore ") {
		t.Errorf("lakeshore version: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runIn(t, bin, env, "", "--help"); r.code != 0 || !strings.Contains(r.stdout, "serve") {
		t.Errorf("lakeshore --help lists no serve: %q", r.stdout)
	}
}

// Beside lakeshore, then on $PATH.
func TestLakeshoreServerIsFoundBesideThenOnPath(t *testing.T) {
	bin := cliBinary(t)
	beside := t.TempDir()
	self := filepath.Join(beside, "lakeshore")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(self, data, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "argv")
	fakeServer(t, filepath.Join(beside, "lakeshore-server"), out)
	if r := runIn(t, self, nil, "", "serve"); r.code != 7 {
		t.Errorf("lakeshore-server beside lakeshore not used: exit %d, stderr %q", r.code, r.stderr)
	}

	onPath := t.TempDir()
	fakeServer(t, filepath.Join(onPath, "lakeshore-server"), out)
	r := runIn(t, bin, []string{"PATH=" + onPath + ":/usr/bin:/bin"}, "", "serve")
	if r.code != 7 {
		t.Errorf("lakeshore-server on $PATH not used: exit %d, stderr %q", r.code, r.stderr)
	}
}

// Without lakeshore-server the verb fails at once, naming what to install
// or set.
func TestServeWithoutLakeshoreServerSaysWhatToDo(t *testing.T) {
	bin := cliBinary(t)
	r := runIn(t, bin, nil, "", "serve", "--data", "d")
	if r.code != 1 || !strings.Contains(r.stderr, "lakeshore-server, which is neither beside this lakeshore nor on $PATH") ||
		!strings.Contains(r.stderr, "LAKESHORE_SERVER_BINARY") {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
	for _, c := range []struct{ path, why string }{
		{filepath.Join(t.TempDir(), "nope"), "no such file"},
		{t.TempDir(), "is a directory"},
	} {
		r := runIn(t, bin, []string{"LAKESHORE_SERVER_BINARY=" + c.path}, "", "serve")
		if r.code != 1 || !strings.Contains(r.stderr, "$LAKESHORE_SERVER_BINARY="+c.path+": "+c.why) {
			t.Errorf("LAKESHORE_SERVER_BINARY=%s: exit %d, stderr %q", c.path, r.code, r.stderr)
		}
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built != "" {
		_ = os.RemoveAll(filepath.Dir(built))
	}
	os.Exit(code)
}
