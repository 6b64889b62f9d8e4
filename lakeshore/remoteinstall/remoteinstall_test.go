package remoteinstall_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"nymph/config"
	"nymph/lakeshore/remoteinstall"
	"nymph/test/wait"
)

// fakeNymph answers `version` and, for `run`, prints its arguments and
// the value of LAKESHORE_TEST_ENV, then exits.
const fakeNymph = `#!/bin/sh
case $1 in
version) echo "nymph 9.9.9 (protocol 1)" ;;
run) shift; printf 'run'; for a in "$@"; do printf ' [%s]' "$a"; done; printf ' env=%s\n' "${LAKESHORE_TEST_ENV-}" ;;
*) echo "unknown verb $1" >&2; exit 2 ;;
esac
`

// sh runs script with sh -s, as ssh would on the remote host, with HOME
// and PATH given.
func sh(t *testing.T, home, path, script string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command("sh", "-s")
	cmd.Dir = home
	cmd.Env = []string{"HOME=" + home, "PATH=" + path}
	cmd.Stdin = strings.NewReader(script)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errb.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), 0
}

func TestQuote(t *testing.T) {
	for in, want := range map[string]string{
		"plain/path-1.2":    "plain/path-1.2",
		"":                  "''",
		"with space":        "'with space'",
		"it's":              `'it'\''s'`,
		"$HOME":             "'$HOME'",
		"a;rm -rf /":        "'a;rm -rf /'",
		"--job-name=x":      "--job-name=x",
		"back`tick`\"q\"\n": "'back`tick`\"q\"\n'",
	} {
		if got := remoteinstall.Quote(in); got != want {
			t.Errorf("Quote(%q) = %s, want %s", in, got, want)
		}
		out, err := exec.Command("sh", "-c", "printf %s "+remoteinstall.Quote(in)).Output()
		if err != nil || string(out) != in {
			t.Errorf("sh read Quote(%q) back as %q (%v)", in, out, err)
		}
	}
}

// The rendered config is what nymph's own loader accepts, with every value
// in place, also for paths and labels that need escaping.
func TestRenderConfigLoadsInNymph(t *testing.T) {
	dir := filepath.Join(t.TempDir(), `launch dir "quoted" \ back`)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	l := remoteinstall.Layout{Dir: dir}
	if err := os.WriteFile(l.TokenFile(), []byte("dlt_x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := remoteinstall.Spec{
		LaunchID:   "01JABCDEFGHJKMNPQRSTVWXYZ0",
		Label:      `gpu "rig"-01JABCDEFGHJKMNPQRSTVWXYZ0`,
		ServerURL:  "https://cp.example:7700",
		Tags:       []string{"gpu=h100", "gpu-count=8"},
		Runners:    []string{"docker", "process"},
		KeepAliveS: 600,
	}
	text, err := remoteinstall.RenderConfig(l, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(text, "# Written by `lakeshore daemon install`, launch 01JABCDEFGHJKMNPQRSTVWXYZ0.") {
		t.Fatalf("config header:\n%s", text)
	}
	cfg, err := config.Parse(l.Config(), []byte(text), "/nonexistent-home")
	if err != nil {
		t.Fatalf("nymph refuses the rendered config: %v\n%s", err, text)
	}
	if len(cfg.Warnings) > 0 {
		t.Fatalf("warnings: %v\n%s", cfg.Warnings, text)
	}
	if cfg.Server.URL != spec.ServerURL || cfg.Server.TokenFile != l.TokenFile() {
		t.Errorf("server = %+v", cfg.Server)
	}
	if cfg.Daemon.Label != spec.Label || cfg.Daemon.MachineID != "auto" || strings.Join(cfg.Daemon.Tags, ",") != "gpu=h100,gpu-count=8" {
		t.Errorf("daemon = %+v", cfg.Daemon)
	}
	if cfg.Runtime.DefaultRunner != "docker" || strings.Join(cfg.Runtime.Runners, ",") != "docker,process" ||
		cfg.Runtime.KeepAliveS != 600 || cfg.Runtime.Workdir != l.Workdir() {
		t.Errorf("runtime = %+v", cfg.Runtime)
	}
	if cfg.Log.Format != "json" {
		t.Errorf("log = %+v", cfg.Log)
	}
	// Every other key is nymph's default, as if the file left it out.
	want := config.Default()
	want.Path = l.Config()
	want.Server.URL, want.Server.TokenFile = spec.ServerURL, l.TokenFile()
	want.Daemon.Label, want.Daemon.Tags = spec.Label, spec.Tags
	want.Runtime.DefaultRunner, want.Runtime.Runners = "docker", spec.Runners
	want.Runtime.Workdir, want.Runtime.KeepAliveS = l.Workdir(), spec.KeepAliveS
	want.Identity.KeyFile = "/nonexistent-home/.nymph/identity.key"
	want.Log.Format = "json"
	if !reflect.DeepEqual(*cfg, want) {
		t.Errorf("config\n%+v\nwant\n%+v", *cfg, want)
	}

	// No tags still renders a list (nymph sends [] on the wire).
	spec.Tags = nil
	text, err = remoteinstall.RenderConfig(l, spec)
	if err != nil || !strings.Contains(text, "tags = []") {
		t.Fatalf("no tags: %v\n%s", err, text)
	}
	for _, bad := range []struct {
		l remoteinstall.Layout
		s remoteinstall.Spec
	}{
		{remoteinstall.Layout{Dir: "relative"}, spec},
		{l, remoteinstall.Spec{Label: "x", Runners: []string{"process"}}},
		{l, remoteinstall.Spec{ServerURL: "http://x", Runners: []string{"process"}}},
		{l, remoteinstall.Spec{ServerURL: "http://x", Label: "x"}},
	} {
		if _, err := remoteinstall.RenderConfig(bad.l, bad.s); err == nil {
			t.Errorf("RenderConfig(%+v, %+v) accepted", bad.l, bad.s)
		}
	}
}

func TestProbeCreatesThePrivateLaunchDir(t *testing.T) {
	home := t.TempDir()
	for _, tc := range []struct{ base, want string }{
		{"~/.nymph", filepath.Join(home, ".nymph", "L1")},
		{"~/dir with space/it's", filepath.Join(home, "dir with space", "it's", "L1")},
		{"rel", filepath.Join(home, "rel", "L1")},
		{filepath.Join(home, "abs $x"), filepath.Join(home, "abs $x", "L1")},
	} {
		out, stderr, code := sh(t, home, os.Getenv("PATH"), remoteinstall.ProbeScript(tc.base, "L1"))
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.base, code, stderr)
		}
		p, err := remoteinstall.ParseProbe("motd noise\n" + out)
		if err != nil {
			t.Fatalf("%s: %v\n%s", tc.base, err, out)
		}
		if p.Dir != tc.want {
			t.Errorf("%s: dir %q, want %q", tc.base, p.Dir, tc.want)
		}
		st, err := os.Stat(tc.want)
		if err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: launch dir %v %v", tc.base, st, err)
		}
		if p.Arch == "" || !p.Tools["nohup"] {
			t.Errorf("%s: probe %+v", tc.base, p)
		}
	}
	if _, err := remoteinstall.ParseProbe("nothing here"); err == nil {
		t.Error("an empty probe parsed")
	}
}

type remote struct {
	home, path string
	layout     remoteinstall.Layout
	bin        string // a fake nymph
}

func newRemote(t *testing.T) remote {
	t.Helper()
	home := filepath.Join(t.TempDir(), "home of it's")
	binDir := t.TempDir()
	dir := filepath.Join(home, ".nymph", "L1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "fake-nymph")
	if err := os.WriteFile(bin, []byte(fakeNymph), 0o755); err != nil {
		t.Fatal(err)
	}
	return remote{home: home, path: binDir + ":" + os.Getenv("PATH"), layout: remoteinstall.Layout{Dir: dir}, bin: bin}
}

func (r remote) copyBinary(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(r.bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.layout.Partial(), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func fields(out string) map[string]string {
	m := map[string]string{}
	for k, v := range remoteinstall.Fields(out) {
		m[k] = v
	}
	return m
}

// Setup with a copied binary: checks it, writes 0600 secrets, starts the
// daemon detached with the exported environment, and records its pid.
func TestSetupStartsDetached(t *testing.T) {
	r := newRemote(t)
	r.copyBinary(t)
	l := r.layout
	script, err := remoteinstall.SetupScript(remoteinstall.SetupInput{
		Layout: l, LaunchID: "L1", Token: "dlt_secret", Config: "[server]\nurl = \"http://x\"",
		Start: remoteinstall.Start{Env: [][2]string{{"LAKESHORE_TEST_ENV", "a b'c"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(script, "sbatch") {
		t.Fatalf("a detached start mentions sbatch:\n%s", script)
	}
	out, stderr, code := sh(t, r.home, r.path, script)
	if code != 0 {
		t.Fatalf("setup exit %d: %s\n%s", code, stderr, script)
	}
	f := fields(out)
	if f["version"] != "nymph 9.9.9 (protocol 1)" || f["pid"] == "" {
		t.Fatalf("setup reported %v", f)
	}
	for path, want := range map[string]string{
		l.TokenFile(): "dlt_secret\n",
		l.Config():    "[server]\nurl = \"http://x\"\n",
		l.PIDFile():   f["pid"] + "\n",
	} {
		b, err := os.ReadFile(path)
		if err != nil || string(b) != want {
			t.Errorf("%s = %q (%v), want %q", path, b, err, want)
		}
	}
	for _, p := range []string{l.TokenFile(), l.Config()} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v (%v), want 0600", p, st.Mode(), err)
		}
	}
	if st, err := os.Stat(l.Binary()); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("binary %v %v", st, err)
	}
	if _, err := os.Stat(l.Partial()); !os.IsNotExist(err) {
		t.Errorf("partial binary left behind: %v", err)
	}
	if st, err := os.Stat(l.Workdir()); err != nil || !st.IsDir() {
		t.Errorf("workdir %v", err)
	}

	// The fake daemon ran and exited: status says so and shows its log,
	// which proves the exact command line and environment.
	want := "run [--config] [" + l.Config() + "] env=a b'c"
	var state, tail string
	// The detached child may not have written or exited yet; on a busy
	// machine that takes a while, so the wait is bounded by time, not by
	// a count of status calls.
	wait.Until(20*time.Second, func() bool {
		state, tail = statusOf(t, r, false)
		return strings.Contains(tail, want) && state == "exited"
	})
	if state != "exited" || !strings.Contains(tail, want) {
		t.Fatalf("status %q, log tail %q; want it to contain %q", state, tail, want)
	}
}

func statusOf(t *testing.T, r remote, slurm bool) (string, string) {
	t.Helper()
	out, stderr, code := sh(t, r.home, r.path, remoteinstall.StatusScript(r.layout, slurm, nil, 20))
	if code != 0 {
		t.Fatalf("status exit %d: %s", code, stderr)
	}
	return remoteinstall.ParseStatus(out)
}

func TestStartCommandShape(t *testing.T) {
	l := remoteinstall.Layout{Dir: "/home/u/my dir/L1"}
	got := remoteinstall.StartCommand(l)
	want := `setsid nohup '/home/u/my dir/L1/nymph' run --config '/home/u/my dir/L1/nymph.toml' > '/home/u/my dir/L1/nymph.log' 2>&1 < /dev/null &`
	if !strings.Contains(got, want) {
		t.Fatalf("start command:\n%s\nwant a line\n%s", got, want)
	}
	ssh := []string{"ssh", "-F", "/home/op/my ssh/config", "bos14"}
	if got, want := remoteinstall.StopHint(ssh, l, "", nil), `ssh -F '/home/op/my ssh/config' bos14 'kill $(cat '\''/home/u/my dir/L1/nymph.pid'\'')'`; got != want {
		t.Errorf("stop hint\n%s\nwant\n%s", got, want)
	}
	env := [][2]string{{"SLURM_CONF", "/etc/slurm test/slurm.conf"}}
	if got, want := remoteinstall.StopHint([]string{"ssh", "bos14"}, l, "77", env), `ssh bos14 'export SLURM_CONF='\''/etc/slurm test/slurm.conf'\''; scancel 77'`; got != want {
		t.Errorf("slurm stop hint\n%s\nwant\n%s", got, want)
	}
}

// Under --slurm the daemon is submitted with sbatch: job name, log,
// partition and directory on its command line, the job id recorded.
func TestSetupSubmitsToSlurm(t *testing.T) {
	r := newRemote(t)
	r.copyBinary(t)
	l := r.layout
	argsFile := filepath.Join(t.TempDir(), "sbatch-args")
	fakeSbatch := "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > " + remoteinstall.Quote(argsFile) + "\necho '4242;clusterA'\n"
	if err := os.WriteFile(filepath.Join(filepath.Dir(r.bin), "sbatch"), []byte(fakeSbatch), 0o755); err != nil {
		t.Fatal(err)
	}
	script, err := remoteinstall.SetupScript(remoteinstall.SetupInput{
		Layout: l, LaunchID: "L1", Token: "dlt_secret", Config: "x = 1\n",
		Start: remoteinstall.Start{Slurm: true, Partition: "gpu part"},
	})
	if err != nil {
		t.Fatal(err)
	}
	out, stderr, code := sh(t, r.home, r.path, script)
	if code != 0 {
		t.Fatalf("setup exit %d: %s", code, stderr)
	}
	if f := fields(out); f["job"] != "4242" || f["pid"] != "" {
		t.Fatalf("setup reported %v", f)
	}
	if b, _ := os.ReadFile(l.JobFile()); string(b) != "4242\n" {
		t.Errorf("job file %q", b)
	}
	b, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	wantArgs := append(remoteinstall.SbatchArgs(l, "L1", "gpu part"), l.BatchScript())
	if got := strings.Split(strings.TrimSpace(string(b)), "\n"); strings.Join(got, "|") != strings.Join(wantArgs, "|") {
		t.Fatalf("sbatch args\n%q\nwant\n%q", got, wantArgs)
	}
	for _, a := range []string{"--job-name=lakeshore-nymph-L1", "--output=" + l.Log(), "--partition=gpu part", "--chdir=" + l.Dir} {
		if !strings.Contains(string(b), a+"\n") {
			t.Errorf("sbatch args miss %q", a)
		}
	}
	// The job script itself runs the daemon (run it as the job would).
	job, err := os.ReadFile(l.BatchScript())
	if err != nil || string(job) != remoteinstall.BatchScript(l, "L1", "gpu part") {
		t.Fatalf("batch script %q %v", job, err)
	}
	cmd := exec.Command("sh", l.BatchScript())
	cmd.Env = []string{"PATH=" + r.path}
	jobOut, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(jobOut), "run [--config] ["+l.Config()+"]") {
		t.Fatalf("job script: %v %s", err, jobOut)
	}

	// No partition: no --partition flag at all.
	for _, a := range remoteinstall.SbatchArgs(l, "L1", "") {
		if strings.HasPrefix(a, "--partition") {
			t.Errorf("unexpected %s", a)
		}
	}
}

func TestSetupDownloadsAndChecksTheBinary(t *testing.T) {
	bin := []byte(fakeNymph)
	sum := sha256.Sum256(bin)
	hexSum := hex.EncodeToString(sum[:])
	sidecar := hexSum
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/rel/1.0/x86_64-unknown-linux-gnu":
			_, _ = w.Write(bin)
		case "/rel/1.0/x86_64-unknown-linux-gnu.sha256":
			_, _ = w.Write([]byte(sidecar + "  nymph-x86_64-unknown-linux-gnu\n"))
		case "/nosidecar/bin":
			_, _ = w.Write(bin)
		default:
			http.NotFound(w, req)
		}
	}))
	defer srv.Close()

	run := func(d remoteinstall.Download) (map[string]string, string, int) {
		r := newRemote(t)
		script, err := remoteinstall.SetupScript(remoteinstall.SetupInput{
			Layout: r.layout, LaunchID: "L1", Download: &d, Token: "dlt_secret", Config: "x = 1\n",
		})
		if err != nil {
			t.Fatal(err)
		}
		out, stderr, code := sh(t, r.home, r.path, script)
		return fields(out), stderr, code
	}

	f, stderr, code := run(remoteinstall.Download{URL: srv.URL + "/rel/1.0/x86_64-unknown-linux-gnu"})
	if code != 0 || f["sha256"] != hexSum || f["version"] == "" {
		t.Fatalf("sidecar-checked download: %d %v %s", code, f, stderr)
	}
	f, stderr, code = run(remoteinstall.Download{URL: srv.URL + "/nosidecar/bin", SHA256: hexSum})
	if code != 0 || f["sha256"] != hexSum {
		t.Fatalf("download with a known sum: %d %v %s", code, f, stderr)
	}
	if _, stderr, code = run(remoteinstall.Download{URL: srv.URL + "/nosidecar/bin", SHA256: strings.Repeat("0", 64)}); code != remoteinstall.ExitChecksum || !strings.Contains(stderr, "checksum mismatch") {
		t.Fatalf("wrong sum: %d %s", code, stderr)
	}
	sidecar = strings.Repeat("1", 64)
	if _, stderr, code = run(remoteinstall.Download{URL: srv.URL + "/rel/1.0/x86_64-unknown-linux-gnu"}); code != remoteinstall.ExitChecksum {
		t.Fatalf("wrong sidecar: %d %s", code, stderr)
	}
	if _, stderr, code = run(remoteinstall.Download{URL: srv.URL + "/missing"}); code != remoteinstall.ExitDownload || !strings.Contains(stderr, "/missing failed") {
		t.Fatalf("404: %d %s", code, stderr)
	}
}

func TestSetupRefusesABinaryThatDoesNotRun(t *testing.T) {
	r := newRemote(t)
	if err := os.WriteFile(r.layout.Partial(), []byte("#!/bin/sh\necho broken >&2\nexit 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script, err := remoteinstall.SetupScript(remoteinstall.SetupInput{Layout: r.layout, LaunchID: "L1", Token: "t", Config: "x = 1\n"})
	if err != nil {
		t.Fatal(err)
	}
	_, stderr, code := sh(t, r.home, r.path, script)
	if code != remoteinstall.ExitBadBinary || !strings.Contains(stderr, "does not run on this host: broken") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if _, err := os.Stat(r.layout.TokenFile()); !os.IsNotExist(err) {
		t.Error("the token was written for a binary that does not run")
	}
}

// Another program (say the lakeshore binary, by mistake) is refused even
// though it has a version verb.
func TestSetupRefusesABinaryThatIsNotNymph(t *testing.T) {
	r := newRemote(t)
	if err := os.WriteFile(r.layout.Partial(), []byte("#!/bin/sh\necho lakeshore 1.0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script, err := remoteinstall.SetupScript(remoteinstall.SetupInput{Layout: r.layout, LaunchID: "L1", Token: "t", Config: "x = 1\n"})
	if err != nil {
		t.Fatal(err)
	}
	_, stderr, code := sh(t, r.home, r.path, script)
	if code != remoteinstall.ExitBadBinary || !strings.Contains(stderr, `the binary is not nymph: its "version" printed lakeshore 1.0`) {
		t.Fatalf("exit %d: %s", code, stderr)
	}
}

func TestSetupInputValidation(t *testing.T) {
	l := remoteinstall.Layout{Dir: "/x"}
	for name, in := range map[string]remoteinstall.SetupInput{
		"empty token":     {Layout: l, Config: "a"},
		"multiline token": {Layout: l, Token: "a\nb", Config: "a"},
		"delimiter":       {Layout: l, Token: "t", Config: "a\nLAKESHORE_CONFIG_EOF\nb"},
		"bad env":         {Layout: l, Token: "t", Config: "a", Start: remoteinstall.Start{Env: [][2]string{{"A-B", "x"}}}},
	} {
		if _, err := remoteinstall.SetupScript(in); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for name, ok := range map[string]bool{"PATH": true, "_x1": true, "1A": false, "": false, "A B": false} {
		if remoteinstall.ValidEnvName(name) != ok {
			t.Errorf("ValidEnvName(%q) = %v", name, !ok)
		}
	}
}

func TestParseStatus(t *testing.T) {
	state, tail := remoteinstall.ParseStatus("noise\n" + remoteinstall.Marker + "state=exited\n---\nline 1\nline 2\n")
	if state != "exited" || tail != "line 1\nline 2\n" {
		t.Fatalf("%q %q", state, tail)
	}
}
