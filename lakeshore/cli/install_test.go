package cli_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"nymph/config"
	"nymph/dist"
	"nymph/lakeshore/cli"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/remoteinstall"
)

// installCP is a control plane for install: it mints tokens, lists a
// worker for every token label once registered is set, and serves one
// release of a stand-in binary.
type installCP struct {
	url        string
	mu         sync.Mutex
	tokens     []operatorapi.TokenRequest
	registered bool
	target     *string
	binary     []byte
}

func newInstallCP(t *testing.T) *installCP {
	t.Helper()
	f := &installCP{}
	mux := http.NewServeMux()
	mux.HandleFunc(operatorapi.RouteCreateToken, mintToken(&f.mu, &f.tokens))
	mux.HandleFunc(operatorapi.RouteListWorkers, func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		list := operatorapi.WorkerList{Workers: []operatorapi.Worker{}}
		if f.registered {
			for i, tr := range f.tokens {
				list.Workers = append(list.Workers, operatorapi.Worker{ID: "w" + strings.Repeat("0", 22) + string(rune('a'+i)), Label: tr.Label, State: "active"})
			}
		}
		reply(w, 200, list)
	})
	mux.HandleFunc(operatorapi.RouteGetTargetVersion, func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		reply(w, 200, operatorapi.TargetVersion{Namespace: "default", Version: f.target, PublishedTriples: []string{}})
	})
	mux.HandleFunc(operatorapi.RouteListReleases, func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, operatorapi.ReleaseList{Releases: []operatorapi.Release{
			{Version: "1.2.3", Triple: dist.DefaultTriple()},
			{Version: "1.2.3", Triple: "s390x-unknown-linux-gnu", SHA256: strings.Repeat("e", 64)},
		}})
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/releases/1.2.3/"+dist.DefaultTriple() {
			_, _ = w.Write(f.binary)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+adminToken {
			reply(w, 401, operatorapi.Error{Error: "missing or wrong admin token"})
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// fakeHost is a stand-in for `ssh`: it runs the remote command here with
// HOME set to a private directory, the way sshd would run it on a host,
// and answers for the alias "down" like an unreachable host.
type fakeHost struct {
	home, ssh, log string
}

func newFakeHost(t *testing.T) fakeHost {
	t.Helper()
	dir := t.TempDir()
	h := fakeHost{home: filepath.Join(dir, "home"), ssh: filepath.Join(dir, "fake-ssh"), log: filepath.Join(dir, "ssh.log")}
	if err := os.MkdirAll(h.home, 0o755); err != nil {
		t.Fatal(err)
	}
	script := `#!/bin/sh
while [ $# -gt 0 ]; do
	case $1 in
	-F|-o|-l|-p) shift 2 ;;
	--) shift; break ;;
	-*) shift ;;
	*) break ;;
	esac
done
alias=$1; shift
printf '%s %s\n' "$alias" "$*" >> ` + remoteinstall.Quote(h.log) + `
if [ "$alias" = down ]; then
	echo "ssh: connect to host down port 22: Connection refused" >&2
	exit 255
fi
export HOME=` + remoteinstall.Quote(h.home) + `
cd "$HOME"
exec sh -c "$*"
`
	if err := os.WriteFile(h.ssh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return h
}

// fakeNymph builds a real ELF executable that behaves enough like nymph
// for the install flow: `version` answers like nymph, and `run --config X`
// prints its command line (into the daemon log) and exits.
func fakeNymph(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := `package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "version" {
		fmt.Println("nymph 9.9.9-fake (protocol 1)")
		return
	}
	fmt.Println(strings.Join(os.Args[1:], " "))
}
`
	for name, text := range map[string]string{"go.mod": "module fakenymph\n\ngo 1.21\n", "main.go": src} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "build", "-o", "nymph", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in nymph: %v\n%s", err, out)
	}
	return filepath.Join(dir, "nymph")
}

func (f *installCP) run(t *testing.T, o runOpts, args ...string) result {
	t.Helper()
	return runCLI(t, o, adminEnv(t, f.url), args...)
}

// TestInstall drives `daemon install` against a stand-in host; the
// stand-in nymph is built once for all of its cases.
func TestInstall(t *testing.T) {
	nymph := fakeNymph(t)
	t.Run("CopiesConfiguresStartsAndWaits", func(t *testing.T) { testInstallCopiesConfiguresStartsAndWaits(t, nymph) })
	t.Run("TextOutputAndNoWait", func(t *testing.T) { testInstallTextOutputAndNoWait(t, nymph) })
	t.Run("ReportsADaemonThatExits", func(t *testing.T) { testInstallReportsADaemonThatExits(t, nymph) })
	t.Run("TimesOutWithTheLogTail", func(t *testing.T) { testInstallTimesOutWithTheLogTail(t, nymph) })
	t.Run("DownloadsTheTargetVersion", func(t *testing.T) { testInstallDownloadsTheTargetVersion(t, nymph) })
	t.Run("Errors", func(t *testing.T) { testInstallErrors(t, nymph) })
}

func testInstallCopiesConfiguresStartsAndWaits(t *testing.T, nymph string) {
	for _, method := range []string{"ssh", "rsync"} {
		t.Run(method, func(t *testing.T) {
			if method == "rsync" {
				if _, err := exec.LookPath("rsync"); err != nil {
					t.Skip("no rsync here")
				}
			}
			f := newInstallCP(t)
			f.registered = true
			h := newFakeHost(t)
			r := f.run(t, runOpts{}, "daemon", "install", "gpu-box", "--ssh", h.ssh, "-F", "/dev/null",
				"--binary", nymph, "--copy", method, "--remote-dir", "~/my dir/it's",
				"--label", "gpu", "--tag", "gpu:h100", "--tag", "gpu-count:8", "--runner", "docker", "--runner", "process",
				"--keep-alive-s", "600", "--server-url", "https://cp.example:7700", "--remote-env", "NYMPH_X=a b", "--json")
			if r.code != 0 {
				t.Fatalf("install: %+v", r)
			}
			var res cli.InstallResult
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
				t.Fatalf("--json: %v\n%s", err, r.stdout)
			}
			dir := filepath.Join(h.home, "my dir", "it's", res.LaunchID)
			if len(res.LaunchID) != 26 || res.Label != "gpu-"+res.LaunchID || res.LaunchDir != dir ||
				res.ConfigPath != filepath.Join(dir, "nymph.toml") || res.LogPath != filepath.Join(dir, "nymph.log") ||
				res.WorkerID == nil || res.PID <= 0 || res.JobID != "" || res.Alias != "gpu-box" || res.NymphVersion != "nymph 9.9.9-fake (protocol 1)" {
				t.Fatalf("result %+v", res)
			}
			if want := remoteinstall.Quote(h.ssh) + " -F /dev/null gpu-box 'kill $(cat "; !strings.HasPrefix(res.StopCommand, want) {
				t.Fatalf("stopCommand %q, want it to start %q", res.StopCommand, want)
			}
			if !strings.Contains(r.stdout, fmt.Sprintf(`"pid": %d,`, res.PID)) {
				t.Fatalf("pid is not a JSON number:\n%s", r.stdout)
			}
			if len(f.tokens) != 1 || f.tokens[0].Kind != operatorapi.TokenDaemon || f.tokens[0].Label != res.Label {
				t.Fatalf("tokens minted: %+v", f.tokens)
			}
			tok, err := os.ReadFile(filepath.Join(dir, "token"))
			if err != nil || string(tok) != "dlt_minted\n" {
				t.Fatalf("token file %q %v", tok, err)
			}
			for _, name := range []string{"token", "nymph.toml"} {
				if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Mode().Perm() != 0o600 {
					t.Errorf("%s: mode %v %v", name, st.Mode(), err)
				}
			}
			cfg, err := config.Load(res.ConfigPath)
			if err != nil {
				t.Fatalf("nymph cannot load the config: %v", err)
			}
			if cfg.Server.URL != "https://cp.example:7700" || cfg.Daemon.Label != res.Label ||
				strings.Join(cfg.Daemon.Tags, ",") != "gpu=h100,gpu-count=8" ||
				strings.Join(cfg.Runtime.Runners, ",") != "docker,process" || cfg.Runtime.DefaultRunner != "docker" ||
				cfg.Runtime.KeepAliveS != 600 || cfg.Runtime.Workdir != filepath.Join(dir, "work") {
				t.Fatalf("config %+v", cfg)
			}
			// The start command ran the binary with the config, detached.
			want := "run --config " + res.ConfigPath + "\n"
			var logText string
			for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
				b, _ := os.ReadFile(res.LogPath)
				if logText = string(b); logText == want {
					break
				}
			}
			if logText != want {
				t.Fatalf("daemon log %q, want %q", logText, want)
			}
			sshLog, _ := os.ReadFile(h.log)
			if strings.Contains(string(sshLog), "dlt_minted") {
				t.Fatal("the token appeared on a remote command line")
			}
			if method == "rsync" && !strings.Contains(string(sshLog), "rsync --server") {
				t.Fatalf("rsync was not used:\n%s", sshLog)
			}
		})
	}
}

func testInstallTextOutputAndNoWait(t *testing.T, nymph string) {
	f := newInstallCP(t)
	h := newFakeHost(t)
	r := f.run(t, runOpts{}, "daemon", "install", "box", "--ssh", h.ssh, "-F", "/dev/null", "--binary", nymph, "--no-wait")
	if r.code != 0 {
		t.Fatalf("install: %+v", r)
	}
	for _, s := range []string{"launch:", "label:", "box-", "config:", "nymph.toml (on box)", "log:", "nymph.log (on box)", "pid:", "stop:"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("output lacks %q:\n%s", s, r.stdout)
		}
	}
	// The stop line is a command that works as printed: the same ssh
	// program and -F reach the same host (the stand-in daemon has exited,
	// so its kill finds no process; the stand-in ssh logs the call).
	var stop string
	for _, line := range strings.Split(r.stdout, "\n") {
		if rest, ok := strings.CutPrefix(line, "stop:"); ok {
			stop = strings.TrimSpace(rest)
		}
	}
	if want := remoteinstall.Quote(h.ssh) + " -F /dev/null box 'kill $(cat "; !strings.HasPrefix(stop, want) {
		t.Fatalf("stop line %q, want it to start %q", stop, want)
	}
	before, _ := os.ReadFile(h.log)
	out, _ := exec.Command("sh", "-c", stop).CombinedOutput()
	after, _ := os.ReadFile(h.log)
	if got := strings.TrimPrefix(string(after), string(before)); !strings.HasPrefix(got, "box kill $(cat ") || !strings.Contains(got, "nymph.pid") {
		t.Fatalf("the stop line did not reach the host as printed: ssh log %q, output %q", got, out)
	}
	if strings.Contains(r.stdout, "registered") {
		t.Errorf("--no-wait waited:\n%s", r.stdout)
	}
	// The default base directory is ~/.nymph.
	entries, err := os.ReadDir(filepath.Join(h.home, ".nymph"))
	if err != nil || len(entries) != 1 {
		t.Fatalf("~/.nymph: %v %v", entries, err)
	}
	// The control plane is on loopback and the host is not: say so.
	if !strings.Contains(r.stderr, "loopback") {
		t.Errorf("no loopback note: %q", r.stderr)
	}
}

// A daemon that exits before registering fails the install at once, with
// the end of its log.
func testInstallReportsADaemonThatExits(t *testing.T, nymph string) {
	f := newInstallCP(t)
	h := newFakeHost(t)
	start := time.Now()
	r := f.run(t, runOpts{}, "daemon", "install", "box", "--ssh", h.ssh, "--binary", nymph, "--wait-timeout", "50")
	if r.code != 1 || !strings.Contains(r.stderr, "exited before it registered") ||
		!strings.Contains(r.stderr, "--- last lines of ") || !strings.Contains(r.stderr, "run --config ") {
		t.Fatalf("install: %+v", r)
	}
	if time.Since(start) > 30*time.Second {
		t.Fatalf("took %v; the exit should be noticed within seconds", time.Since(start))
	}
}

func testInstallTimesOutWithTheLogTail(t *testing.T, nymph string) {
	f := newInstallCP(t)
	h := newFakeHost(t)
	r := f.run(t, runOpts{}, "daemon", "install", "box", "--ssh", h.ssh, "--binary", nymph, "--wait-timeout", "0.5", "--json")
	if r.code != 1 || !strings.Contains(r.stderr, "did not register as box-") || !strings.Contains(r.stderr, "run --config ") {
		t.Fatalf("install: %+v", r)
	}
	// --json still says what was launched, so a script can clean up.
	var res cli.InstallResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.WorkerID != nil || res.LaunchDir == "" {
		t.Fatalf("--json after a timeout: %v %q", err, r.stdout)
	}
}

func testInstallDownloadsTheTargetVersion(t *testing.T, nymph string) {
	if _, err := exec.LookPath("curl"); err != nil {
		if _, err := exec.LookPath("wget"); err != nil {
			t.Skip("neither curl nor wget")
		}
	}
	f := newInstallCP(t)
	f.registered = true
	b, err := os.ReadFile(nymph)
	if err != nil {
		t.Fatal(err)
	}
	f.binary = b
	h := newFakeHost(t)

	// No target version and no --binary: a clear error, nothing left behind.
	r := f.run(t, runOpts{}, "daemon", "install", "box", "--ssh", h.ssh)
	if r.code != 1 || !strings.Contains(r.stderr, "no target nymph version") || !strings.Contains(r.stderr, "--binary") {
		t.Fatalf("without a target: %+v", r)
	}

	v := "1.2.3"
	f.target = &v
	r = f.run(t, runOpts{}, "daemon", "install", "box", "--ssh", h.ssh, "--json")
	if r.code != 0 {
		t.Fatalf("install: %+v", r)
	}
	var res cli.InstallResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.WorkerID == nil {
		t.Fatalf("--json: %v %s", err, r.stdout)
	}
	got, err := os.ReadFile(filepath.Join(res.LaunchDir, "nymph"))
	if err != nil || string(got) != string(b) {
		t.Fatalf("downloaded binary differs (%v)", err)
	}
	cfg, err := config.Load(res.ConfigPath)
	if err != nil || cfg.Server.URL != f.url {
		t.Fatalf("config %+v %v", cfg, err)
	}

	// A version not published for this machine is refused before any token.
	tokens := len(f.tokens)
	r = f.run(t, runOpts{}, "daemon", "install", "box", "--ssh", h.ssh, "--nymph-version", "9.9.9")
	if r.code != 1 || !strings.Contains(r.stderr, "has no nymph 9.9.9 for "+dist.DefaultTriple()) || len(f.tokens) != tokens {
		t.Fatalf("unpublished version: %+v", r)
	}
	// The launch directories of failed attempts are removed.
	entries, _ := os.ReadDir(filepath.Join(h.home, ".nymph"))
	if len(entries) != 1 {
		t.Fatalf("launch dirs left: %v", entries)
	}
}

func testInstallErrors(t *testing.T, nymph string) {
	f := newInstallCP(t)
	h := newFakeHost(t)
	echoPath, err := exec.LookPath("echo")
	if err != nil {
		t.Fatal(err)
	}
	// A PATH with what the probe needs but no sbatch.
	bare := t.TempDir()
	for _, tool := range []string{"mkdir", "chmod", "uname"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, filepath.Join(bare, tool)); err != nil {
			t.Fatal(err)
		}
	}
	notELF := filepath.Join(t.TempDir(), "nymph.sh")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unreachable host", []string{"down", "--binary", nymph}, 1, "ssh down failed: ssh: connect to host down port 22: Connection refused"},
		{"missing binary", []string{"box", "--binary", "/no/such/nymph"}, 1, "--binary: stat /no/such/nymph: no such file"},
		{"not an ELF", []string{"box", "--binary", notELF}, 1, "not an ELF executable"},
		{"binary and base url", []string{"box", "--binary", nymph, "--nymph-base-url", "https://x"}, 2, "--binary and --nymph-base-url are mutually exclusive"},
		{"binary and version", []string{"box", "--binary", nymph, "--nymph-version", "1"}, 2, "--nymph-version only applies to a download"},
		{"bad tag", []string{"box", "--tag", "gpu"}, 2, `--tag "gpu": want key:value`},
		{"bad runner", []string{"box", "--runner", "kubernetes"}, 2, `--runner "kubernetes": unknown runner kind`},
		{"twice the runner", []string{"box", "--runner", "process", "--runner", "process"}, 2, "given twice"},
		{"keep alive", []string{"box", "--keep-alive-s", "-2"}, 2, "--keep-alive-s -2"},
		{"partition without slurm", []string{"box", "--slurm-partition", "gpu"}, 2, "--slurm-partition only applies with --slurm"},
		{"alias like a flag", []string{"--", "-oProxyCommand=x"}, 2, "no leading '-'"},
		{"label with a space", []string{"box", "--label", "a b"}, 2, "--label"},
		{"bad base url", []string{"box", "--nymph-base-url", "ftp://x"}, 2, "--nymph-base-url"},
		{"bad server url", []string{"box", "--server-url", "cp:7700"}, 2, "--server-url"},
		{"bad copy", []string{"box", "--binary", nymph, "--copy", "scp"}, 2, "--copy"},
		{"copy without binary", []string{"box", "--copy", "ssh"}, 2, "--copy only applies with --binary"},
		{"bad env", []string{"box", "--remote-env", "A-B=1"}, 2, "--remote-env"},
		{"bad wait", []string{"box", "--wait-timeout", "0"}, 2, "--wait-timeout"},
		{"no alias", []string{}, 2, "wants one <ssh-alias>"},
		{"not nymph", []string{"box", "--binary", echoPath}, 1, `on box: the binary is not nymph: its "version" printed version`},
		{"no sbatch", []string{"box", "--binary", nymph, "--slurm", "--remote-env", "PATH=" + bare}, 1, "sbatch is not on the PATH"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"daemon", "install", "--ssh", h.ssh}, tc.args...)
			r := f.run(t, runOpts{}, args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("code %d, stderr %q; want %d and %q", r.code, r.stderr, tc.code, tc.want)
			}
		})
	}
	// Only the install that got as far as starting minted a token, and
	// no failed attempt left a launch directory behind.
	if len(f.tokens) != 1 {
		t.Errorf("tokens minted: %+v", f.tokens)
	}
	if entries, _ := os.ReadDir(filepath.Join(h.home, ".nymph")); len(entries) != 0 {
		t.Errorf("launch dirs left behind: %v", entries)
	}
}
