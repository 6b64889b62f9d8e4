package selfupdate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/messages"
	"nymph/test/fakeelf"
	"nymph/test/realparts"
)

func testLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t))
}

// fakeELF returns size bytes that pass checkExecutable: a 64-bit ELF header
// for this machine followed by random bytes.
func fakeELF(t *testing.T, size int) []byte {
	t.Helper()
	machine, ok := elfMachines[runtime.GOARCH]
	if !ok || runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" && runtime.GOARCH != "riscv64" && runtime.GOARCH != "loong64") {
		t.Skipf("fake ELF header only built for little-endian 64-bit linux, not %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	return fakeelf.New(t, machine, size)
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// binServer serves payload at /bin and a few broken variants, and counts
// requests so a refused command can be shown to fetch nothing.
type binServer struct {
	*httptest.Server
	payload  []byte
	requests atomic.Int64
	auth     atomic.Value // last Authorization header seen
}

func newBinServer(t *testing.T, payload []byte) *binServer {
	t.Helper()
	s := &binServer{payload: payload}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /bin", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(payload)))
		_, _ = w.Write(payload)
	})
	mux.HandleFunc("GET /missing", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such release", http.StatusNotFound)
	})
	// truncated promises the whole payload, sends half, and cuts the
	// connection, as a dying proxy would.
	mux.HandleFunc("GET /truncated", func(w http.ResponseWriter, r *http.Request) {
		conn, bw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", len(payload))
		_, _ = bw.Write(payload[:len(payload)/2])
		_ = bw.Flush()
	})
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		s.auth.Store(r.Header.Get("Authorization"))
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// installedExe writes old as dir/nymph with mode 0750 and returns its path.
func installedExe(t *testing.T, dir string, old []byte) string {
	t.Helper()
	exe := filepath.Join(dir, "nymph")
	if err := os.WriteFile(exe, old, 0o750); err != nil {
		t.Fatal(err)
	}
	return exe
}

func assertUntouched(t *testing.T, exe string, old []byte) {
	t.Helper()
	got, err := os.ReadFile(exe)
	if err != nil {
		t.Fatalf("read executable: %v", err)
	}
	if !bytes.Equal(got, old) {
		t.Fatalf("executable changed: %d bytes, sha256 %s; want the original %s", len(got), sum(got), sum(old))
	}
	st, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o750 {
		t.Fatalf("executable mode changed to %v", st.Mode())
	}
	assertNoTemp(t, filepath.Dir(exe))
}

func assertNoTemp(t *testing.T, dir string) {
	t.Helper()
	left, err := filepath.Glob(filepath.Join(dir, ".nymph-ota-*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Fatalf("temporary files left behind: %v", left)
	}
}

func TestInstallReplacesBinary(t *testing.T) {
	newBin := fakeELF(t, 3<<20)
	srv := newBinServer(t, newBin)
	dir := t.TempDir()
	exe := installedExe(t, dir, []byte("old binary"))
	u := New(testLogger(t), Options{ExePath: exe})

	inst, err := u.Install(context.Background(), messages.OtaUpdate{Version: "0.2.0", URL: srv.URL + "/bin", SHA256: strings.ToUpper(sum(newBin))})
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	got, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, newBin) {
		t.Fatalf("executable not replaced: sha256 %s", sum(got))
	}
	st, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o751 {
		t.Fatalf("mode %v, want 0751 (0750 | 0111)", st.Mode().Perm())
	}
	assertNoTemp(t, dir)
	want := Installed{Version: "0.2.0", Path: exe, SHA256: sum(newBin), Size: int64(len(newBin)), Mode: 0o751}
	inst.Elapsed = 0
	if inst != want {
		t.Fatalf("Installed = %+v, want %+v", inst, want)
	}
}

func TestInstallRefusals(t *testing.T) {
	newBin := fakeELF(t, 1<<20)
	notELF := []byte("#!/bin/sh\necho not a binary for this machine\n")
	srv := newBinServer(t, newBin)
	notELFSrv := newBinServer(t, notELF)
	good := sum(newBin)
	wrong := sum([]byte("something else"))

	cases := []struct {
		name      string
		cmd       messages.OtaUpdate
		maxSize   int64
		want      error  // errors.Is target, when there is one
		wantText  string // a substring the operator reads in the log
		noRequest bool
	}{
		{name: "wrong checksum", cmd: messages.OtaUpdate{URL: srv.URL + "/bin", SHA256: wrong}, want: ErrChecksumMismatch, wantText: "sha256 mismatch"},
		{name: "truncated download", cmd: messages.OtaUpdate{URL: srv.URL + "/truncated", SHA256: good}, wantText: "interrupted after"},
		{name: "404", cmd: messages.OtaUpdate{URL: srv.URL + "/missing", SHA256: good}, wantText: "HTTP 404 Not Found: no such release"},
		{name: "non-hex checksum", cmd: messages.OtaUpdate{URL: srv.URL + "/bin", SHA256: strings.Repeat("g", 64)}, want: ErrInvalidCommand, wantText: "field sha256", noRequest: true},
		{name: "short checksum", cmd: messages.OtaUpdate{URL: srv.URL + "/bin", SHA256: good[:63]}, want: ErrInvalidCommand, wantText: "64 ASCII hex", noRequest: true},
		{name: "checksum with trailing newline", cmd: messages.OtaUpdate{URL: srv.URL + "/bin", SHA256: good + "\n"}, want: ErrInvalidCommand, noRequest: true},
		{name: "non-ascii checksum", cmd: messages.OtaUpdate{URL: srv.URL + "/bin", SHA256: good[:62] + "é"}, want: ErrInvalidCommand, noRequest: true},
		{name: "file url", cmd: messages.OtaUpdate{URL: "file:///bin/true", SHA256: good}, want: ErrInvalidCommand, wantText: "field url", noRequest: true},
		{name: "empty url", cmd: messages.OtaUpdate{SHA256: good}, want: ErrInvalidCommand, wantText: "field url", noRequest: true},
		{name: "not an executable", cmd: messages.OtaUpdate{URL: notELFSrv.URL + "/bin", SHA256: sum(notELF)}, want: ErrNotExecutable},
		{name: "too large", cmd: messages.OtaUpdate{URL: srv.URL + "/bin", SHA256: good}, maxSize: 1000, wantText: "limit"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			old := []byte("old binary " + tc.name)
			exe := installedExe(t, t.TempDir(), old)
			u := New(testLogger(t), Options{ExePath: exe, MaxSize: tc.maxSize})
			before := srv.requests.Load() + notELFSrv.requests.Load()
			_, err := u.Install(context.Background(), tc.cmd)
			if err == nil {
				t.Fatal("Install succeeded, want a refusal")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("error %q does not say %q", err, tc.wantText)
			}
			if tc.noRequest && srv.requests.Load()+notELFSrv.requests.Load() != before {
				t.Fatal("a refused command still fetched the URL")
			}
			assertUntouched(t, exe, old)
		})
	}
}

// TestInstallUnwritableDirectory makes the executable's directory refuse new
// files. chmod 0555 stops nobody when the tests run as root, so as root the
// directory is made immutable (chattr +i), which the kernel enforces even
// for root; as anyone else chmod 0555 is the real thing.
func TestInstallUnwritableDirectory(t *testing.T) {
	newBin := fakeELF(t, 64<<10)
	srv := newBinServer(t, newBin)
	dir := t.TempDir()
	old := []byte("old binary")
	exe := installedExe(t, dir, old)
	if os.Geteuid() == 0 {
		chattr, err := exec.LookPath("chattr")
		if err != nil {
			realparts.Unavailable(t, "chattr not found; it is the way to make a directory unwritable for root")
		}
		if out, err := exec.Command(chattr, "+i", dir).CombinedOutput(); err != nil {
			realparts.Unavailable(t, "chattr +i %s: %v: %s", dir, err, out)
		}
		t.Cleanup(func() {
			if out, err := exec.Command(chattr, "-i", dir).CombinedOutput(); err != nil {
				t.Errorf("chattr -i %s: %v: %s", dir, err, out)
			}
		})
	} else {
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Chmod(dir, 0o755) })
	}

	u := New(testLogger(t), Options{ExePath: exe})
	_, err := u.Install(context.Background(), messages.OtaUpdate{URL: srv.URL + "/bin", SHA256: sum(newBin)})
	if err == nil {
		t.Fatal("Install succeeded in an unwritable directory")
	}
	if !strings.Contains(err.Error(), "create temporary file in "+dir) {
		t.Fatalf("error %q does not name the directory", err)
	}
	if srv.requests.Load() != 0 {
		t.Fatal("downloaded although the directory cannot take the file")
	}
	assertUntouched(t, exe, old)
}

// The read-only-filesystem case runs in a child: the test binary re-executed
// under unshare -m, where the executable's directory is bind-mounted
// read-only in a private mount namespace (EROFS, even for root). The parent
// then checks the file from outside, where the mount never existed.
const roChildEnv = "OTA_TEST_RO_CHILD"

func TestInstallReadOnlyFilesystem(t *testing.T) {
	if os.Getenv(roChildEnv) != "" {
		roChild(t)
		return
	}
	if os.Geteuid() != 0 {
		realparts.Unavailable(t, "a private mount namespace needs root (uid %d)", os.Geteuid())
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		realparts.Unavailable(t, "unshare not found")
	}
	newBin := fakeELF(t, 64<<10)
	srv := newBinServer(t, newBin)
	dir := t.TempDir()
	old := []byte("old binary")
	exe := installedExe(t, dir, old)

	script := `set -e; mount --bind "$1" "$1"; mount -o remount,bind,ro "$1"; shift; exec "$@"`
	cmd := exec.Command(unshare, "-m", "--propagation", "private", "sh", "-c", script, "sh", dir,
		os.Args[0], "-test.run=^TestInstallReadOnlyFilesystem$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), roChildEnv+"=1", "OTA_TEST_EXE="+exe, "OTA_TEST_URL="+srv.URL+"/bin", "OTA_TEST_SHA256="+sum(newBin))
	out, err := cmd.CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("mount")) && !bytes.Contains(out, []byte("--- ")) {
			realparts.Unavailable(t, "cannot make a read-only bind mount here: %v: %s", err, out)
		}
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("read-only file system")) {
		t.Fatalf("child did not hit a read-only file system:\n%s", out)
	}
	assertUntouched(t, exe, old)
}

func roChild(t *testing.T) {
	exe := os.Getenv("OTA_TEST_EXE")
	probe := filepath.Join(filepath.Dir(exe), "probe")
	if err := os.WriteFile(probe, nil, 0o600); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("the directory is not read-only in the child: %v", err)
	}
	u := New(testLogger(t), Options{ExePath: exe})
	_, err := u.Install(context.Background(), messages.OtaUpdate{URL: os.Getenv("OTA_TEST_URL"), SHA256: os.Getenv("OTA_TEST_SHA256")})
	if !errors.Is(err, syscall.EROFS) {
		t.Fatalf("Install error %v, want EROFS", err)
	}
	t.Logf("refused: %v", err)
}

func TestInstallBearerOnlyToServerOrigin(t *testing.T) {
	newBin := fakeELF(t, 64<<10)
	home := newBinServer(t, newBin)
	elsewhere := newBinServer(t, newBin)
	cmd := messages.OtaUpdate{SHA256: sum(newBin)}

	u := New(testLogger(t), Options{ExePath: installedExe(t, t.TempDir(), []byte("old")), Bearer: "tok", ServerURL: home.URL + "/api"})
	cmd.URL = home.URL + "/bin"
	if _, err := u.Install(context.Background(), cmd); err != nil {
		t.Fatal(err)
	}
	if got := home.auth.Load(); got != "Bearer tok" {
		t.Fatalf("control plane got Authorization %q, want the bearer", got)
	}
	cmd.URL = elsewhere.URL + "/bin"
	if _, err := u.Install(context.Background(), cmd); err != nil {
		t.Fatal(err)
	}
	if got := elsewhere.auth.Load(); got != "" {
		t.Fatalf("another host got Authorization %q", got)
	}
}

func TestInstallBusy(t *testing.T) {
	newBin := fakeELF(t, 64<<10)
	started := make(chan struct{})
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		_, _ = w.Write(newBin)
	}))
	defer srv.Close()
	exe := installedExe(t, t.TempDir(), []byte("old"))
	u := New(testLogger(t), Options{ExePath: exe})
	cmd := messages.OtaUpdate{URL: srv.URL, SHA256: sum(newBin)}

	first := make(chan error, 1)
	go func() {
		_, err := u.Install(context.Background(), cmd)
		first <- err
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("first download never reached the server")
	}
	if _, err := u.Install(context.Background(), cmd); !errors.Is(err, ErrBusy) {
		t.Fatalf("overlapping Install: %v, want ErrBusy", err)
	}
	if err := u.Exec(); !errors.Is(err, ErrBusy) && !errors.Is(err, ErrSelfExecDisabled) {
		t.Fatalf("Exec during Install: %v, want ErrBusy", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first Install: %v", err)
	}
}

func TestInstallCancelled(t *testing.T) {
	started := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000000")
		_, _ = w.Write(make([]byte, 1000))
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	}))
	defer srv.Close()
	old := []byte("old binary")
	exe := installedExe(t, t.TempDir(), old)
	u := New(testLogger(t), Options{ExePath: exe})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	_, err := u.Install(ctx, messages.OtaUpdate{URL: srv.URL, SHA256: sum(nil)})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Install: %v, want context.Canceled", err)
	}
	assertUntouched(t, exe, old)
}

func TestInstallFollowsSymlink(t *testing.T) {
	newBin := fakeELF(t, 64<<10)
	srv := newBinServer(t, newBin)
	dir := t.TempDir()
	real := installedExe(t, dir, []byte("old"))
	linkDir := t.TempDir()
	link := filepath.Join(linkDir, "nymph")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	u := New(testLogger(t), Options{ExePath: link})
	if u.ExePath() != real {
		t.Fatalf("ExePath %s, want the symlink's target %s", u.ExePath(), real)
	}
	if _, err := u.Install(context.Background(), messages.OtaUpdate{URL: srv.URL + "/bin", SHA256: sum(newBin)}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the symlink itself was replaced: %v %v", st, err)
	}
	got, _ := os.ReadFile(link)
	if !bytes.Equal(got, newBin) {
		t.Fatal("the symlink's target was not replaced")
	}
	assertNoTemp(t, linkDir)
}

func TestInstallRemovesStaleTemps(t *testing.T) {
	newBin := fakeELF(t, 64<<10)
	srv := newBinServer(t, newBin)
	dir := t.TempDir()
	exe := installedExe(t, dir, []byte("old"))

	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, fmt.Sprintf(".nymph-ota-%d-01J0000000000000000000000.tmp", dead.Process.Pid))
	live := filepath.Join(dir, fmt.Sprintf(".nymph-ota-%d-01J0000000000000000000000.tmp", os.Getppid()))
	for _, p := range []string{stale, live} {
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	u := New(testLogger(t), Options{ExePath: exe})
	if _, err := u.Install(context.Background(), messages.OtaUpdate{URL: srv.URL + "/bin", SHA256: sum(newBin)}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a dead process's temporary file survived: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("a live process's temporary file was removed: %v", err)
	}
}

func TestExecDisabledByOption(t *testing.T) {
	u := New(testLogger(t), Options{ExePath: installedExe(t, t.TempDir(), []byte("old")), DisableSelfExec: true})
	if u.SelfExec() {
		t.Fatal("SelfExec() true with DisableSelfExec")
	}
	if err := u.Exec(); !errors.Is(err, ErrSelfExecDisabled) {
		t.Fatalf("Exec: %v, want ErrSelfExecDisabled", err)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	err := Validate(messages.OtaUpdate{URL: "https://cp.example/bin", SHA256: "abc"})
	if !errors.Is(err, ErrInvalidCommand) || !strings.Contains(err.Error(), "field sha256") {
		t.Fatalf("Validate: %v", err)
	}
	err = Validate(messages.OtaUpdate{URL: "ftp://cp.example/bin", SHA256: strings.Repeat("a", 64)})
	if !errors.Is(err, ErrInvalidCommand) || !strings.Contains(err.Error(), "field url") {
		t.Fatalf("Validate: %v", err)
	}
	if err := Validate(messages.OtaUpdate{URL: "https://cp.example/bin", SHA256: strings.Repeat("A", 64)}); err != nil {
		t.Fatalf("Validate of a good command: %v", err)
	}
}
