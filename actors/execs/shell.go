package execs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
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
	"nymph/runners"
	"nymph/runners/procgroup"
)

// EnvPayload names the file a payload is materialised to.
const EnvPayload = "NYMPH_PAYLOAD"

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

	// bash is where "bash" was found in the daemon's $PATH: looked up
	// once, as each lookup walks the $PATH (a dozen failed stats in front
	// of every spawn, measured), and again when a start finds it gone.
	bashMu sync.Mutex
	bash   string

	// env is BaseEnv merged once (keys unique, sorted): merging it again
	// for every exec was a map of the daemon's whole environment built
	// in front of each spawn. An exec's own env is laid over this copy.
	envOnce sync.Once
	env     []string

	// devNull is the stdin of every exec that has none, opened once: an
	// open (and a close) of /dev/null in front of each spawn cost about
	// as much as merging the environment. Every child reads the same end
	// of file from it; it stays open as long as the Shell is used (the
	// daemon's life). Nil when it could not be opened: each exec then
	// opens its own.
	nullOnce sync.Once
	devNull  *os.File
}

// baseEnv is BaseEnv merged; callers must not change it.
func (s *Shell) baseEnv() []string {
	s.envOnce.Do(func() { s.env = mergeEnv(s.BaseEnv, nil) })
	return s.env
}

// nullInput is the shared /dev/null, nil if it cannot be opened.
func (s *Shell) nullInput() *os.File {
	s.nullOnce.Do(func() {
		if f, err := os.Open(os.DevNull); err == nil {
			s.devNull = f
		}
	})
	return s.devNull
}

// bashPath returns bash's path, looking it up if it is not known ("" when
// it is not found: the start looks again, and says so).
func (s *Shell) bashPath() string {
	s.bashMu.Lock()
	defer s.bashMu.Unlock()
	if s.bash == "" {
		s.bash, _ = exec.LookPath("bash")
	}
	return s.bash
}

// forgetBash drops a bash path that failed to start.
func (s *Shell) forgetBash(path string) {
	s.bashMu.Lock()
	defer s.bashMu.Unlock()
	if s.bash == path {
		s.bash = ""
	}
}

// Run executes one exec to completion and returns its result. It never
// panics on bad input; every failure is a result with exit code -1. ctx
// ends it early: its cause becomes the error, and a context made by
// procgroup.WithKill may ask for the group to be killed without the grace.
func (s *Shell) Run(ctx context.Context, e *messages.Exec) *messages.ExecResult {
	res, _ := s.run(ctx, e, nil)
	return res
}

// run is Run, and also says how the exec ended, as the metrics count it
// (see Outcomes): what the result alone cannot tell is whether a -1 was a
// kill (a signal, a cancel) or a failure to run. onStart, when non-nil, is
// called once the command's process exists.
func (s *Shell) run(ctx context.Context, e *messages.Exec, onStart func()) (_ *messages.ExecResult, outcome string) {
	start := time.Now()
	outcome = OutcomeFailed
	log := s.Log.With().Str("exec_id", e.ExecID).Logger()
	res := &messages.ExecResult{}
	finish := func(errs ...string) *messages.ExecResult {
		res.DurationMs = uint64(time.Since(start).Milliseconds())
		if len(errs) > 0 {
			msg := strings.Join(errs, "; ")
			res.Error = &msg
		}
		return res
	}
	fail := func(msg string) *messages.ExecResult {
		res.ExitCode = messages.ExitFailed
		return finish(msg)
	}

	if ctx.Err() != nil {
		return fail(reason(ctx)), OutcomeKilled
	}
	env := s.baseEnv()
	if len(e.Env) > 0 {
		env = mergeEnv(env, e.Env)
	}
	if e.PayloadInline != nil || e.PayloadRef != nil {
		path, cleanup, err := s.materialise(ctx, e)
		if err != nil {
			if ctx.Err() != nil {
				return fail(reason(ctx)), OutcomeKilled
			}
			log.Warn().Err(err).Msg("exec payload refused; nothing spawned")
			return fail(err.Error()), outcome
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

	// "--" ends bash's options: a command that starts with "-" is a
	// command, not an option.
	cmd := procgroup.Command{
		Path: s.bashPath(), Argv: []string{"bash", "-c", "--", e.Command}, Env: env, Dir: dir,
		KillGrace: s.KillGrace, Started: onStart,
	}
	// Without stdin the child reads /dev/null (the same end of file at
	// once) rather than a pipe that a goroutine of its own would close.
	if e.Stdin != "" {
		cmd.Input = strings.NewReader(e.Stdin)
	} else if null := s.nullInput(); null != nil {
		cmd.Input = null
	}
	// A timeout too large for a Duration (about 292 years) is no timeout.
	if e.TimeoutS != nil && *e.TimeoutS > 0 && *e.TimeoutS < float64(math.MaxInt64/int64(time.Second)) {
		cmd.Timeout = time.Duration(*e.TimeoutS * float64(time.Second))
	}
	// Output: captured (1 MiB each) or streamed through the LogSink.
	stdout := &procgroup.Capped{Limit: messages.OutputCap}
	stderr := &procgroup.Capped{Limit: messages.OutputCap}
	var stream chan []byte
	shipped := make(chan struct{})
	if e.Log != nil {
		stream = make(chan []byte, 64)
		sh := newShipper(s, e.Log, log)
		go func() {
			sh.run(stream)
			close(shipped)
		}()
		cmd.Output = forward(stream)
	} else {
		cmd.Stdout, cmd.Stderr = stdout, stderr
	}

	pg, err := procgroup.Run(ctx, cmd)
	var started *procgroup.StartError
	if errors.As(err, &started) && started.Step == "start bash" && cmd.Path != "" && errors.Is(err, fs.ErrNotExist) {
		// bash moved since it was looked up: look again, once.
		s.forgetBash(cmd.Path)
		cmd.Path = s.bashPath()
		pg, err = procgroup.Run(ctx, cmd)
	}
	if stream != nil {
		close(stream)
		<-shipped
	}
	var errs []string
	switch {
	case errors.As(err, &started):
		log.Warn().Err(err).Msg("exec spawn failed")
		return fail("spawn failed: " + started.Err.Error()), outcome
	case pg.Stopped == procgroup.Timeout:
		res.ExitCode, outcome = messages.ExitTimeout, OutcomeTimeout
		errs = append(errs, fmt.Sprintf("timed out after %gs", *e.TimeoutS))
	case pg.Stopped == procgroup.Cancelled:
		res.ExitCode, outcome = messages.ExitFailed, OutcomeKilled
		errs = append(errs, reason(ctx))
	case err != nil:
		res.ExitCode = messages.ExitFailed
		errs = append(errs, "wait failed: "+errors.Unwrap(err).Error())
	default:
		res.ExitCode, outcome = int32(pg.ExitCode), OutcomeExitZero
		if pg.ExitCode != 0 {
			outcome = OutcomeExitNonzero
		}
		if ws, ok := pg.State.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.ExitCode, outcome = messages.ExitFailed, OutcomeKilled
			errs = append(errs, "killed by signal "+unix.SignalName(ws.Signal()))
		}
	}
	res.Stdout = strings.ToValidUTF8(string(stdout.Bytes()), "\uFFFD")
	res.Stderr = strings.ToValidUTF8(string(stderr.Bytes()), "\uFFFD")
	switch {
	case stdout.Truncated() && stderr.Truncated():
		errs = append(errs, messages.ErrBothTruncated)
	case stdout.Truncated():
		errs = append(errs, messages.ErrStdoutTruncated)
	case stderr.Truncated():
		errs = append(errs, messages.ErrStderrTruncated)
	}
	return finish(errs...), outcome
}

// reason is why ctx ended, for the result's error.
func reason(ctx context.Context) string {
	return context.Cause(ctx).Error()
}

// forward sends a copy of every write to ch; the shipper takes it from there.
type forward chan<- []byte

func (f forward) Write(p []byte) (int, error) {
	f <- append([]byte(nil), p...)
	return len(p), nil
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
	dir, err := runners.NewScratchDir(s.Workdir, "execs", safeName(e.ExecID))
	if err != nil {
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
