package execs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"nymph/actors/payload"
	"nymph/messages"
)

// Defaults of the exec path.
const (
	// DefaultKillGrace is the settle grace between SIGTERM and SIGKILL.
	DefaultKillGrace = 5 * time.Second
	// readSize is the size of each read from the child's stdout and stderr.
	readSize = 8 << 10
	// readerDrain bounds how long output is read after the group is gone;
	// only a process that left the group (setsid) can hold a pipe longer.
	readerDrain = 2 * time.Second
	// EnvPayload names the file a payload is materialised to.
	EnvPayload = "NYMPH_PAYLOAD"
)

// Server is what an exec needs from the control plane: chunk posts and
// payload resolution.
type Server interface {
	payload.Store
	PostChunk(ctx context.Context, rawURL string, data []byte) error
}

// Shell runs exec commands. Its zero value is not usable; fill every field
// that has no documented default.
type Shell struct {
	// Workdir is where commands run unless the exec names a workdir, and
	// where payload scratch directories are made.
	Workdir string
	// KillGrace is the time between SIGTERM and SIGKILL (default 5 s).
	KillGrace time.Duration
	// Namespace is used to presign payload_ref downloads.
	Namespace string
	// BaseEnv is the daemon's environment, under each exec's env.
	BaseEnv []string
	// ChunkTimeout bounds one log chunk post (default 10 s).
	ChunkTimeout time.Duration
	Server       Server
	Log          zerolog.Logger
}

// Group is the handle on one exec's process group. The exec child actor
// owns it: Abort kills the group, synchronously when hard, so an actor that
// is stopping or restarting leaves nothing behind.
type Group struct {
	ctx    context.Context
	cancel context.CancelFunc
	grace  time.Duration

	mu       sync.Mutex
	reason   string
	timedOut bool
	pgid     int
	exited   bool
	timers   []*time.Timer
}

// NewGroup returns a handle with the given kill grace (<= 0: 5 s).
func NewGroup(killGrace time.Duration) *Group {
	if killGrace <= 0 {
		killGrace = DefaultKillGrace
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Group{ctx: ctx, cancel: cancel, grace: killGrace}
}

// Abort ends the exec with reason (the first reason given wins). Hard sends
// SIGKILL to the group at once; otherwise SIGTERM now and SIGKILL after the
// kill grace. Before the spawn it prevents the spawn.
func (g *Group) Abort(reason string, hard bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reason == "" {
		g.reason = reason
	}
	g.cancel()
	g.signal(hard)
}

// expire is the timeout path: exit code -2.
func (g *Group) expire() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reason == "" {
		g.reason = "timeout"
		g.timedOut = true
	}
	g.signal(false)
}

// signal must be called with mu held. The leader is not reaped before
// exited is set, so its pid (the pgid) cannot have been reused.
func (g *Group) signal(hard bool) {
	if g.pgid <= 0 || g.exited {
		return
	}
	if hard {
		_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
		return
	}
	_ = syscall.Kill(-g.pgid, syscall.SIGTERM)
	g.timers = append(g.timers, time.AfterFunc(g.grace, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if !g.exited {
			_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
		}
	}))
}

func (g *Group) aborted() (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reason, g.timedOut
}

// Run executes one exec to completion and returns its result. It never
// panics on bad input; every failure is a result with exit code -1.
func (s *Shell) Run(g *Group, e *messages.Exec) *messages.ExecResult {
	start := time.Now()
	log := s.Log.With().Str("exec_id", e.ExecID).Logger()
	res := &messages.ExecResult{}
	finish := func() *messages.ExecResult {
		res.DurationMs = uint64(time.Since(start).Milliseconds())
		return res
	}
	fail := func(msg string) *messages.ExecResult {
		res.ExitCode = messages.ExitFailed
		res.Error = &msg
		return finish()
	}

	if reason, _ := g.aborted(); reason != "" {
		return fail(reason)
	}
	env := mergeEnv(s.BaseEnv, e.Env)
	if e.PayloadInline != nil || e.PayloadRef != nil {
		path, cleanup, err := s.materialise(g.ctx, e)
		if err != nil {
			if reason, _ := g.aborted(); reason != "" {
				return fail(reason)
			}
			log.Warn().Err(err).Msg("exec payload refused; nothing spawned")
			return fail(err.Error())
		}
		defer cleanup()
		env = mergeEnv(env, map[string]string{EnvPayload: path})
	}
	dir := s.Workdir
	if e.Workdir != nil && *e.Workdir != "" {
		dir = *e.Workdir
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(s.Workdir, dir)
		}
	}

	outR, outW, err := os.Pipe()
	if err != nil {
		return fail("spawn failed: " + err.Error())
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return fail("spawn failed: " + err.Error())
	}
	cmd := exec.Command("bash", "-c", e.Command)
	cmd.Env = env
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(e.Stdin)
	cmd.Stdout = outW
	cmd.Stderr = errW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	g.mu.Lock()
	if g.reason != "" {
		reason := g.reason
		g.mu.Unlock()
		closeAll(outR, outW, errR, errW)
		return fail(reason)
	}
	err = cmd.Start()
	if err == nil {
		g.pgid = cmd.Process.Pid
	}
	g.mu.Unlock()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		log.Warn().Err(err).Msg("exec spawn failed")
		return fail("spawn failed: " + err.Error())
	}

	// Output: captured (1 MiB each) or streamed through the LogSink.
	var stdout, stderr capped
	var readers sync.WaitGroup
	var stream chan []byte
	var shipped chan struct{}
	if e.Log != nil {
		stream = make(chan []byte, 64)
		shipped = make(chan struct{})
		sh := newShipper(s, e.ExecID, e.Log, log)
		go func() {
			sh.run(stream)
			close(shipped)
		}()
		readers.Add(2)
		go readInto(&readers, outR, func(b []byte) { stream <- b })
		go readInto(&readers, errR, func(b []byte) { stream <- b })
	} else {
		readers.Add(2)
		go readInto(&readers, outR, stdout.write)
		go readInto(&readers, errR, stderr.write)
	}

	var timeout *time.Timer
	// A timeout too large for a Duration (about 292 years) is no timeout.
	if e.TimeoutS != nil && *e.TimeoutS > 0 && *e.TimeoutS < float64(math.MaxInt64/int64(time.Second)) {
		timeout = time.AfterFunc(time.Duration(*e.TimeoutS*float64(time.Second)), g.expire)
	}

	waitExitNoReap(cmd.Process.Pid)
	if timeout != nil {
		timeout.Stop()
	}
	g.mu.Lock()
	// Whatever the leader left running in its group goes with it.
	_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
	g.exited = true
	for _, t := range g.timers {
		t.Stop()
	}
	g.mu.Unlock()
	waitErr := cmd.Wait()

	drained := make(chan struct{})
	go func() {
		readers.Wait()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(readerDrain):
		log.Warn().Msg("exec output still open after the group was killed; closing it")
	}
	outR.Close()
	errR.Close()
	<-drained
	if stream != nil {
		close(stream)
		<-shipped
	}

	reason, timedOut := g.aborted()
	var errs []string
	switch {
	case timedOut:
		res.ExitCode = messages.ExitTimeout
		errs = append(errs, fmt.Sprintf("timed out after %gs", *e.TimeoutS))
	case reason != "":
		res.ExitCode = messages.ExitFailed
		errs = append(errs, reason)
	case waitErr != nil && !isExitError(waitErr):
		res.ExitCode = messages.ExitFailed
		errs = append(errs, "wait failed: "+waitErr.Error())
	default:
		res.ExitCode = int32(cmd.ProcessState.ExitCode())
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.ExitCode = messages.ExitFailed
			errs = append(errs, "killed by signal "+unix.SignalName(ws.Signal()))
		}
	}
	if stream == nil {
		res.Stdout = strings.ToValidUTF8(string(stdout.buf), "\uFFFD")
		res.Stderr = strings.ToValidUTF8(string(stderr.buf), "\uFFFD")
		switch {
		case stdout.over && stderr.over:
			errs = append(errs, messages.ErrBothTruncated)
		case stdout.over:
			errs = append(errs, messages.ErrStdoutTruncated)
		case stderr.over:
			errs = append(errs, messages.ErrStderrTruncated)
		}
	}
	if len(errs) > 0 {
		msg := strings.Join(errs, "; ")
		res.Error = &msg
	}
	return finish()
}

// materialise writes the exec's payload to a private file and returns its
// path; the payload is verified before this returns.
func (s *Shell) materialise(ctx context.Context, e *messages.Exec) (string, func(), error) {
	var data []byte
	if e.PayloadRef != nil {
		var err error
		data, err = payload.Fetch(ctx, s.Server, s.Namespace, e.PayloadRef)
		if err != nil {
			return "", nil, err
		}
	} else {
		if len(e.PayloadInline) > messages.MaxPayload {
			return "", nil, fmt.Errorf("payload_inline: %d bytes is over the %d byte limit", len(e.PayloadInline), messages.MaxPayload)
		}
		data = e.PayloadInline
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	dir := filepath.Join(s.Workdir, "execs", safeName(e.ExecID)+"-"+hex.EncodeToString(rnd[:]))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("payload: %w", err)
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	path := filepath.Join(dir, "payload")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("payload: %w", err)
	}
	return path, cleanup, nil
}

// capped keeps the first messages.OutputCap bytes written and notes overflow;
// it never blocks the child.
type capped struct {
	buf  []byte
	over bool
}

func (c *capped) write(b []byte) {
	room := messages.OutputCap - len(c.buf)
	if len(b) > room {
		c.over = true
		b = b[:max(room, 0)]
	}
	c.buf = append(c.buf, b...)
}

func readInto(wg *sync.WaitGroup, r io.Reader, sink func([]byte)) {
	defer wg.Done()
	buf := make([]byte, readSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			sink(append([]byte(nil), buf[:n]...))
		}
		if err != nil {
			return
		}
	}
}

// waitExitNoReap blocks until the process has exited and leaves it a
// zombie, so its pid stays reserved until the group is killed.
func waitExitNoReap(pid int) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == nil || !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

func isExitError(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}

// mergeEnv lays extra over base; a key in extra replaces the base entry.
func mergeEnv(base []string, extra map[string]string) []string {
	m := make(map[string]string, len(base)+len(extra))
	for _, kv := range base {
		k, v, ok := strings.Cut(kv, "=")
		if ok {
			m[k] = v
		}
	}
	for k, v := range extra {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// safeName turns an id into something usable in a file or actor name.
func safeName(id string) string {
	s := unsafeChars.ReplaceAllString(id, "_")
	if len(s) > 64 {
		s = s[:64]
	}
	if s == "" {
		s = "_"
	}
	return s
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}
