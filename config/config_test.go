package config_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"nymph/config"
	"nymph/messages"
)

func TestDefaultsFromMinimalFile(t *testing.T) {
	c, err := config.Parse("/etc/nymph/nymph.toml", []byte("[server]\nurl = \"https://cp.example:8443\"\n"), "/home/u")
	if err != nil {
		t.Fatal(err)
	}
	want := config.Default()
	want.Path = "/etc/nymph/nymph.toml"
	want.Server.URL = "https://cp.example:8443"
	want.Runtime.Workdir = "/home/u/.nymph/work"
	want.Identity.KeyFile = "/home/u/.nymph/identity.key"
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("got  %+v\nwant %+v", *c, want)
	}
	if c.Poll.WaitMaxS != 20 || c.Poll.RetryMinS != 1 || c.Poll.RetryMaxS != 60 {
		t.Fatalf("poll defaults: %+v", c.Poll)
	}
	if c.Runtime.KeepAliveS != -1 || c.Runtime.ShutdownGraceS != 30 || c.Runtime.DefaultRunner != "process" ||
		c.Runtime.AutoUpdate || c.Runtime.AutoUpdateCheckIntervalS != 3600 || c.Runtime.MaxInvocations != 0 ||
		c.Runtime.MaxProcs != 1 || c.Runtime.TimerSlackUS != 1000 {
		t.Fatalf("runtime defaults: %+v", c.Runtime)
	}
	if c.Daemon.MachineID != "auto" || c.Log.Level != "info" || c.Log.Format != "auto" {
		t.Fatalf("daemon/log defaults: %+v %+v", c.Daemon, c.Log)
	}
}

func TestEverySection(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src := `
[server]
url = "http://127.0.0.1:9000"
token_file = "token"

[daemon]
machine_id = "m1"
label = "gpu box"
tags = ["gpu=h100", "zone=a"]
lanes = ["training"]
queue = "training"

[poll]
wait_max_s = 5
retry_min_s = 0.5
retry_max_s = 10

[runtime]
max_invocations = 4
default_runner = "echo"
runners = ["process", "echo"]
workdir = "~/w"
keep_alive_s = 0
shutdown_grace_s = 2.5
auto_update = true
auto_update_check_interval_s = 60

[identity]
enabled = true
key_file = "keys/id.key"
enroll_token_file = "~/enroll"

[log]
level = "debug"
format = "console"
`
	c, err := config.Parse(filepath.Join(dir, "nymph.toml"), []byte(src), "/home/u")
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.TokenFile != token {
		t.Errorf("token_file = %q, want %q (relative to the config file)", c.Server.TokenFile, token)
	}
	if c.Runtime.Workdir != "/home/u/w" || c.Identity.EnrollTokenFile != "/home/u/enroll" {
		t.Errorf("~ not expanded: %q %q", c.Runtime.Workdir, c.Identity.EnrollTokenFile)
	}
	if c.Identity.KeyFile != filepath.Join(dir, "keys/id.key") {
		t.Errorf("key_file = %q", c.Identity.KeyFile)
	}
	if c.Poll.RetryMinS != 0.5 || c.Poll.WaitMaxS != 5 || c.Runtime.ShutdownGraceS != 2.5 {
		t.Errorf("numbers: %+v %+v", c.Poll, c.Runtime)
	}
	if !reflect.DeepEqual(c.Daemon.Tags, []string{"gpu=h100", "zone=a"}) || c.Daemon.Queue != "training" {
		t.Errorf("daemon: %+v", c.Daemon)
	}
	if c.Runtime.MaxInvocations != 4 || c.Runtime.KeepAliveS != 0 || !c.Runtime.AutoUpdate || !c.Identity.Enabled {
		t.Errorf("runtime: %+v identity: %+v", c.Runtime, c.Identity)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings: %v", c.Warnings)
	}
}

func TestEveryProblemReportedWithFileAndKey(t *testing.T) {
	src := `
[server]
url = "ftp://x"
token_file = "/nonexistent/token"

[daemon]
machine_id = ""
tags = "gpu"

[poll]
wait_max_s = "twenty"
retry_min_s = 5
retry_max_s = 1

[runtime]
max_invocations = -1
runners = ["process", "teleport"]
default_runner = "docker"
keep_alive_s = -5
shutdown_grace_s = -1
auto_update = "yes"
max_procs = -2
timer_slack_us = -1

[log]
level = "loud"
format = "xml"
`
	_, err := config.Parse("/cfg/nymph.toml", []byte(src), "/home/u")
	if err == nil {
		t.Fatal("want an error")
	}
	msg := err.Error()
	for _, want := range []string{
		"[server] url: must be an http:// or https:// URL",
		"[daemon] machine_id: must not be empty",
		"[daemon] tags: must be a list of strings, got string \"gpu\"",
		"[poll] wait_max_s: must be a number, got string \"twenty\"",
		"[poll] retry_max_s: must be >= retry_min_s (5), got 1",
		"[runtime] max_invocations: must be >= 0",
		"[runtime] runners: unknown runner kind \"teleport\"",
		"[runtime] default_runner: \"docker\" is not in [runtime] runners",
		"[runtime] keep_alive_s: must be -1",
		"[runtime] shutdown_grace_s: must be >= 0",
		"[runtime] auto_update: must be true or false",
		"[runtime] max_procs: must be 0 (one per CPU) or a number of processors, got -2",
		"[runtime] timer_slack_us: must be 0 (the kernel's) or a number of microseconds up to 1000000, got -1",
		"[log] level: must be one of",
		"[log] format: must be one of",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	for _, line := range strings.Split(msg, "\n") {
		if !strings.HasPrefix(line, "config /cfg/nymph.toml: ") {
			t.Errorf("line does not name the file: %q", line)
		}
	}
}

func TestMissingTokenFileIsAnError(t *testing.T) {
	_, err := config.Parse("/cfg/nymph.toml", []byte("[server]\nurl = \"http://h\"\ntoken_file = \"/nonexistent/tok\"\n"), "/h")
	if err == nil || !strings.Contains(err.Error(), "config /cfg/nymph.toml: [server] token_file: cannot read /nonexistent/tok") {
		t.Fatalf("err = %v", err)
	}
}

func TestMissingURLAndSyntaxError(t *testing.T) {
	_, err := config.Parse("/c.toml", []byte(""), "/h")
	if err == nil || !strings.Contains(err.Error(), "[server] url: is required") {
		t.Fatalf("err = %v", err)
	}
	_, err = config.Parse("/c.toml", []byte("[server\nurl="), "/h")
	if err == nil || !strings.Contains(err.Error(), "config /c.toml: toml:") {
		t.Fatalf("err = %v", err)
	}
}

func TestUnknownKeysAreWarnings(t *testing.T) {
	c, err := config.Parse("/c.toml", []byte("[server]\nurl = \"http://h\"\nurll = 1\n[extra]\nx = 1\n"), "/h")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 2 || !strings.Contains(c.Warnings[0], "[extra]: unknown section") ||
		!strings.Contains(c.Warnings[1], "[server] urll: unknown key") {
		t.Fatalf("warnings = %q", c.Warnings)
	}
}

func TestIdentityKeys(t *testing.T) {
	c, err := config.Parse("/etc/n/c.toml", []byte("[server]\nurl = \"https://h\"\n[identity]\nenabled = true\nkey_file = \"id/key\"\nenroll_token_file = \"~/enroll\"\n"), "/h")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Identity.Enabled || c.Identity.KeyFile != "/etc/n/id/key" || c.Identity.EnrollTokenFile != "/h/enroll" || len(c.Warnings) != 0 {
		t.Fatalf("%+v %q", c.Identity, c.Warnings)
	}
	_, err = config.Parse("/etc/n/c.toml", []byte("[server]\nurl = \"https://h\"\n[identity]\nenabled = true\nkey_file = \"k\"\nenroll_token_file = \"/etc/n/k\"\n"), "/h")
	if err == nil || !strings.Contains(err.Error(), "[identity] enroll_token_file: must not be the key_file") {
		t.Fatalf("same file for key and token: %v", err)
	}
	_, err = config.Parse("/c.toml", []byte("[server]\nurl = \"https://h\"\n[identity]\nenabled = true\nkey_file = \" \"\n"), "/h")
	if err == nil || !strings.Contains(err.Error(), "[identity] key_file: is required") {
		t.Fatalf("empty key_file: %v", err)
	}
	c, err = config.Parse("/c.toml", []byte("[server]\nurl = \"https://h\"\n[identity]\nenroll_token_file = \"t\"\n"), "/h")
	if err != nil || len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "[identity] enroll_token_file: set while [identity] enabled is false") {
		t.Fatalf("%v %q", err, c.Warnings)
	}
	if _, err := config.Parse("/c.toml", []byte("[server]\nurl = \"https://h\"\n[identity]\nenabled = \"yes\"\n"), "/h"); err == nil ||
		!strings.Contains(err.Error(), "[identity] enabled") {
		t.Fatalf("non-boolean enabled: %v", err)
	}
}

func TestQueueOverride(t *testing.T) {
	c, err := config.Parse("/c.toml", []byte("[server]\nurl = \"http://h\"\n[daemon]\nqueue = \"file\"\n"), "/h")
	if err != nil {
		t.Fatal(err)
	}
	c.ResolveQueue("", "")
	if c.Daemon.Queue != "file" {
		t.Fatal(c.Daemon.Queue)
	}
	c.ResolveQueue("", "env")
	if c.Daemon.Queue != "env" {
		t.Fatal(c.Daemon.Queue)
	}
	c.ResolveQueue("flag", "env")
	if c.Daemon.Queue != "flag" {
		t.Fatal(c.Daemon.Queue)
	}
}

func TestLoadReadsTheFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "n.toml")
	if err := os.WriteFile(p, []byte("[server]\nurl = \"http://h\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(p)
	if err != nil || c.Path != p {
		t.Fatalf("%v %v", c, err)
	}
	if _, err := config.Load(p + ".missing"); err == nil || !strings.Contains(err.Error(), p+".missing") {
		t.Fatalf("err = %v", err)
	}
}

func TestExpandHome(t *testing.T) {
	for in, want := range map[string]string{"~": "/h", "~/a/b": "/h/a/b", "/abs": "/abs", "~x": "~x"} {
		if got := config.ExpandHome(in, "/h"); got != want {
			t.Errorf("ExpandHome(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRunnerTables(t *testing.T) {
	src := `
[server]
url = "http://h"

[runners.process]
kill_grace_s = 1

[runners.python]
python = "~/venv/bin/python3"
kill_grace_s = 0.5

[runners.docker]
cli = "podman"
global_args = ["--runtime", "runc", "--cgroup-manager", "cgroupfs"]
run_args = ["--network=none", "--ulimit", "nofile=1024:1024"]
shell = "/bin/ash"

[runners.gvisor]
runsc = "/usr/bin/runsc"
global_args = ["--platform=systrap"]
state_root = "state"
cli = "podman"
container_global_args = ["--runtime", "/usr/bin/runsc"]
container_run_args = ["--network=none"]
kill_grace_s = 2

[runners.slurm]
srun_args = ["--partition=debug"]
env = ["SLURM_CONF=/etc/slurm/test.conf", "EMPTY="]
bin_dir = "/opt/slurm/bin"

[runners.echo]
`
	c, err := config.Parse("/cfg/nymph.toml", []byte(src), "/home/u")
	if err != nil {
		t.Fatal(err)
	}
	want := config.Runners{
		Process: config.ProcessRunner{KillGraceS: 1},
		Python:  config.PythonRunner{Python: "/home/u/venv/bin/python3", KillGraceS: 0.5},
		Docker: config.DockerRunner{CLI: "podman", GlobalArgs: []string{"--runtime", "runc", "--cgroup-manager", "cgroupfs"},
			RunArgs: []string{"--network=none", "--ulimit", "nofile=1024:1024"}, Shell: "/bin/ash", KillGraceS: 5},
		Gvisor: config.GvisorRunner{Runsc: "/usr/bin/runsc", GlobalArgs: []string{"--platform=systrap"}, StateRoot: "/cfg/state",
			CLI: "podman", ContainerGlobalArgs: []string{"--runtime", "/usr/bin/runsc"}, ContainerRunArgs: []string{"--network=none"}, KillGraceS: 2},
		Slurm: config.SlurmRunner{SrunArgs: []string{"--partition=debug"}, Env: []string{"SLURM_CONF=/etc/slurm/test.conf", "EMPTY="},
			BinDir: "/opt/slurm/bin", KillGraceS: 5},
	}
	if !reflect.DeepEqual(c.Runners, want) {
		t.Fatalf("got  %+v\nwant %+v", c.Runners, want)
	}
	if len(c.Warnings) != 0 {
		t.Fatalf("warnings: %v", c.Warnings)
	}
}

func TestRunnerTableProblems(t *testing.T) {
	src := `
[server]
url = "http://h"

[runners.python]
python = ""
kill_grace_s = 0

[runners.docker]
cli = 7
global_args = "--runtime runc"
run_args = ["--network=none", ""]

[runners.gvisor]
container_run_args = ["--network=none"]
kill_grace_s = "soon"
colour = "blue"

[runners.slurm]
env = ["SLURM_CONF", "=x", "OK=1"]
srun_args = [1]

[runners.teleport]
x = 1
`
	c, err := config.Parse("/cfg/nymph.toml", []byte(src), "/h")
	if err == nil {
		t.Fatalf("want an error, got %+v", c)
	}
	msg := err.Error()
	for _, want := range []string{
		`[runners.python] python: must not be empty`,
		`[runners.python] kill_grace_s: must be > 0 and <= 3600 seconds, got 0`,
		`[runners.docker] cli: must be a string, got integer 7`,
		`[runners.docker] global_args: must be a list of strings, got string "--runtime runc"`,
		`[runners.docker] run_args: entry 1 must be a non-empty argument`,
		`[runners.gvisor] cli: is required when container_global_args or container_run_args is set`,
		`[runners.gvisor] kill_grace_s: must be a number, got string "soon"`,
		`[runners.slurm] env: entry 0 must be KEY=VALUE, got "SLURM_CONF"`,
		`[runners.slurm] env: entry 1 must be KEY=VALUE, got "=x"`,
		`[runners.slurm] srun_args: entry 0 must be a string, got integer 1`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, `"OK=1"`) {
		t.Errorf("a good env entry reported:\n%s", msg)
	}
	for _, line := range strings.Split(msg, "\n") {
		if !strings.HasPrefix(line, "config /cfg/nymph.toml: ") {
			t.Errorf("line does not name the file: %q", line)
		}
	}

	c, err = config.Parse("/c.toml", []byte("[server]\nurl = \"http://h\"\n[runners.teleport]\nx = 1\n[runners.docker]\ncolour = 1\n"), "/h")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 2 || !strings.Contains(c.Warnings[0], "[runners.docker] colour: unknown key") ||
		!strings.Contains(c.Warnings[1], "[runners.teleport]: unknown runner kind") {
		t.Fatalf("warnings = %q", c.Warnings)
	}
	if _, err := config.Parse("/c.toml", []byte("[server]\nurl = \"http://h\"\n[runners]\ndocker = \"podman\"\n"), "/h"); err == nil ||
		!strings.Contains(err.Error(), `[runners.docker]: must be a table, got string "podman"`) {
		t.Fatalf("err = %v", err)
	}
}

// Every runner kind has its [runners.<kind>] table in Runners, and no
// table is for a kind RunnerKinds does not know.
func TestRunnersHasATablePerKind(t *testing.T) {
	var tables []string
	for f := range reflect.TypeFor[config.Runners]().Fields() {
		tables = append(tables, f.Tag.Get("toml"))
	}
	if !reflect.DeepEqual(tables, messages.RunnerKinds) {
		t.Fatalf("Runners tables %q, RunnerKinds %q", tables, messages.RunnerKinds)
	}
}

func TestUnknownKeysNamedByTheirOutermostUnknownPart(t *testing.T) {
	c, err := config.Parse("/c.toml", []byte("[server]\nurl = \"http://h\"\n[server.sub.deeper]\nx = 1\n[extra.a]\nb = 1\n"+
		"[runners.echo]\ny = 1\n[runners.teleport.z]\nq = 1\n"), "/h")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"config /c.toml: [extra]: unknown section, ignored",
		"config /c.toml: [runners.echo] y: unknown key, ignored",
		"config /c.toml: [runners.teleport]: unknown runner kind (known: process, python, docker, gvisor, slurm, echo), ignored",
		"config /c.toml: [server] sub: unknown key, ignored",
	}
	if !reflect.DeepEqual(c.Warnings, want) {
		t.Fatalf("warnings\n%q\nwant\n%q", c.Warnings, want)
	}
}

// Keys are case-sensitive: the TOML library matches struct fields ignoring
// case, so a differently cased key must still be reported unknown and not
// be taken.
func TestKeysAreCaseSensitive(t *testing.T) {
	c, err := config.Parse("/etc/nymph.toml", []byte("[server]\nURL = \"http://b\"\n[Daemon]\nlabel = \"x\"\n"), "/home/u")
	if err == nil || !strings.Contains(err.Error(), "[server] url") {
		t.Fatalf("a config with only [server] URL parsed (%v); url must still be missing", err)
	}
	c, err = config.Parse("/etc/nymph.toml", []byte("[server]\nurl = \"http://a\"\n[Daemon]\nlabel = \"x\"\n"), "/home/u")
	if err != nil {
		t.Fatal(err)
	}
	if c.Daemon.Label == "x" {
		t.Errorf("[Daemon] was taken as [daemon]")
	}
	if joined := strings.Join(c.Warnings, "\n"); !strings.Contains(joined, "[Daemon]") {
		t.Errorf("warnings %q do not name [Daemon]", c.Warnings)
	}
	_, err = config.Parse("/etc/nymph.toml", []byte("[server]\nurl = \"http://a\"\nURL = \"http://b\"\n"), "/home/u")
	if err == nil || !strings.Contains(err.Error(), `[server] url: given again as "URL"`) {
		t.Fatalf("url and URL in one table: %v, want an error naming both", err)
	}
}

func TestMetricsSection(t *testing.T) {
	c, err := config.Parse("/etc/nymph/nymph.toml", []byte(`
[server]
url = "https://cp.example:8443"

[metrics]
textfile = "textfile/nymph.prom"
interval_s = 2
`), "/home/u")
	if err != nil {
		t.Fatal(err)
	}
	// A relative path is the config file's directory's, as every other file.
	if c.Metrics.Textfile != "/etc/nymph/textfile/nymph.prom" || c.Metrics.IntervalS != 2 {
		t.Fatalf("metrics: %+v", c.Metrics)
	}
	def, err := config.Parse("/etc/nymph/nymph.toml", []byte("[server]\nurl = \"https://cp.example:8443\"\n"), "/home/u")
	if err != nil {
		t.Fatal(err)
	}
	if def.Metrics.Textfile != "" || def.Metrics.IntervalS != 5 {
		t.Fatalf("metrics defaults: %+v", def.Metrics)
	}
}

func TestMetricsProblems(t *testing.T) {
	for _, tc := range []struct {
		body, key, why string
	}{
		{`textfile = "/var/lib/node_exporter/nymph.txt"`, "[metrics] textfile", `must end in ".prom"`},
		{`textfile = "/var/lib/node_exporter/nymph"`, "[metrics] textfile", `must end in ".prom"`},
		{`textfile = "/var/lib/node_exporter/.prom"`, "[metrics] textfile", "must name a file"},
		{`interval_s = 0.5`, "[metrics] interval_s", "must be >= 1 second, got 0.5"},
		{`interval_s = 0`, "[metrics] interval_s", "must be >= 1 second"},
		{`interval_s = "5"`, "[metrics] interval_s", ""},
	} {
		_, err := config.Parse("/etc/nymph/nymph.toml", []byte("[server]\nurl = \"https://cp.example:8443\"\n[metrics]\n"+tc.body+"\n"), "/home/u")
		if err == nil {
			t.Errorf("%s: accepted", tc.body)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "/etc/nymph/nymph.toml") || !strings.Contains(msg, tc.key) || !strings.Contains(msg, tc.why) {
			t.Errorf("%s: error %q does not name the file, %s and %q", tc.body, msg, tc.key, tc.why)
		}
	}
}

// Default, encoded as lakeshore's installers write it, carries the
// [metrics] section and reads back as the same configuration.
func TestDefaultRendersMetrics(t *testing.T) {
	c := config.Default()
	c.Server.URL = "https://cp.example:8443"
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(c); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "[metrics]\n  textfile = \"\"\n  interval_s = 5.0\n") {
		t.Fatalf("no [metrics] section in:\n%s", buf.String())
	}
	back, err := config.Parse("/etc/nymph/nymph.toml", buf.Bytes(), "/home/u")
	if err != nil {
		t.Fatal(err)
	}
	if back.Metrics != c.Metrics {
		t.Fatalf("read back %+v, want %+v", back.Metrics, c.Metrics)
	}
}
