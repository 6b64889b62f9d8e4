package providers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"nymph/atomicfile"
	"nymph/timerslack"
)

// DefaultPodmanCLI is the podman provider's command when --cli is not given.
const DefaultPodmanCLI = "podman"

// Bounds on one podman call, on top of the caller's ctx: a wedged podman
// (a stuck storage lock, say) is killed rather than holding a launch slot
// for ever. `run` may have to create a container from a large image.
const (
	podmanRunTimeout  = 2 * time.Minute
	podmanCallTimeout = time.Minute
)

// podmanLogCap bounds the console log ConsoleLog returns: the most recent
// output is kept, like a serial console's ring buffer.
const podmanLogCap = 1 << 20

// podmanErrCap bounds podman's own output quoted in an error.
const podmanErrCap = 4 << 10

// bootstrapMount is where a container finds its bootstrap script.
const bootstrapMount = "/run/lakeshore/bootstrap.sh"

// The labels of each container: its worker id and the daemon's name.
const (
	podmanWorkerLabel = "lakeshore.worker"
	podmanNameLabel   = "lakeshore.name"
)

// containerName is what podman accepts as a container name; a worker id
// (24 hex) always is one. Checking it keeps the id from being read as a
// flag or escaping dir as a file name.
var containerName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// containerID is the full id `podman run --detach` prints.
var containerID = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Podman launches each daemon as a detached container on this host: the
// provider's image on the host network, named lakeshore-<worker id>,
// labelled lakeshore.worker=<worker id> and lakeshore.name=<daemon name>,
// run as root (--user 0:0), its entrypoint
// `bash /run/lakeshore/bootstrap.sh`. The bootstrap carries the
// daemon's token, so it never goes on a command line or into the
// container's environment (both of which `ps` and `podman inspect` show):
// it is written 0600 under the launcher's private directory and
// bind-mounted read-only; Terminate removes it with the container (one
// removed behind the provider's back leaves its file in the private
// directory).
//
// The spec's CLI is split on whitespace: the first word is the executable,
// the others are podman's global flags, put before every subcommand. An
// operator who needs them gives, for example,
//
//	--cli 'podman --runtime runc --cgroup-manager cgroupfs'
//
// or the path of a wrapper script; a word cannot hold a space. RunArgs
// (--run-arg, repeated) are added to `run` before the image, e.g.
// `--run-arg=--ulimit --run-arg=nofile=1024:1024`.
//
// The launch log is `podman logs` (the container's stdout and stderr,
// interleaved as podman gives them), its last MiB. Every podman call is
// bounded by its ctx and by a timeout of its own (2 min for run, 1 min
// otherwise) and killed when either ends.
type Podman struct {
	name string
	spec PodmanSpec
	cli  []string // the executable, then global flags
	dir  string
	log  zerolog.Logger
}

var _ Launcher = (*Podman)(nil)

// NewPodman is the launcher of podman provider name. dir is a directory
// private to it (made 0700 if missing) that holds each container's
// bootstrap while the container exists.
func NewPodman(name string, spec PodmanSpec, dir string, log zerolog.Logger) (*Podman, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("podman provider %s: %w", name, err)
	}
	if dir == "" {
		return nil, fmt.Errorf("podman provider %s: no directory for bootstraps", name)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("podman provider %s: %w", name, err)
	}
	if strings.Contains(dir, ":") {
		// It is the source of a --volume SRC:DEST:ro.
		return nil, fmt.Errorf("podman provider %s: bootstrap directory %s holds a colon", name, dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("podman provider %s: %w", name, err)
	}
	cli := strings.Fields(spec.CLI)
	if len(cli) == 0 {
		cli = []string{DefaultPodmanCLI}
	}
	return &Podman{
		name: name,
		spec: spec,
		cli:  cli,
		dir:  dir,
		log:  log.With().Str("provider", name).Str("kind", string(KindPodman)).Logger(),
	}, nil
}

// Check verifies that the CLI runs and that the image exists on this host
// (nothing is pulled at launch time unless RunArgs ask for it).
func (p *Podman) Check(ctx context.Context) error {
	if _, err := exec.LookPath(p.cli[0]); err != nil {
		return fmt.Errorf("podman provider %s: --cli %s: %w", p.name, p.cli[0], err)
	}
	out, err := p.podman(ctx, podmanCallTimeout, "image", "exists", p.spec.Image)
	switch {
	case err == nil:
		return nil
	case exitStatus(err) == 1:
		return fmt.Errorf("podman provider %s: image %s does not exist on this host: build it or pull it (%s pull %s), or fix --image",
			p.name, p.spec.Image, p.cli[0], p.spec.Image)
	default:
		return fmt.Errorf("podman provider %s: %s image exists %s failed (check --cli and its flags): %w: %s",
			p.name, strings.Join(p.cli, " "), p.spec.Image, err, lastBytes(out, podmanErrCap))
	}
}

// Launch starts req's container and returns its id. On any failure the
// container, if podman got as far as creating it, is removed again, and
// so is the bootstrap file.
func (p *Podman) Launch(ctx context.Context, req LaunchRequest) (Instance, error) {
	if !containerName.MatchString(req.WorkerID) {
		return Instance{}, fmt.Errorf("podman provider %s: worker id %q cannot name a container", p.name, req.WorkerID)
	}
	name := "lakeshore-" + req.WorkerID
	// A container of that name is an earlier launch of this worker: fail
	// before the cleanup of a failed run could remove it.
	if _, err := p.podman(ctx, podmanCallTimeout, "container", "exists", name); err == nil {
		return Instance{}, fmt.Errorf("podman provider %s: container %s exists already", p.name, name)
	}
	file := p.bootstrapPath(req.WorkerID)
	if err := atomicfile.Write(file, []byte(req.Bootstrap), 0o600); err != nil {
		return Instance{}, fmt.Errorf("podman provider %s: write bootstrap: %w", p.name, err)
	}
	args := []string{"run", "--detach",
		"--name", name,
		"--label", podmanWorkerLabel + "=" + req.WorkerID,
		"--network", "host",
		"--user", "0:0",
		"--volume", file + ":" + bootstrapMount + ":ro",
	}
	if req.Name != "" {
		args = append(args, "--label", podmanNameLabel+"="+req.Name)
	}
	args = append(args, p.spec.RunArgs...)
	args = append(args, p.spec.Image, "bash", bootstrapMount)
	out, err := p.podman(ctx, podmanRunTimeout, args...)
	id := lastOutputLine(out)
	if err == nil && !containerID.MatchString(id) {
		err = fmt.Errorf("no container id in its output")
	}
	if err != nil {
		p.discard(ctx, name, file)
		return Instance{}, fmt.Errorf("podman provider %s: %s run %s: %w: %s", p.name, p.cli[0], p.spec.Image, err, lastBytes(out, podmanErrCap))
	}
	p.log.Info().Str("worker_id", req.WorkerID).Str("container", id).Msg("container started")
	return Instance{ID: id}, nil
}

// discard removes what a failed launch left: the container named ref, if
// any, and the bootstrap file. It runs even when ctx has ended (that may
// be why the launch failed).
func (p *Podman) discard(ctx context.Context, ref, file string) {
	ctx = context.WithoutCancel(ctx)
	if out, err := p.podman(ctx, podmanCallTimeout, "rm", "--force", "--ignore", "--time", "0", ref); err != nil {
		p.log.Warn().Err(err).Str("container", ref).Str("output", lastBytes(out, podmanErrCap)).Msg("remove container of a failed launch")
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.log.Warn().Err(err).Msg("remove bootstrap of a failed launch")
	}
}

// Terminate removes the container (killed at once: the machine ends, as a
// cloud instance's does) and its bootstrap file, found through the
// container's worker label. A container already gone is not an error.
func (p *Podman) Terminate(ctx context.Context, instanceID string) error {
	if !containerName.MatchString(instanceID) {
		return fmt.Errorf("podman provider %s: %q is not a container id", p.name, instanceID)
	}
	// A container that is gone has no label to read; rm says whether
	// podman itself works.
	label, _ := p.podman(ctx, podmanCallTimeout, "container", "inspect", "--format", "{{index .Config.Labels \""+podmanWorkerLabel+"\"}}", instanceID)
	workerID := lastOutputLine(label)
	out, err := p.podman(ctx, podmanCallTimeout, "rm", "--force", "--ignore", "--time", "0", instanceID)
	if err != nil {
		return fmt.Errorf("podman provider %s: %s rm %s: %w: %s", p.name, p.cli[0], instanceID, err, lastBytes(out, podmanErrCap))
	}
	if containerName.MatchString(workerID) {
		if err := os.Remove(p.bootstrapPath(workerID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("podman provider %s: remove bootstrap: %w", p.name, err)
		}
	}
	p.log.Info().Str("container", instanceID).Str("worker_id", workerID).Msg("container removed")
	return nil
}

// ConsoleLog returns the container's output, its last MiB; latest is
// ignored. A container podman does not know is ErrInstanceGone.
func (p *Podman) ConsoleLog(ctx context.Context, instanceID string, latest bool) (string, error) {
	if !containerName.MatchString(instanceID) {
		return "", fmt.Errorf("podman provider %s: %q is not a container id", p.name, instanceID)
	}
	out, err := p.podman(ctx, podmanCallTimeout, "logs", instanceID)
	if err == nil {
		return string(out), nil
	}
	// `logs` says "no such container" only in prose; `container exists`
	// says it in its exit status.
	if _, xerr := p.podman(ctx, podmanCallTimeout, "container", "exists", instanceID); exitStatus(xerr) == 1 {
		return "", fmt.Errorf("podman provider %s: container %s: %w", p.name, instanceID, ErrInstanceGone)
	}
	return "", fmt.Errorf("podman provider %s: %s logs %s: %w: %s", p.name, p.cli[0], instanceID, err, lastBytes(out, podmanErrCap))
}

// bootstrapPath is where the bootstrap of workerID's container lives for
// as long as the container does (a `podman start` of it runs it again).
func (p *Podman) bootstrapPath(workerID string) string {
	return filepath.Join(p.dir, "lakeshore-"+workerID+".sh")
}

// podman runs one podman subcommand with the global flags, bounded by ctx
// and timeout, and returns its stdout and stderr together (one pipe, so in
// the order podman wrote them), the last podmanLogCap bytes of it.
func (p *Podman) podman(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.cli[0], append(append([]string{}, p.cli[1:]...), args...)...)
	out := &keepTail{max: podmanLogCap}
	cmd.Stdout, cmd.Stderr = out, out
	// conmon, which podman leaves running per container, must not keep
	// Wait waiting on an inherited pipe.
	cmd.WaitDelay = 5 * time.Second
	// podman, and the containers (daemons) it starts, get the timer slack
	// this process began with, not its coarser one (package timerslack).
	err := timerslack.Child(cmd.Start)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
	}
	return out.Bytes(), err
}

// exitStatus is err's exit status, or -1 when err is not a process exit.
func exitStatus(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

func lastOutputLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// lastBytes is the last max bytes of b, trimmed, for an error message.
func lastBytes(b []byte, max int) string {
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(bytes.TrimSpace(b))
}

// keepTail keeps the last max bytes written to it, in amortised constant
// time per byte. It is not safe for concurrent use; exec.Cmd writes to it
// from one goroutine when Stdout and Stderr are the same writer.
type keepTail struct {
	max int
	buf []byte
}

func (b *keepTail) Write(p []byte) (int, error) {
	if len(p) > b.max {
		b.buf = append(b.buf[:0], p[len(p)-b.max:]...)
		return len(p), nil
	}
	b.buf = append(b.buf, p...)
	if len(b.buf) > 2*b.max {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.max:]...)
	}
	return len(p), nil
}

// Bytes is what was kept: the last max bytes written.
func (b *keepTail) Bytes() []byte {
	if len(b.buf) > b.max {
		return b.buf[len(b.buf)-b.max:]
	}
	return b.buf
}
