// Package hostinfo owns host detection for nymph's hello: the best-effort
// versions probe of the protocol spec (every probe that fails is nil), the
// machine id ("auto" is the hostname), the host tags merged into the
// configured ones, the runners this host can actually run, the
// provisional worker id used until the control plane assigns one, and the
// incarnation that names this daemon process.
package hostinfo

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"

	"nymph/messages"
)

// probeTimeout bounds each external command of the probe.
const probeTimeout = 5 * time.Second

// Commander runs a command and returns its standard output.
type Commander func(ctx context.Context, name string, args ...string) (string, error)

// Prober detects facts about the host. The zero value is not usable; use New.
type Prober struct {
	run      Commander
	readFile func(string) ([]byte, error)
	lookPath func(string) (string, error)
	hostname func() (string, error)
}

// Option replaces one of the Prober's windows onto the host (for tests).
type Option func(*Prober)

// WithCommander replaces how commands are run.
func WithCommander(c Commander) Option { return func(p *Prober) { p.run = c } }

// WithReadFile replaces how files such as /proc/cpuinfo are read.
func WithReadFile(f func(string) ([]byte, error)) Option { return func(p *Prober) { p.readFile = f } }

// WithLookPath replaces the PATH lookup used to tell which runners exist.
func WithLookPath(f func(string) (string, error)) Option { return func(p *Prober) { p.lookPath = f } }

// WithHostname replaces the hostname source.
func WithHostname(f func() (string, error)) Option { return func(p *Prober) { p.hostname = f } }

// New returns a Prober of the real host.
func New(opts ...Option) *Prober {
	p := &Prober{run: runCommand, readFile: os.ReadFile, lookPath: exec.LookPath, hostname: os.Hostname}
	for _, o := range opts {
		o(p)
	}
	return p
}

func runCommand(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	return string(out), err
}

// Versions runs the probe table of the spec concurrently.
func (p *Prober) Versions(ctx context.Context, daemonVersion string) messages.Versions {
	v := messages.Versions{Daemon: ptr(daemonVersion), Protocol: ptr(messages.ProtocolVersion)}
	var wg sync.WaitGroup
	probe := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	probe(func() { v.Runsc = p.firstLine(ctx, "runsc version ", "runsc", "--version") })
	probe(func() { v.Docker = p.firstLine(ctx, "", "docker", "version", "--format", "{{.Server.Version}}") })
	probe(func() {
		v.Python = p.firstLine(ctx, "", "python3", "--version")
		if v.Python == nil {
			v.Python = p.firstLine(ctx, "", "python", "--version")
		}
	})
	probe(func() { v.Kernel = p.firstLine(ctx, "", "uname", "-sr") })
	probe(func() { v.Arch = p.firstLine(ctx, "", "uname", "-m") })
	probe(func() { v.Distro = p.distro() })
	probe(func() { v.CPU = p.cpu() })
	probe(func() { v.GPU = p.gpus(ctx) })
	wg.Wait()
	return v
}

func (p *Prober) firstLine(ctx context.Context, trimPrefix, name string, args ...string) *string {
	out, err := p.run(ctx, name, args...)
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), trimPrefix))
	if line == "" {
		return nil
	}
	return &line
}

func (p *Prober) distro() *string {
	data, err := p.readFile("/etc/os-release")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME="); ok {
			if u, err := strconv.Unquote(v); err == nil {
				v = u
			} else {
				v = strings.Trim(v, `"'`)
			}
			if v == "" {
				return nil
			}
			return &v
		}
	}
	return nil
}

func (p *Prober) cpu() *messages.CPUInfo {
	data, err := p.readFile("/proc/cpuinfo")
	if err != nil {
		return nil
	}
	var info messages.CPUInfo
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(key) {
		case "processor":
			info.Cores++
		case "model name", "Model", "cpu model":
			if info.Model == "" {
				info.Model = strings.TrimSpace(val)
			}
		}
	}
	if info.Cores == 0 {
		info.Cores = uint32(runtime.NumCPU())
	}
	return &info
}

func (p *Prober) gpus(ctx context.Context) []messages.GPU {
	out, err := p.run(ctx, "nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader")
	if err != nil {
		return nil
	}
	var cuda *string
	if header, err := p.run(ctx, "nvidia-smi"); err == nil {
		if _, rest, ok := strings.Cut(header, "CUDA Version:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				v := strings.Trim(f[0], "|")
				cuda = &v
			}
		}
	}
	var gpus []messages.GPU
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		name, driver, ok := strings.Cut(line, ",")
		if !ok {
			continue
		}
		gpus = append(gpus, messages.GPU{Name: strings.TrimSpace(name), Driver: strings.TrimSpace(driver), CUDA: cuda})
	}
	return gpus
}

// MachineID resolves the configured machine id; "auto" is the hostname.
func (p *Prober) MachineID(configured string) (string, error) {
	if configured != "auto" {
		return configured, nil
	}
	h, err := p.hostname()
	if err != nil || strings.TrimSpace(h) == "" {
		return "", fmt.Errorf("machine_id auto: cannot read the hostname: %v", err)
	}
	return strings.TrimSpace(h), nil
}

// Tags merges the configured tags with what the probe found: arch=, os=,
// cpus=, and gpu= / gpu-count= when there is a GPU. A configured tag wins
// over a detected one with the same key ("key=value" or "key:value").
func Tags(configured []string, v messages.Versions) []string {
	out := make([]string, 0, len(configured)+5)
	keys := map[string]bool{}
	for _, t := range configured {
		out = append(out, t)
		keys[tagKey(t)] = true
	}
	add := func(k, val string) {
		if val == "" || keys[k] {
			return
		}
		keys[k] = true
		out = append(out, k+"="+val)
	}
	arch := runtime.GOARCH
	if v.Arch != nil {
		arch = *v.Arch
	}
	add("arch", arch)
	add("os", runtime.GOOS)
	if v.CPU != nil {
		add("cpus", strconv.Itoa(int(v.CPU.Cores)))
	}
	if len(v.GPU) > 0 {
		add("gpu", v.GPU[0].Name)
		add("gpu-count", strconv.Itoa(len(v.GPU)))
	}
	return out
}

func tagKey(t string) string {
	if i := strings.IndexAny(t, "=:"); i >= 0 {
		return t[:i]
	}
	return t
}

// runnerBinaries are the executables a runner kind needs; any one will do.
// A kind missing here needs nothing outside the daemon.
var runnerBinaries = map[string][]string{
	"process": {"bash"},
	"python":  {"python3", "python"},
	"docker":  {"docker", "podman"},
	"gvisor":  {"runsc"},
	"slurm":   {"srun"},
}

// Capabilities reports the runners among kinds that this host can run now,
// with the concurrency bound and the workdir.
func (p *Prober) Capabilities(kinds []string, maxInvocations int, workdir string) messages.Capabilities {
	c := messages.Capabilities{Runners: []string{}, MaxInvocations: uint32(max(maxInvocations, 0)), Workdir: workdir}
	for _, k := range kinds {
		bins, needs := runnerBinaries[k]
		ok := !needs
		for _, b := range bins {
			if _, err := p.lookPath(b); err == nil {
				ok = true
				break
			}
		}
		if ok {
			c.Runners = append(c.Runners, k)
		}
	}
	return c
}

// ProvisionalWorkerID is the id a daemon uses while the control plane has
// not given it one: {machine_id}-{ULID}.
func ProvisionalWorkerID(machineID string) string {
	return machineID + "-" + ulid.MustNew(ulid.Now(), rand.Reader).String()
}

// NewIncarnation names one daemon process for hello's incarnation: call it
// once per process start and reuse it for every hello of that process, so
// the control plane can tell a re-hello (same name) from a restart (a new
// one) and fail the jobs the previous process took with it. A ULID: unique
// without coordination, and ordered by start time in logs.
func NewIncarnation() string {
	return ulid.MustNew(ulid.Now(), rand.Reader).String()
}

func ptr(s string) *string { return &s }
