// Package bootstrap renders what a provider-launched instance runs first,
// as root: a bash script (ec2 user data, the podman entrypoint, the script
// provider's request) that runs the operator's --bootstrap-script, installs
// a published nymph release after checking its sha256, writes nymph's
// config and token, and starts nymph under systemd (the unit is Unit) or,
// where systemd is not running (a container), under a restart loop in the
// foreground.
//
// The script converges: a second run on the same machine rewrites only
// what differs, restarts nymph only when something did, and never starts
// a second unit or loop. Everything it says goes to its standard output
// and error, which is the instance's launch log (console, podman logs).
//
// Secrets (the token, the operator's script) reach the files through
// quoted heredocs, never a command line.
package bootstrap

import (
	"bytes"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"nymph/config"
	"nymph/lakeshore/remoteinstall"
	"nymph/messages"
)

// Where the script puts things on the instance.
const (
	BinaryPath      = "/opt/dreamlake/bin/nymph"
	ConfigDir       = "/etc/dreamlake"
	ConfigPath      = ConfigDir + "/udf-daemon.toml"
	TokenPath       = ConfigDir + "/token"
	EnrollTokenPath = ConfigDir + "/enroll-token"
	CAPath          = ConfigDir + "/ca.pem"
	// DataDir holds nymph's state: its workdir (outbox, job journal, run
	// directories), its identity key, and the operator's script.
	DataDir        = "/var/lib/dreamlake"
	WorkDir        = DataDir + "/work"
	KeyPath        = DataDir + "/identity.key"
	PreScriptPath  = DataDir + "/bootstrap-script"
	UnitName       = "dreamlake-nymph.service"
	UnitPath       = "/etc/systemd/system/" + UnitName
	RunDir         = "/run/dreamlake"
	LoopPIDPath    = RunDir + "/loop.pid"
	NymphPIDPath   = RunDir + "/nymph.pid"
	restartDelayS  = 2
	downloadTries  = 5
	heredocPrefix  = "LAKESHORE_EOF"
	logPrefix      = "bootstrap: "
	scriptShebang  = "#!/bin/bash\n"
	maxScriptBytes = 1 << 20
)

// Input is what one daemon's bootstrap is rendered from.
type Input struct {
	// ServerURL is how the daemon reaches the control plane.
	ServerURL string
	// CAPEM, when set, is the PEM the daemon trusts for ServerURL (nymph's
	// [server] ca_file); curl and GNU wget also use it for the download.
	CAPEM string
	// BinaryURL and BinarySHA256 name a published nymph release for the
	// instance's machine. The sha256 is required: it is what makes the
	// download trustworthy even through a downloader (busybox wget) that
	// checks no certificate.
	BinaryURL    string
	BinarySHA256 string
	// Token is the daemon's bearer. With Enroll it is an enrollment token
	// instead (dle_…): nymph then runs with [identity] enabled, creates its
	// key under DataDir and presents the token on its first hello.
	Token  string
	Enroll bool
	// MachineID is nymph's [daemon] machine_id; empty is "auto", the
	// hostname, which containers on the host network share with the host
	// (the control plane tells daemons apart by machine id and label).
	MachineID string
	Label     string
	Tags      []string
	// Queues are the queues the daemon joins (nymph's [daemon] lanes);
	// empty is the default queue.
	Queues []string
	// Runners are the runner kinds; the first is the default. Empty is
	// nymph's default (process).
	Runners    []string
	KeepAliveS int
	// PreScript is the operator's --bootstrap-script text, run as root
	// before nymph is installed; one that starts with "#!" is executed,
	// any other is run by bash.
	PreScript string
}

// Render returns the bootstrap script for in, or an error naming the
// first field that cannot be rendered.
func Render(in Input) (string, error) {
	if err := in.validate(); err != nil {
		return "", err
	}
	cfg, err := renderConfig(in)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(scriptShebang)
	b.WriteString("# Rendered by lakeshore: installs and starts one nymph daemon. Run as root; safe to run again.\n")
	b.WriteString(prelude)
	fmt.Fprintf(&b, "url=%s\nwant=%s\n", remoteinstall.Quote(in.BinaryURL), strings.ToLower(in.BinarySHA256))
	if in.PreScript != "" {
		run := "bash " + PreScriptPath
		if strings.HasPrefix(in.PreScript, "#!") {
			run = PreScriptPath
		}
		fmt.Fprintf(&b, "log \"running the bootstrap script\"\n%s", put(PreScriptPath, "0700", in.PreScript))
		fmt.Fprintf(&b, "rc=0\n%s </dev/null || rc=$?\n", run)
		b.WriteString("if ((rc != 0)); then die \"the bootstrap script failed with status $rc; nymph was not installed\"; fi\n")
	}
	b.WriteString("changed=0\n")
	if in.CAPEM != "" {
		b.WriteString(put(CAPath, "0644", in.CAPEM))
		fmt.Fprintf(&b, "curl_ca=(--cacert %[1]s)\nwget_ca=(--ca-certificate=%[1]s)\n", CAPath)
	} else {
		fmt.Fprintf(&b, "rm -f %s\n", CAPath)
	}
	b.WriteString(install)
	tokenFile, other := TokenPath, EnrollTokenPath
	if in.Enroll {
		tokenFile, other = EnrollTokenPath, TokenPath
	}
	b.WriteString(put(tokenFile, "0600", in.Token))
	fmt.Fprintf(&b, "rm -f %s\n", other)
	b.WriteString(put(ConfigPath, "0644", cfg))
	// The unit is installed even where systemd does not run (yet): an
	// image booted later with systemd finds it.
	b.WriteString("files_changed=$changed\nchanged=0\n")
	b.WriteString(put(UnitPath, "0644", Unit()))
	b.WriteString("unit_changed=$changed\nchanged=$((changed | files_changed))\n")
	b.WriteString(start)
	return b.String(), nil
}

// Unit is the systemd unit that runs nymph where systemd runs.
func Unit() string {
	return fmt.Sprintf(`[Unit]
Description=Dreamlake nymph daemon
After=network-online.target
Wants=network-online.target
# Never give up restarting: a daemon that cannot reach the control plane
# for a while must come back by itself.
StartLimitIntervalSec=0

[Service]
Type=simple
ExecStart=%s run --config %s
WorkingDirectory=%s
Restart=always
RestartSec=%d
# nymph stops its running jobs itself within shutdown_grace_s (30 s):
# signal only nymph first, and everything left after that.
KillMode=mixed
TimeoutStopSec=45

[Install]
WantedBy=multi-user.target
`, BinaryPath, ConfigPath, DataDir, restartDelayS)
}

// renderConfig is nymph's config file for in: nymph's own config struct,
// defaults and all, encoded (as remoteinstall.RenderConfig does for ssh
// installs), so the keys cannot drift from what nymph reads.
func renderConfig(in Input) (string, error) {
	c := config.Default()
	c.Server.URL = in.ServerURL
	if in.CAPEM != "" {
		c.Server.CAFile = CAPath
	}
	c.Identity.KeyFile = KeyPath
	if in.Enroll {
		c.Identity.Enabled, c.Identity.EnrollTokenFile = true, EnrollTokenPath
	} else {
		c.Server.TokenFile = TokenPath
	}
	if in.MachineID != "" {
		c.Daemon.MachineID = in.MachineID
	}
	c.Daemon.Label = in.Label
	c.Daemon.Tags = append(c.Daemon.Tags, in.Tags...)
	c.Daemon.Lanes = append(c.Daemon.Lanes, in.Queues...)
	if len(in.Runners) > 0 {
		c.Runtime.DefaultRunner, c.Runtime.Runners = in.Runners[0], in.Runners
	}
	c.Runtime.Workdir, c.Runtime.KeepAliveS = WorkDir, in.KeepAliveS
	var buf bytes.Buffer
	buf.WriteString("# Written by the lakeshore bootstrap; a re-run of the bootstrap replaces it.\n")
	if err := toml.NewEncoder(&buf).Encode(c); err != nil {
		return "", fmt.Errorf("bootstrap: render config: %w", err)
	}
	return buf.String(), nil
}

func (in Input) validate() error {
	if u, err := url.Parse(in.ServerURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("bootstrap: server url: must be an http:// or https:// URL with a host, got %q", in.ServerURL)
	}
	if u, err := url.Parse(in.BinaryURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("bootstrap: binary url: must be an http:// or https:// URL with a host, got %q", in.BinaryURL)
	}
	if b, err := hex.DecodeString(in.BinarySHA256); err != nil || len(b) != 32 {
		return fmt.Errorf("bootstrap: binary sha256: must be 64 hex digits, got %q", in.BinarySHA256)
	}
	if in.Token == "" || strings.ContainsFunc(in.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return errors.New("bootstrap: token: must be one non-empty word")
	}
	if in.CAPEM != "" {
		if blk, _ := pem.Decode([]byte(in.CAPEM)); blk == nil {
			return errors.New("bootstrap: ca pem: holds no PEM block")
		}
	}
	if in.MachineID != "" && strings.TrimSpace(in.MachineID) == "" {
		return errors.New("bootstrap: machine id: must not be blank (leave it empty for the hostname)")
	}
	if strings.TrimSpace(in.Label) == "" {
		return errors.New("bootstrap: label: must not be empty")
	}
	for _, l := range []struct {
		name string
		list []string
	}{{"tags", in.Tags}, {"queues", in.Queues}} {
		for i, v := range l.list {
			if strings.TrimSpace(v) == "" {
				return fmt.Errorf("bootstrap: %s: entry %d is empty", l.name, i)
			}
		}
	}
	for _, r := range in.Runners {
		if !slices.Contains(messages.RunnerKinds, r) {
			return fmt.Errorf("bootstrap: runners: unknown runner kind %q (known: %s)", r, strings.Join(messages.RunnerKinds, ", "))
		}
	}
	if in.KeepAliveS < -1 {
		return fmt.Errorf("bootstrap: keep alive: must be -1 (pool), 0 (single job) or a number of seconds, got %d", in.KeepAliveS)
	}
	for _, s := range []struct{ name, v string }{{"machine id", in.MachineID}, {"label", in.Label}, {"ca pem", in.CAPEM}, {"bootstrap script", in.PreScript}} {
		if strings.ContainsRune(s.v, 0) {
			return fmt.Errorf("bootstrap: %s: contains a NUL byte", s.name)
		}
	}
	if len(in.PreScript) > maxScriptBytes {
		return fmt.Errorf("bootstrap: bootstrap script: %d bytes, more than the %d a bootstrap carries", len(in.PreScript), maxScriptBytes)
	}
	return nil
}

// put is the shell that writes text to path with mode through `put`
// (see prelude), in a quoted heredoc whose delimiter is no line of text.
func put(path, mode, text string) string {
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	delim := heredocPrefix
	for n := 1; strings.Contains("\n"+text, "\n"+delim+"\n"); n++ {
		delim = fmt.Sprintf("%s_%d", heredocPrefix, n)
	}
	return fmt.Sprintf("put %s %s <<'%s'\n%s%s\n", remoteinstall.Quote(path), mode, delim, text, delim)
}

// prelude is the start of every script: strict mode, private files, the
// helpers, and the directories.
var prelude = `set -euo pipefail
umask 077

log() { printf '` + logPrefix + `%s\n' "$*"; }
die() {
	printf '` + logPrefix + `error: %s\n' "$*" >&2
	exit 1
}

# sha256 FILE prints the file's hex sha256.
sha256() {
	local sum rest
	read -r sum rest < <(sha256sum "$1")
	printf '%s\n' "$sum"
}

# put PATH MODE writes standard input to PATH with MODE, atomically, and
# only when the content differs (then changed=1).
put() {
	local tmp
	tmp=$(mktemp "$1.XXXXXX")
	cat >"$tmp"
	chmod "$2" "$tmp"
	if [[ -f $1 && $(sha256 "$tmp") == "$(sha256 "$1")" ]]; then
		rm -f "$tmp"
		chmod "$2" "$1"
		return 0
	fi
	mv -f "$tmp" "$1"
	changed=1
}

# starttime PID prints the process's start time (field 22 of its stat),
# which tells a live process from a later one that reused its pid.
starttime() {
	local stat fields
	stat=$(<"/proc/$1/stat") || return 1
	read -ra fields <<<"${stat##*) }"
	printf '%s\n' "${fields[19]}"
}

# alive FILE succeeds when FILE names a process ("pid starttime") that
# still runs, and sets pid to it.
alive() {
	local st
	pid=""
	[[ -f $1 ]] || return 1
	read -r pid st <"$1" || true
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[[ $(starttime "$pid" 2>/dev/null) == "$st" ]]
}

if ((EUID != 0)); then die "must run as root (uid $EUID)"; fi
command -v sha256sum >/dev/null 2>&1 || die "sha256sum is not installed; install it in the bootstrap script"
mkdir -p ` + strings.Join([]string{"/opt/dreamlake/bin", ConfigDir, WorkDir, "/etc/systemd/system", RunDir}, " ") + `
chmod 755 /opt/dreamlake /opt/dreamlake/bin ` + ConfigDir + `
chmod 700 ` + DataDir + `
curl_ca=()
wget_ca=()
`

// install downloads and installs the binary unless the installed one is
// already the release ($url, $want). Nothing is installed on a failure.
var install = fmt.Sprintf(`# fetch URL FILE downloads with curl, GNU wget or busybox wget, retrying.
fetch() {
	local try
	for ((try = 1; try <= %[1]d; try++)); do
		if command -v curl >/dev/null 2>&1; then
			curl -fsSL --connect-timeout 10 "${curl_ca[@]}" -o "$2" "$1" && return 0
		elif ! command -v wget >/dev/null 2>&1; then
			die "neither curl nor wget is installed; install one in the bootstrap script"
		elif wget --version 2>/dev/null | grep 'GNU Wget' >/dev/null; then
			wget -q -T 30 "${wget_ca[@]}" -O "$2" "$1" && return 0
		else
			# busybox: no certificate to check against, and no -T
			# (busybox 1.35's wget crashes on it); the sha256 check stands.
			wget -q -O "$2" "$1" && return 0
		fi
		log "download of $1 failed (attempt $try of %[1]d)"
		if ((try < %[1]d)); then sleep "$try"; fi
	done
	return 1
}
part=""
cleanup() {
	if [[ -n $part ]]; then rm -f "$part"; fi
}
trap cleanup EXIT
if [[ -f %[2]s && $(sha256 %[2]s) == "$want" ]]; then
	log "nymph $want is already installed"
else
	log "downloading nymph from $url"
	part=$(mktemp %[2]s.XXXXXX)
	fetch "$url" "$part" || die "download of $url failed; nothing was installed"
	got=$(sha256 "$part")
	if [[ $got != "$want" ]]; then
		die "checksum mismatch for $url: got sha256 $got, want $want; nothing was installed"
	fi
	chmod 755 "$part"
	if ! v=$("$part" version </dev/null 2>&1); then
		die "the downloaded nymph does not run on this $(uname -m) host: $v"
	fi
	mv -f "$part" %[2]s
	part=""
	changed=1
	log "installed $v at %[2]s"
fi
`, downloadTries, BinaryPath)

// start runs nymph: through systemd when it is running, otherwise in a
// restart loop that this script becomes (a container's main process), or,
// when such a loop already runs, by restarting its nymph if anything
// changed.
var start = fmt.Sprintf(`if [[ -d /run/systemd/system ]]; then
	if ((unit_changed)); then systemctl daemon-reload; fi
	active=0
	if systemctl is-active --quiet %[1]s; then active=1; fi
	systemctl enable --now %[1]s
	if ((changed && active)); then
		log "restarting nymph: its binary, config or token changed"
		systemctl restart %[1]s
	fi
	log "nymph runs as the systemd unit %[1]s"
	exit 0
fi
claim() { (set -C && printf '%%s %%s\n' "$$" "$(starttime "$$")" >%[2]s) 2>/dev/null; }
if ! claim; then
	if alive %[2]s; then
		if ((changed == 0)); then
			log "nymph is already supervised by this bootstrap's loop; nothing changed"
		elif alive %[3]s; then
			log "restarting nymph (pid $pid) under the running loop: its binary, config or token changed"
			kill -TERM "$pid"
		else
			log "nymph is between two starts of its loop: the next one picks up the changes"
		fi
		exit 0
	fi
	rm -f %[2]s
	claim || die "another bootstrap started nymph's loop at the same time"
fi
child=""
stop() {
	log "stopping nymph"
	if [[ -n $child ]]; then
		kill -TERM "$child" 2>/dev/null || true
		wait "$child" || true
	fi
	rm -f %[2]s %[3]s
	exit 0
}
trap stop TERM INT
log "systemd is not running: supervising nymph in a restart loop"
while true; do
	%[4]s run --config %[5]s </dev/null &
	child=$!
	printf '%%s %%s\n' "$child" "$(starttime "$child" || true)" >%[3]s
	rc=0
	wait "$child" || rc=$?
	child=""
	log "nymph exited with status $rc; restarting it in %[6]d s"
	sleep %[6]d &
	wait $! || true
done
`, UnitName, LoopPIDPath, NymphPIDPath, BinaryPath, ConfigPath, restartDelayS)
