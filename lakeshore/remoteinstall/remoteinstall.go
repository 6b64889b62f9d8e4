// Package remoteinstall renders what `lakeshore daemon install` runs on a
// remote host over ssh: the layout of one launch directory, nymph's config
// file for it, and the POSIX sh scripts that create the directory and probe
// the host, fetch and check the binary, write the secrets, start the daemon
// detached (setsid nohup) or under sbatch, and report on it afterwards.
//
// Everything here is text: the caller decides how the scripts reach the
// host (they are written for `sh -s`, read from standard input, so secrets
// never appear in a remote argv). Scripts report through lines that start
// with Marker, so whatever a remote shell's startup files print around
// them is ignored.
package remoteinstall

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"nymph/config"
)

// Marker starts every line a script prints for the caller to read, as
// "<Marker>key=value".
const Marker = "@@lakeshore "

// DefaultBaseDir is where launch directories go when no other base is
// given; "~" is the remote user's $HOME.
const DefaultBaseDir = "~/.nymph"

// JobNamePrefix starts the sbatch job name; the launch id follows.
const JobNamePrefix = "lakeshore-nymph-"

// probedTools are the programs the probe looks for on the remote host.
const probedTools = "rsync curl wget setsid nohup sbatch squeue sha256sum"

// Layout names the files of one launch directory on the remote host.
type Layout struct {
	// Dir is the launch directory, absolute (as the probe reported it).
	Dir string
}

func (l Layout) file(name string) string { return path.Join(l.Dir, name) }

// Binary is the nymph executable.
func (l Layout) Binary() string { return l.file("nymph") }

// Partial is where the binary lands, copied or downloaded; SetupScript
// checks it and renames it over Binary.
func (l Layout) Partial() string { return l.file("nymph.part") }

// Config is nymph's TOML config.
func (l Layout) Config() string { return l.file("nymph.toml") }

// TokenFile holds the daemon bearer token.
func (l Layout) TokenFile() string { return l.file("token") }

// Log receives nymph's standard output and error.
func (l Layout) Log() string { return l.file("nymph.log") }

// Workdir is nymph's [runtime] workdir.
func (l Layout) Workdir() string { return l.file("work") }

// PIDFile holds the daemon's process id (setsid nohup launches).
func (l Layout) PIDFile() string { return l.file("nymph.pid") }

// JobFile holds the SLURM job id (sbatch launches).
func (l Layout) JobFile() string { return l.file("slurm-job-id") }

// BatchScript is the job script handed to sbatch.
func (l Layout) BatchScript() string { return l.file("nymph.sbatch") }

// Spec is what the daemon is told about itself.
type Spec struct {
	LaunchID  string
	Label     string
	ServerURL string
	// Tags are "key=value" strings, as the daemon reports them.
	Tags []string
	// Runners are the runner kinds; the first is the default.
	Runners    []string
	KeepAliveS int
}

// RenderConfig returns nymph's config file for spec in layout l: nymph's
// own config struct, defaults and all, encoded, so the keys cannot drift
// from what nymph reads.
func RenderConfig(l Layout, s Spec) (string, error) {
	if l.Dir == "" || !path.IsAbs(l.Dir) {
		return "", fmt.Errorf("launch directory %q: must be an absolute path", l.Dir)
	}
	if s.ServerURL == "" {
		return "", errors.New("server url: must not be empty")
	}
	if s.Label == "" {
		return "", errors.New("label: must not be empty")
	}
	if len(s.Runners) == 0 {
		return "", errors.New("runners: at least one runner kind is needed")
	}
	c := config.Default()
	c.Server.URL, c.Server.TokenFile = s.ServerURL, l.TokenFile()
	c.Daemon.Label, c.Daemon.Tags = s.Label, append(c.Daemon.Tags, s.Tags...)
	c.Runtime.DefaultRunner, c.Runtime.Runners = s.Runners[0], s.Runners
	c.Runtime.Workdir, c.Runtime.KeepAliveS = l.Workdir(), s.KeepAliveS
	// The log is a file nobody watches live: JSON keeps it greppable.
	c.Log.Format = "json"
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# Written by `lakeshore daemon install`, launch %s.\n", s.LaunchID)
	if err := toml.NewEncoder(&buf).Encode(c); err != nil {
		return "", fmt.Errorf("render config: %w", err)
	}
	return buf.String(), nil
}

// Quote makes s one word for a POSIX shell.
func Quote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Exports renders `export K=V` lines for env, in the order given.
func Exports(env [][2]string) string {
	var b strings.Builder
	for _, kv := range env {
		fmt.Fprintf(&b, "export %s=%s\n", kv[0], Quote(kv[1]))
	}
	return b.String()
}

// ValidEnvName reports whether name can be exported by a POSIX shell.
func ValidEnvName(name string) bool {
	if name == "" || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	for _, r := range name {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// ProbeScript creates the launch directory launchID under base (a leading
// "~" is the remote $HOME; a relative base is relative to it, where ssh
// starts) with mode 0700, and reports it as dir=, the machine as arch=
// (uname -m) and each tool found as has=.
func ProbeScript(base, launchID string) string {
	return `set -eu
umask 077
base=` + Quote(base) + `
case $base in
"~") base=$HOME ;;
"~/"*) base=$HOME/${base#"~/"} ;;
/*) ;;
*) base=$HOME/$base ;;
esac
mkdir -p -- "$base/"` + Quote(launchID) + `
cd -- "$base/"` + Quote(launchID) + `
chmod 700 .
printf '` + Marker + `dir=%s\n' "$(pwd)"
printf '` + Marker + `arch=%s\n' "$(uname -m)"
for t in ` + probedTools + `; do
	if command -v "$t" >/dev/null 2>&1; then printf '` + Marker + `has=%s\n' "$t"; fi
done
`
}

// Probe is what ProbeScript reported.
type Probe struct {
	Dir   string
	Arch  string
	Tools map[string]bool
}

// ParseProbe reads ProbeScript's output.
func ParseProbe(out string) (Probe, error) {
	p := Probe{Tools: map[string]bool{}}
	for k, v := range Fields(out) {
		switch k {
		case "dir":
			p.Dir = v
		case "arch":
			p.Arch = v
		case "has":
			p.Tools[v] = true
		}
	}
	switch {
	case p.Dir == "":
		return p, errors.New("the probe did not report the launch directory")
	case !path.IsAbs(p.Dir):
		return p, fmt.Errorf("the probe reported a relative launch directory %q", p.Dir)
	case p.Arch == "":
		return p, errors.New("the probe did not report the machine architecture (uname -m)")
	}
	return p, nil
}

// Fields yields the key=value pairs of the Marker lines in out, in order.
func Fields(out string) func(yield func(k, v string) bool) {
	return func(yield func(k, v string) bool) {
		for line := range strings.Lines(out) {
			rest, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), Marker)
			if !ok {
				continue
			}
			k, v, _ := strings.Cut(rest, "=")
			if !yield(k, v) {
				return
			}
		}
	}
}

// Download is where Setup fetches the binary from, for a launch without a
// copied binary. SHA256, when set, must match; otherwise the URL's .sha256
// sidecar is checked when the server has one.
type Download struct {
	URL    string
	SHA256 string
}

// Start chooses how Setup starts the daemon.
type Start struct {
	// Slurm submits the daemon as a batch job instead of setsid nohup.
	Slurm     bool
	Partition string
	// Env is exported before the daemon (and sbatch) starts, in order.
	Env [][2]string
}

// SetupInput is everything SetupScript writes and runs.
type SetupInput struct {
	Layout   Layout
	LaunchID string
	// Download is nil when the binary was copied to Layout.Partial().
	Download *Download
	Token    string
	Config   string
	Start    Start
}

const (
	tokenEOF  = "LAKESHORE_TOKEN_EOF"
	configEOF = "LAKESHORE_CONFIG_EOF"
)

// Exit codes of SetupScript that the caller explains.
const (
	ExitNoDownloader = 40 // neither curl nor wget
	ExitDownload     = 41 // the download failed
	ExitChecksum     = 42 // the binary does not match its sha256
	ExitBadBinary    = 43 // `nymph version` failed
	ExitStart        = 44 // setsid nohup or sbatch failed
)

// SetupScript fetches the binary (when in.Download is set), checks it runs
// (version=), writes the token and config files with mode 0600 and starts
// the daemon, reporting pid= or job=.
func SetupScript(in SetupInput) (string, error) {
	if strings.Contains("\n"+in.Token+"\n", "\n"+tokenEOF+"\n") || strings.ContainsAny(in.Token, "\n\r") || in.Token == "" {
		return "", errors.New("token: must be one non-empty line")
	}
	if strings.Contains("\n"+in.Config, "\n"+configEOF+"\n") {
		return "", errors.New("config: contains the heredoc delimiter")
	}
	for _, kv := range in.Start.Env {
		if !ValidEnvName(kv[0]) {
			return "", fmt.Errorf("remote environment: %q is not a valid variable name", kv[0])
		}
	}
	l := in.Layout
	var b strings.Builder
	b.WriteString("set -eu\numask 077\n")
	b.WriteString("cd -- " + Quote(l.Dir) + "\n")
	b.WriteString(Exports(in.Start.Env))
	if d := in.Download; d != nil {
		b.WriteString(downloadScript(l, *d))
	}
	fmt.Fprintf(&b, `chmod 755 %[1]s
mv -f %[1]s %[2]s
if ! v=$(%[2]s version 2>&1); then
	printf 'the nymph binary does not run on this host: %%s\n' "$v" >&2
	exit %[3]d
fi
case $v in
"nymph "*) ;;
*)
	printf 'the binary is not nymph: its "version" printed %%s\n' "$v" >&2
	exit %[3]d
	;;
esac
printf '%[4]sversion=%%s\n' "$v"
`, Quote(l.Partial()), Quote(l.Binary()), ExitBadBinary, Marker)
	fmt.Fprintf(&b, "cat > %s <<'%s'\n%s\n%s\n", Quote(l.TokenFile()), tokenEOF, in.Token, tokenEOF)
	cfg := in.Config
	if !strings.HasSuffix(cfg, "\n") {
		cfg += "\n"
	}
	fmt.Fprintf(&b, "cat > %s <<'%s'\n%s%s\n", Quote(l.Config()), configEOF, cfg, configEOF)
	fmt.Fprintf(&b, "chmod 600 %s %s\nmkdir -p %s\n", Quote(l.TokenFile()), Quote(l.Config()), Quote(l.Workdir()))
	if in.Start.Slurm {
		b.WriteString(sbatchStart(l, in.LaunchID, in.Start.Partition))
	} else {
		b.WriteString(StartCommand(l))
	}
	return b.String(), nil
}

func downloadScript(l Layout, d Download) string {
	return fmt.Sprintf(`url=%[1]s
part=%[2]s
fetch() {
	if command -v curl >/dev/null 2>&1; then
		curl -fsSL --retry 3 -o "$2" "$1"
	elif command -v wget >/dev/null 2>&1; then
		wget -q -O "$2" "$1"
	else
		echo "neither curl nor wget is installed on this host; install one or use --binary" >&2
		exit %[3]d
	fi
}
if ! fetch "$url" "$part"; then
	echo "download of $url failed" >&2
	exit %[4]d
fi
want=%[5]s
if [ -z "$want" ] && fetch "$url.sha256" "$part.sha256" 2>/dev/null; then
	want=$(awk 'NR == 1 { print $1 }' "$part.sha256")
fi
rm -f "$part.sha256"
if [ -n "$want" ]; then
	if command -v sha256sum >/dev/null 2>&1; then
		got=$(sha256sum "$part" | awk '{ print $1 }')
	else
		got=$(openssl dgst -sha256 -r "$part" | awk '{ print $1 }')
	fi
	if [ "$got" != "$want" ]; then
		echo "checksum mismatch for $url: got $got, want $want" >&2
		rm -f "$part"
		exit %[6]d
	fi
	printf '%[7]ssha256=%%s\n' "$got"
fi
`, Quote(d.URL), Quote(l.Partial()), ExitNoDownloader, ExitDownload, Quote(d.SHA256), ExitChecksum, Marker)
}

// StartCommand starts the daemon in a session of its own, immune to the
// ssh connection closing, with every standard stream redirected so that
// ssh returns at once; it records the pid and reports pid=.
func StartCommand(l Layout) string {
	return fmt.Sprintf(`if command -v setsid >/dev/null 2>&1; then
	setsid nohup %[1]s run --config %[2]s > %[3]s 2>&1 < /dev/null &
else
	nohup %[1]s run --config %[2]s > %[3]s 2>&1 < /dev/null &
fi
pid=$!
echo "$pid" > %[4]s
printf '%[5]spid=%%s\n' "$pid"
`, Quote(l.Binary()), Quote(l.Config()), Quote(l.Log()), Quote(l.PIDFile()), Marker)
}

// JobName is the sbatch job name of a launch.
func JobName(launchID string) string { return JobNamePrefix + launchID }

// BatchScript is the job script of a launch: it records the pid on the
// node that runs the job and replaces itself with the daemon. Its comment
// shows the sbatch command that submits it, to resubmit by hand.
func BatchScript(l Layout, launchID, partition string) string {
	return fmt.Sprintf(`#!/bin/sh
# Submitted by lakeshore daemon install as:
#   sbatch %[1]s %[2]s
echo "$$" > %[3]s
exec %[4]s run --config %[5]s
`, quoteAll(SbatchArgs(l, launchID, partition)), Quote(l.BatchScript()), Quote(l.PIDFile()), Quote(l.Binary()), Quote(l.Config()))
}

// SbatchArgs are the sbatch arguments of a launch (without the script).
func SbatchArgs(l Layout, launchID, partition string) []string {
	args := []string{"--parsable", "--job-name=" + JobName(launchID), "--chdir=" + l.Dir,
		"--output=" + l.Log(), "--open-mode=append"}
	if partition != "" {
		args = append(args, "--partition="+partition)
	}
	return args
}

func quoteAll(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = Quote(a)
	}
	return strings.Join(q, " ")
}

// sbatchStart writes the job script and submits it. sbatch's warnings go
// to a file of their own so that standard output is the job id alone
// ("id" or "id;cluster" under --parsable).
func sbatchStart(l Layout, launchID, partition string) string {
	return fmt.Sprintf(`cat > %[1]s <<'LAKESHORE_SBATCH_EOF'
%[2]sLAKESHORE_SBATCH_EOF
chmod 700 %[1]s
if ! out=$(sbatch %[3]s %[1]s 2>%[4]s); then
	printf 'sbatch failed: %%s\n' "$(cat %[4]s)" >&2
	exit %[5]d
fi
job=$(printf '%%s\n' "$out" | tail -n 1)
job=${job%%%%;*}
echo "$job" > %[6]s
printf '%[7]sjob=%%s\n' "$job"
`, Quote(l.BatchScript()), BatchScript(l, launchID, partition), quoteAll(SbatchArgs(l, launchID, partition)),
		Quote(l.file("sbatch.err")), ExitStart, Quote(l.JobFile()), Marker)
}

// StatusScript reports whether the daemon still runs (state=running, or
// state=exited) and then the last lines of its log after a line "---".
func StatusScript(l Layout, slurm bool, env [][2]string, lines int) string {
	check := fmt.Sprintf(`if [ -f %[1]s ] && kill -0 "$(cat %[1]s)" 2>/dev/null; then state=running; else state=exited; fi
`, Quote(l.PIDFile()))
	if slurm {
		// The job may run on another node: ask the scheduler. An unknown
		// state (squeue unreachable) counts as running, so the wait goes on.
		check = fmt.Sprintf(`state=running
if [ -f %[1]s ]; then
	job=$(cat %[1]s)
	if s=$(squeue -h -j "$job" -o %%T 2>/dev/null); then
		case $s in ""|COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED) state=exited ;; esac
	fi
fi
`, Quote(l.JobFile()))
	}
	return Exports(env) + check + fmt.Sprintf(`printf '%[1]sstate=%%s\n' "$state"
echo ---
tail -n %[2]s %[3]s 2>/dev/null || echo "(no log at "%[3]s")"
`, Marker, strconv.Itoa(lines), Quote(l.Log()))
}

// ParseStatus splits StatusScript's output into the state and the log tail.
func ParseStatus(out string) (state, tail string) {
	for k, v := range Fields(out) {
		if k == "state" {
			state = v
		}
	}
	if _, after, ok := strings.Cut(out, "\n---\n"); ok {
		tail = after
	} else if rest, ok := strings.CutPrefix(out, "---\n"); ok {
		tail = rest
	}
	return state, tail
}

// RemoveScript deletes the launch directory (a failed launch cleans up).
func RemoveScript(l Layout) string {
	return "rm -rf -- " + Quote(l.Dir) + "\n"
}

// StopHint is a command an operator can paste to stop the daemon. ssh is
// the ssh command line that reached the host, up to and including its
// alias (the program, -F and any other option the install used); env is
// what the install exported on the host, which scancel may need as sbatch
// did (PATH, SLURM_CONF).
func StopHint(ssh []string, l Layout, jobID string, env [][2]string) string {
	remote := "kill $(cat " + Quote(l.PIDFile()) + ")"
	if jobID != "" {
		var b strings.Builder
		for _, kv := range env {
			fmt.Fprintf(&b, "export %s=%s; ", kv[0], Quote(kv[1]))
		}
		remote = b.String() + "scancel " + Quote(jobID)
	}
	return quoteAll(ssh) + " " + Quote(remote)
}
