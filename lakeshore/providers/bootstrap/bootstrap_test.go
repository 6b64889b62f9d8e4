package bootstrap

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"nymph/config"
	"nymph/test/realparts"
	"nymph/test/wait"
)

// loadHelperEnv makes the test binary, run inside the container, load the
// config file it names with config.Load and print the result as JSON: the
// config's paths are absolute paths of the container, so it is loaded
// where they exist.
const loadHelperEnv = "BOOTSTRAP_LOAD_CONFIG"

func TestMain(m *testing.M) {
	if path := os.Getenv(loadHelperEnv); path != "" {
		c, err := config.Load(path)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		_ = json.NewEncoder(os.Stdout).Encode(c)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const testCA = `-----BEGIN CERTIFICATE-----
MIIBhTCCASugAwIBAgIQIRi6zePL6mKjOipn+dNuaTAKBggqhkjOPQQDAjASMRAw
DgYDVQQKEwdBY21lIENvMB4XDTE3MTAyMDE5NDMwNloXDTE4MTAyMDE5NDMwNlow
EjEQMA4GA1UEChMHQWNtZSBDbzBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABD0d
7VNhbWvZLWPuj/RtHFjvtJBEwOkhbN/BnnE8rnZR8+sbwnc/KhCk3FhnpHZnQz7B
5aETbbIgmuvewdjvSBSjYzBhMA4GA1UdDwEB/wQEAwICpDATBgNVHSUEDDAKBggr
BgEFBQcDATAPBgNVHRMBAf8EBTADAQH/MCkGA1UdEQQiMCCCDmxvY2FsaG9zdDo1
NDUzgg4xMjcuMC4wLjE6NTQ1MzAKBggqhkjOPQQDAgNIADBFAiEA2zpJEPQyz6/l
Wf86aX6PepsntZv2GYlA5UpabfT2EZICICpJ5h/iI+i341gBmLiAFQOyTDT+/wQc
6MF9+Yw1Yy0t
-----END CERTIFICATE-----
`

// hostile is text that breaks any script that does not quote it.
const hostile = "it's \"$(touch /tmp/pwned)\" `id` $HOME\nsecond line \\ ${x:-y} ; rm -rf /"

func baseInput() Input {
	return Input{
		ServerURL:    "http://127.0.0.1:9/",
		BinaryURL:    "http://127.0.0.1:9/v1/releases/v1.2.3/x86_64-unknown-linux-gnu",
		BinarySHA256: strings.Repeat("ab", 32),
		Token:        "dlt_0123456789abcdef",
		Label:        "gpu-rig-00",
		Runners:      []string{"process"},
		KeepAliveS:   -1,
	}
}

func TestRenderedScriptsPassShellcheck(t *testing.T) {
	shellcheck := realparts.RequireTool(t, "shellcheck")[0]
	hostileIn := baseInput()
	hostileIn.Label = hostile
	hostileIn.Tags = []string{hostile, "gpu:h100", "'", "$"}
	hostileIn.Queues = []string{hostile, "training"}
	hostileIn.PreScript = "echo " + hostile + "\n" + heredocPrefix + "\n"
	enroll := baseInput()
	enroll.Enroll, enroll.Token, enroll.CAPEM = true, "dle_0123456789", testCA
	enroll.Runners = []string{"docker", "process"}
	enroll.KeepAliveS = 0
	shebang := baseInput()
	shebang.PreScript = "#!/bin/sh\necho from sh\n"
	for name, in := range map[string]Input{"minimal": baseInput(), "hostile": hostileIn, "enroll with ca": enroll, "shebang pre-script": shebang} {
		t.Run(name, func(t *testing.T) {
			script, err := Render(in)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "bootstrap.sh")
			if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(shellcheck, "--shell=bash", "--severity=style", path).CombinedOutput()
			if err != nil {
				t.Fatalf("shellcheck: %v\n%s", err, out)
			}
			if strings.Contains(script, "dlt_") || strings.Contains(script, "dle_") {
				n := strings.Count(script, in.Token)
				if n != 1 {
					t.Errorf("the token appears %d times in the script, want once (its heredoc)", n)
				}
			}
		})
	}
}

func TestRenderRejectsBadInput(t *testing.T) {
	for _, c := range []struct {
		field string
		edit  func(*Input)
	}{
		{"server url", func(in *Input) { in.ServerURL = "127.0.0.1:8080" }},
		{"binary url", func(in *Input) { in.BinaryURL = "" }},
		{"binary sha256", func(in *Input) { in.BinarySHA256 = "" }},
		{"binary sha256", func(in *Input) { in.BinarySHA256 = strings.Repeat("z", 64) }},
		{"token", func(in *Input) { in.Token = "" }},
		{"token", func(in *Input) { in.Token = "a\nb" }},
		{"ca pem", func(in *Input) { in.CAPEM = "not a pem" }},
		{"label", func(in *Input) { in.Label = " " }},
		{"machine id", func(in *Input) { in.MachineID = "\t" }},
		{"tags", func(in *Input) { in.Tags = []string{"ok", ""} }},
		{"queues", func(in *Input) { in.Queues = []string{" "} }},
		{"runners", func(in *Input) { in.Runners = []string{"kubernetes"} }},
		{"keep alive", func(in *Input) { in.KeepAliveS = -2 }},
		{"bootstrap script", func(in *Input) { in.PreScript = "echo \x00" }},
	} {
		in := baseInput()
		c.edit(&in)
		_, err := Render(in)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: got error %v, want one naming %q", c.field, err, c.field)
		}
	}
}

// TestUnitVerifies runs systemd-analyze verify on the unit inside a
// private root (--root): a copy of this host's system units, so the unit's
// dependencies resolve, and a stub executable at BinaryPath, which this
// host does not have (verify checks that ExecStart is executable).
func TestUnitVerifies(t *testing.T) {
	analyze := realparts.RequireTool(t, "systemd-analyze")[0]
	verify := func(t *testing.T, unit string) string {
		root := t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, "usr/lib/systemd"), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
			t.Fatalf("copy the host's units: %v\n%s", err, out)
		}
		for _, f := range []struct {
			path, body string
			mode       os.FileMode
		}{{BinaryPath, "#!/bin/sh\n", 0o755}, {UnitPath, unit, 0o644}} {
			p := filepath.Join(root, f.path)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(f.body), f.mode); err != nil {
				t.Fatal(err)
			}
		}
		out, err := exec.Command(analyze, "verify", "--root="+root, UnitPath).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("%v: %s", err, out)
		}
		return string(out)
	}
	if out := verify(t, Unit()); out != "" {
		t.Fatalf("systemd-analyze verify %s:\n%s", UnitName, out)
	}
	// The same check on a unit with a mistake says so: an empty output
	// above means a clean unit, not a verifier that looked at nothing.
	bad := strings.Replace(Unit(), "Restart=always", "Restart=sometimes", 1)
	if out := verify(t, bad); !strings.Contains(out, "sometimes") {
		t.Fatalf("systemd-analyze verify accepted Restart=sometimes silently: %q", out)
	}
	if u := Unit(); !strings.Contains(u, "\nRestart=always\n") || !strings.Contains(u, "\nExecStart="+BinaryPath+" run --config "+ConfigPath+"\n") {
		t.Fatalf("unit lacks Restart=always or the ExecStart line:\n%s", u)
	}
}

// fakeNymph stands in for the nymph release the bootstrap downloads: it
// answers `version` like nymph, and otherwise records its argv, one line
// per start, and stays up as a daemon would.
const fakeNymph = `#!/bin/sh
if [ "$1" = version ]; then echo "nymph 0.0.0-fake"; exit 0; fi
echo "$*" >> /var/lib/dreamlake/fake-nymph-starts
echo "fake nymph started: $*"
exec sleep 2147483647
`

const fakeStarts = "/var/lib/dreamlake/fake-nymph-starts"

// container runs bootstrap scripts as root in a busybox container on the
// host network, with this host's bash (and, with curl, its curl) and their
// libraries mounted read-only.
type container struct {
	t    *testing.T
	name string
}

func podmanArgs(t *testing.T, image, scripts string, curl bool) []string {
	tools := realparts.RequireTool(t, "bash", "curl")
	args := append(realparts.PodmanGlobalArgs(), "run")
	for _, a := range realparts.PodmanRunArgs() {
		if !strings.HasPrefix(a, "--network") {
			args = append(args, a)
		}
	}
	args = append(args, "--network=host", "-v", tools[0]+":/bin/bash:ro", "-v", scripts+":/boot:ro")
	bins := []string{tools[0]}
	if curl {
		args = append(args, "-v", tools[1]+":/bin/curl:ro")
		bins = append(bins, tools[1])
	}
	for _, l := range libs(t, bins...) {
		args = append(args, "-v", l+":"+l+":ro")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return append(args, "-v", self+":/bootstrap.test:ro")
}

// libs are the shared libraries (and the loader) ldd names for bins. They
// are mounted one by one, not their directories: with the host's whole
// libc directory the image's static busybox loads the host's NSS modules
// and crashes.
func libs(t *testing.T, bins ...string) []string {
	var files []string
	for _, b := range bins {
		out, err := exec.Command("ldd", b).Output()
		if err != nil {
			t.Fatalf("ldd %s: %v", b, err)
		}
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "/") && !slices.Contains(files, f) {
				files = append(files, f)
			}
		}
	}
	return files
}

// startContainer runs cmd as the main process of a new container, with
// scripts mounted at /boot, and removes the container when t ends.
func startContainer(t *testing.T, image, scripts string, cmd ...string) *container {
	c := &container{t: t, name: fmt.Sprintf("bootstrap-test-%d-%s", os.Getpid(), strings.ToLower(t.Name()))}
	args := append(podmanArgs(t, image, scripts, false), "-d", "--name", c.name, image)
	if out, err := exec.Command("podman", append(args, cmd...)...).CombinedOutput(); err != nil {
		t.Fatalf("podman run: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_ = exec.Command("podman", append(realparts.PodmanGlobalArgs(), "rm", "-f", "-t", "0", c.name)...).Run()
	})
	return c
}

func (c *container) exec(args ...string) (string, error) {
	out, err := exec.Command("podman", append(append(realparts.PodmanGlobalArgs(), "exec", c.name), args...)...).CombinedOutput()
	return string(out), err
}

func (c *container) must(args ...string) string {
	c.t.Helper()
	out, err := c.exec(args...)
	if err != nil {
		c.t.Fatalf("podman exec %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (c *container) lines(path string) []string {
	out, err := c.exec("cat", path)
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSuffix(out, "\n"), "\n")
}

// releaseServer serves the fake nymph over real HTTP on loopback, as the
// control plane serves releases, and returns its URL and sha256.
func releaseServer(t *testing.T) (string, string) {
	sum := sha256.Sum256([]byte(fakeNymph))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/releases/v0.0.0-fake/x86_64-unknown-linux-gnu" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(fakeNymph))
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1/releases/v0.0.0-fake/x86_64-unknown-linux-gnu", hex.EncodeToString(sum[:])
}

func writeScript(t *testing.T, dir, name string, in Input) {
	t.Helper()
	s, err := Render(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBootstrapRunsInAContainer runs the rendered script for real, as the
// podman provider does: as the container's main process, where systemd is
// not running, downloading with busybox wget.
func TestBootstrapRunsInAContainer(t *testing.T) {
	image := realparts.PodmanImage(t)
	binURL, sum := releaseServer(t)
	in := baseInput()
	in.BinaryURL, in.BinarySHA256 = binURL, sum
	in.Label = hostile
	in.Tags = []string{hostile, "gpu:h100"}
	in.Queues = []string{"training", hostile}
	in.Runners = []string{"echo", "process"}
	in.KeepAliveS = 300
	in.PreScript = "echo \"pre-script ran as $(id -u)\"\necho ran >> /root/pre-ran\n"
	scripts := t.TempDir()
	writeScript(t, scripts, "first.sh", in)
	changed := in
	changed.Label = "relabelled"
	writeScript(t, scripts, "changed.sh", changed)

	c := startContainer(t, image, scripts, "/bin/bash", "/boot/first.sh")
	logs := func() string {
		out, _ := exec.Command("podman", append(realparts.PodmanGlobalArgs(), "logs", c.name)...).CombinedOutput()
		return string(out)
	}
	if !wait.Until(time.Minute, func() bool { return len(c.lines(fakeStarts)) == 1 }) {
		t.Fatalf("nymph never started; the launch log:\n%s", logs())
	}
	if got := c.lines(fakeStarts)[0]; got != "run --config "+ConfigPath {
		t.Errorf("nymph started as %q, want %q", got, "run --config "+ConfigPath)
	}

	modes := map[string]string{
		BinaryPath: "755", ConfigPath: "644", TokenPath: "600", UnitPath: "644",
		DataDir: "700", WorkDir: "700", PreScriptPath: "700",
	}
	for path, want := range modes {
		if got := strings.TrimSpace(c.must("stat", "-c", "%a", path)); got != want {
			t.Errorf("%s: mode %s, want %s", path, got, want)
		}
	}
	if got := c.must("cat", TokenPath); got != in.Token+"\n" {
		t.Errorf("token file holds %q, want %q", got, in.Token+"\n")
	}
	if got := c.must("cat", UnitPath); got != Unit() {
		t.Errorf("unit file differs from Unit():\n%s", got)
	}
	if got := c.must("sha256sum", BinaryPath); !strings.HasPrefix(got, sum) {
		t.Errorf("installed binary: %s, want sha256 %s", got, sum)
	}
	cfg := loadConfig(t, c)
	if cfg.Daemon.Label != hostile || cfg.Daemon.MachineID != "auto" || !slices.Equal(cfg.Daemon.Tags, in.Tags) || !slices.Equal(cfg.Daemon.Lanes, in.Queues) {
		t.Errorf("config: label %q tags %q lanes %q, want %q %q %q", cfg.Daemon.Label, cfg.Daemon.Tags, cfg.Daemon.Lanes, hostile, in.Tags, in.Queues)
	}
	if cfg.Server.URL != in.ServerURL || cfg.Server.TokenFile != TokenPath || cfg.Identity.Enabled ||
		cfg.Runtime.DefaultRunner != "echo" || !slices.Equal(cfg.Runtime.Runners, in.Runners) ||
		cfg.Runtime.KeepAliveS != 300 || cfg.Runtime.Workdir != WorkDir || cfg.Identity.KeyFile != KeyPath {
		t.Errorf("config: %+v %+v %+v", cfg.Server, cfg.Runtime, cfg.Identity)
	}
	if _, err := c.exec("test", "-e", "/tmp/pwned"); err == nil {
		t.Error("a hostile label ran a command")
	}
	if l := logs(); !strings.Contains(l, "pre-script ran as 0") || !strings.Contains(l, "supervising nymph in a restart loop") {
		t.Errorf("the launch log lacks the pre-script's output or the loop's start:\n%s", l)
	}

	// A second run of the same script converges: nothing changes, nymph is
	// not restarted, no second loop starts, no temporary file is left.
	out := c.must("/bin/bash", "/boot/first.sh")
	if !strings.Contains(out, "already supervised") || !strings.Contains(out, "already installed") {
		t.Errorf("second run said:\n%s", out)
	}
	if n := len(c.lines(fakeStarts)); n != 1 {
		t.Errorf("nymph started %d times after an unchanged second run, want 1", n)
	}
	for dir, want := range map[string][]string{"/opt/dreamlake/bin": {"nymph"}, ConfigDir: {"token", "udf-daemon.toml"}} {
		if got := strings.Fields(c.must("ls", "-A", dir)); !slices.Equal(got, want) {
			t.Errorf("%s after the second run: %q, want %q (no temporary file left)", dir, got, want)
		}
	}
	if got := c.lines("/root/pre-ran"); len(got) != 2 {
		t.Errorf("the pre-script ran %d times in two runs", len(got))
	}

	// A run with a changed config rewrites it and has the running loop
	// restart nymph, still without a second loop.
	out = c.must("/bin/bash", "/boot/changed.sh")
	if !strings.Contains(out, "restarting nymph") {
		t.Errorf("changed run said:\n%s", out)
	}
	if !wait.Until(time.Minute, func() bool { return len(c.lines(fakeStarts)) == 2 }) {
		t.Fatalf("nymph was not restarted after its config changed:\n%s", logs())
	}
	if cfg := loadConfig(t, c); cfg.Daemon.Label != "relabelled" {
		t.Errorf("label after the changed run: %q", cfg.Daemon.Label)
	}
	// The pattern does not match itself in grep's or sh's command line.
	loops := len(strings.Fields(c.must("sh", "-c", "grep -l 'boot/[f]irst[.]sh' /proc/[0-9]*/cmdline || true")))
	if loops != 1 {
		t.Errorf("%d bootstrap loops run, want 1", loops)
	}

	// podman stop's SIGTERM ends the loop and nymph at once, cleanly.
	if out, err := exec.Command("podman", append(realparts.PodmanGlobalArgs(), "stop", "-t", "30", c.name)...).CombinedOutput(); err != nil {
		t.Fatalf("podman stop: %v\n%s", err, out)
	}
	code := realparts.Podman(t, "inspect", "--format", "{{.State.ExitCode}}", c.name)
	if code != "0" {
		t.Errorf("the bootstrap exited %s on SIGTERM, want 0:\n%s", code, logs())
	}
}

func loadConfig(t *testing.T, c *container) *config.Config {
	t.Helper()
	out, err := c.exec("env", loadHelperEnv+"="+ConfigPath, "/bootstrap.test")
	if err != nil {
		t.Fatalf("config.Load %s in the container: %v\n%s", ConfigPath, err, out)
	}
	var cfg config.Config
	if err := json.Unmarshal([]byte(out), &cfg); err != nil {
		t.Fatalf("config.Load output: %v\n%s", err, out)
	}
	return &cfg
}

// TestBootstrapRefusesAWrongChecksum runs, with curl this time, a script
// whose sha256 does not match what the server serves: it fails saying so,
// and installs no binary, config, token or unit.
func TestBootstrapRefusesAWrongChecksum(t *testing.T) {
	image := realparts.PodmanImage(t)
	binURL, _ := releaseServer(t)
	in := baseInput()
	in.BinaryURL = binURL
	in.BinarySHA256 = strings.Repeat("0", 64)
	scripts := t.TempDir()
	writeScript(t, scripts, "bad.sh", in)
	args := append(podmanArgs(t, image, scripts, true), "--rm", image, "/bin/sh", "-c",
		`/bin/bash /boot/bad.sh; echo "exit=$?"; ls -A /opt/dreamlake/bin /etc/dreamlake /etc/systemd/system`)
	out, err := exec.Command("podman", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("podman run: %v\n%s", err, out)
	}
	s := string(out)
	want := "checksum mismatch for " + binURL + ": got sha256 " + fmt.Sprintf("%x", sha256.Sum256([]byte(fakeNymph))) + ", want " + in.BinarySHA256
	if !strings.Contains(s, want) || !strings.Contains(s, "nothing was installed") || !strings.Contains(s, "exit=1") {
		t.Fatalf("want a failure naming the mismatch (%q), got:\n%s", want, s)
	}
	_, listing, _ := strings.Cut(s, "exit=1\n")
	if got := strings.Fields(listing); !slices.Equal(got, []string{ConfigDir + ":", "/etc/systemd/system:", "/opt/dreamlake/bin:"}) {
		t.Fatalf("the failed run left files behind:\n%s", listing)
	}
}

// fakeSystemctl stands in for systemctl on a host where systemd runs (this
// one has none running): it records each call, and is-active answers
// whether a start was recorded.
const fakeSystemctl = `#!/bin/sh
echo "$*" >> /var/lib/fake-systemctl-calls
case "$1" in
is-active) [ -f /run/fake-unit-active ]; exit $? ;;
enable|start|restart) touch /run/fake-unit-active ;;
esac
`

// TestBootstrapUnderSystemd runs the script where /run/systemd/system
// exists, with an enrollment token and a CA: it installs the unit, enables
// and starts it, reloads systemd only when the unit changed and restarts
// nymph only when its files changed.
func TestBootstrapUnderSystemd(t *testing.T) {
	image := realparts.PodmanImage(t)
	binURL, sum := releaseServer(t)
	in := baseInput()
	in.BinaryURL, in.BinarySHA256 = binURL, sum
	in.Enroll, in.Token, in.CAPEM = true, "dle_first", testCA
	in.MachineID = "01JWORKERID"
	scripts := t.TempDir()
	writeScript(t, scripts, "first.sh", in)
	in.Token = "dle_second"
	writeScript(t, scripts, "second.sh", in)
	if err := os.WriteFile(filepath.Join(scripts, "systemctl"), []byte(fakeSystemctl), 0o755); err != nil {
		t.Fatal(err)
	}
	c := startContainer(t, image, scripts, "sleep", "2147483647")
	c.must("sh", "-c", "mkdir -p /run/systemd/system && ln -s /boot/systemctl /bin/systemctl")
	run := func(script string) []string {
		t.Helper()
		out := c.must("/bin/bash", script)
		if !strings.Contains(out, "nymph runs as the systemd unit "+UnitName) {
			t.Errorf("%s said:\n%s", script, out)
		}
		calls := c.lines("/var/lib/fake-systemctl-calls")
		c.must("rm", "-f", "/var/lib/fake-systemctl-calls")
		return calls
	}
	isActive, enable := "is-active --quiet "+UnitName, "enable --now "+UnitName
	for _, step := range []struct {
		script string
		want   []string
	}{
		{"/boot/first.sh", []string{"daemon-reload", isActive, enable}},
		{"/boot/first.sh", []string{isActive, enable}},                         // nothing changed
		{"/boot/second.sh", []string{isActive, enable, "restart " + UnitName}}, // a new token
	} {
		if got := run(step.script); !slices.Equal(got, step.want) {
			t.Errorf("%s: systemctl calls %q, want %q", step.script, got, step.want)
		}
	}
	for path, want := range map[string]string{EnrollTokenPath: "600", CAPath: "644", UnitPath: "644", ConfigPath: "644"} {
		if got := strings.TrimSpace(c.must("stat", "-c", "%a", path)); got != want {
			t.Errorf("%s: mode %s, want %s", path, got, want)
		}
	}
	if got := c.must("cat", EnrollTokenPath); got != "dle_second\n" {
		t.Errorf("enroll token file: %q", got)
	}
	if _, err := c.exec("test", "-e", TokenPath); err == nil {
		t.Errorf("%s exists beside the enrollment token", TokenPath)
	}
	cfg := loadConfig(t, c)
	if !cfg.Identity.Enabled || cfg.Identity.EnrollTokenFile != EnrollTokenPath || cfg.Identity.KeyFile != KeyPath ||
		cfg.Server.TokenFile != "" || cfg.Server.CAFile != CAPath || cfg.Daemon.MachineID != "01JWORKERID" {
		t.Errorf("config: %+v %+v %+v", cfg.Server, cfg.Identity, cfg.Daemon)
	}
	if got := c.must("cat", CAPath); got != testCA {
		t.Errorf("ca file: %q", got)
	}
}
