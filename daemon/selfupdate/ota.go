package selfupdate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"

	"nymph/atomicfile"
	"nymph/dist"
	"nymph/messages"
	"nymph/timerslack"
)

const (
	// DefaultMaxSize bounds a download so a wrong URL cannot fill the disk
	// that holds the daemon's binary; a nymph binary is a few tens of MiB.
	DefaultMaxSize int64 = 1 << 30
	// DefaultTimeout bounds one Install when the caller's context has no
	// deadline of its own, so a stalled server cannot pin the update forever.
	DefaultTimeout = 10 * time.Minute

	tempPrefix = ".nymph-ota-"
	tempSuffix = ".tmp"
	copyBuf    = 256 << 10
)

var (
	// ErrInvalidCommand wraps every refusal of the command itself (checksum
	// not 64 hex characters, URL not http/https) before anything is fetched.
	ErrInvalidCommand = errors.New("ota: invalid ota_update")
	// ErrChecksumMismatch means the downloaded bytes do not hash to the
	// command's sha256.
	ErrChecksumMismatch = errors.New("ota: sha256 mismatch")
	// ErrNotExecutable means the download hashed correctly but is not an
	// executable this machine can run (not ELF, or another architecture);
	// installing it would brick the next start.
	ErrNotExecutable = errors.New("ota: downloaded file is not an executable for this machine")
	// ErrBusy means another Install (or Exec) of the same Updater is running.
	ErrBusy = errors.New("ota: another update is in progress")
	// ErrSelfExecDisabled is returned by Exec when the build or the options
	// turned the self-exec off; the installed binary runs from the next start.
	ErrSelfExecDisabled = errors.New("ota: self-exec is disabled in this build")
)

// Options configures an Updater. The zero value updates the running
// executable and, if the build allows it, execs it with os.Args and
// os.Environ().
type Options struct {
	// ExePath is the binary to replace and exec. Empty means os.Executable()
	// resolved through symlinks, so a symlinked install replaces the real
	// file and the link keeps pointing at it.
	ExePath string
	// HTTPClient fetches the binary. Nil means a fresh client with no
	// overall timeout (Timeout bounds the whole Install instead).
	HTTPClient *http.Client
	// Bearer is sent as "Authorization: Bearer …" on the download, but only
	// when the URL has the same scheme and host as ServerURL: an operator's
	// --url pointing elsewhere must not receive the daemon's token. With
	// ServerURL empty the bearer is never sent.
	Bearer    string
	ServerURL string
	// DisableSelfExec turns Exec off at run time; it cannot turn on what the
	// build turned off (see SelfExecDefault).
	DisableSelfExec bool
	// Args and Env are what Exec passes to execve(2). Nil means os.Args and
	// os.Environ() as they were when New ran.
	Args []string
	Env  []string
	// MaxSize caps the download in bytes; 0 means DefaultMaxSize.
	MaxSize int64
	// Timeout caps one Install whose context has no deadline of its own;
	// 0 means DefaultTimeout.
	Timeout time.Duration
}

// Installed describes a binary Install put in place.
type Installed struct {
	Version string
	Path    string
	SHA256  string
	Size    int64
	Mode    fs.FileMode
	Elapsed time.Duration
}

// Updater installs new binaries over one executable and execs it. It is safe
// for concurrent use; overlapping calls get ErrBusy rather than queueing, so
// two ota_update commands never race on the same file.
type Updater struct {
	log          zerolog.Logger
	exePath      string
	exeErr       error
	client       *http.Client
	bearer       string
	bearerOrigin *url.URL
	selfExec     bool
	args         []string
	env          []string
	maxSize      int64
	timeout      time.Duration
	busy         sync.Mutex
}

// New returns an Updater for opts. A failure to find the running executable
// is not fatal here: Install and Exec report it, so a daemon that never gets
// an ota_update is not stopped by it.
func New(log zerolog.Logger, opts Options) *Updater {
	u := &Updater{
		log:      log.With().Str("component", "ota").Logger(),
		client:   opts.HTTPClient,
		bearer:   opts.Bearer,
		selfExec: SelfExecDefault() && !opts.DisableSelfExec,
		args:     append([]string(nil), opts.Args...),
		env:      append([]string(nil), opts.Env...),
		maxSize:  opts.MaxSize,
		timeout:  opts.Timeout,
	}
	u.exePath, u.exeErr = resolveExe(opts.ExePath)
	if u.client == nil {
		u.client = &http.Client{}
	}
	if opts.ServerURL != "" {
		if su, err := url.Parse(opts.ServerURL); err == nil && su.Host != "" {
			u.bearerOrigin = su
		} else {
			u.log.Warn().Str("server_url", opts.ServerURL).Msg("ota: server_url is not an absolute URL; the bearer will not be sent with downloads")
		}
	}
	if opts.Args == nil {
		u.args = append([]string(nil), os.Args...)
	}
	if len(u.args) == 0 {
		u.args = []string{u.exePath}
	}
	if opts.Env == nil {
		u.env = os.Environ()
	}
	if u.maxSize <= 0 {
		u.maxSize = DefaultMaxSize
	}
	if u.timeout <= 0 {
		u.timeout = DefaultTimeout
	}
	return u
}

func resolveExe(p string) (string, error) {
	if p == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("ota: locate the running executable: %w", err)
		}
		p = exe
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("ota: executable path %s: %w", p, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return abs, fmt.Errorf("ota: executable path %s: %w", abs, err)
	}
	return real, nil
}

// ExePath is the file Install replaces and Exec runs.
func (u *Updater) ExePath() string { return u.exePath }

// SelfExec reports whether Exec will replace the process image.
func (u *Updater) SelfExec() bool { return u.selfExec }

// Validate checks an ota_update body the way Install does, without touching
// the network or the disk, so a caller can refuse a bad command before it
// starts draining work for it.
func Validate(cmd messages.OtaUpdate) error {
	if !messages.ValidSHA256(cmd.SHA256) {
		return fmt.Errorf("%w: field sha256: %q is not exactly 64 ASCII hex characters", ErrInvalidCommand, cmd.SHA256)
	}
	if cmd.URL == "" {
		return fmt.Errorf("%w: field url: missing or empty", ErrInvalidCommand)
	}
	pu, err := url.Parse(cmd.URL)
	if err != nil {
		return fmt.Errorf("%w: field url: %v", ErrInvalidCommand, err)
	}
	if pu.Scheme != "http" && pu.Scheme != "https" {
		return fmt.Errorf("%w: field url: scheme %q is not http or https", ErrInvalidCommand, pu.Scheme)
	}
	if pu.Host == "" {
		return fmt.Errorf("%w: field url: no host", ErrInvalidCommand)
	}
	return nil
}

// Install downloads cmd.URL next to the executable, verifies it against
// cmd.SHA256 and renames it over the executable. On any error the
// executable is untouched and no temporary file remains; the error says
// why and has already been logged. Install does not exec: call Exec once
// in-flight work has drained.
func (u *Updater) Install(ctx context.Context, cmd messages.OtaUpdate) (Installed, error) {
	log := u.log.With().Str("version", cmd.Version).Str("url", dist.RedactURL(cmd.URL)).Str("sha256", cmd.SHA256).Logger()
	inst, err := u.install(ctx, cmd, log)
	if err != nil {
		log.Warn().Err(err).Str("path", u.exePath).Msg("ota: update refused; the running binary is unchanged")
		return Installed{}, err
	}
	log.Info().Str("path", inst.Path).Int64("bytes", inst.Size).Stringer("mode", inst.Mode).
		Dur("elapsed", inst.Elapsed).Msg("ota: new binary installed")
	return inst, nil
}

func (u *Updater) install(ctx context.Context, cmd messages.OtaUpdate, log zerolog.Logger) (Installed, error) {
	start := time.Now()
	if err := Validate(cmd); err != nil {
		return Installed{}, err
	}
	if u.exeErr != nil {
		return Installed{}, u.exeErr
	}
	if !u.busy.TryLock() {
		return Installed{}, ErrBusy
	}
	defer u.busy.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, u.timeout)
		defer cancel()
	}

	cur, err := os.Stat(u.exePath)
	if err != nil {
		return Installed{}, fmt.Errorf("ota: stat running executable: %w", err)
	}
	dir := filepath.Dir(u.exePath)
	u.removeStaleTemps(dir)

	tmp := filepath.Join(dir, fmt.Sprintf("%s%d-%s%s", tempPrefix, os.Getpid(), ulid.Make(), tempSuffix))
	// Creating the file before the request surfaces an unwritable directory
	// without downloading anything. O_EXCL: never write through a name
	// someone else put there.
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Installed{}, fmt.Errorf("ota: create temporary file in %s (the directory of the running executable): %w", dir, err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	log.Info().Str("temp", tmp).Msg("ota: downloading")

	size, sum, err := u.download(ctx, cmd.URL, f)
	if err != nil {
		return Installed{}, err
	}
	if !strings.EqualFold(sum, cmd.SHA256) {
		return Installed{}, fmt.Errorf("%w: downloaded %d bytes hash to %s, the command says %s", ErrChecksumMismatch, size, sum, strings.ToLower(cmd.SHA256))
	}
	if err := checkExecutable(f); err != nil {
		return Installed{}, err
	}
	mode := cur.Mode().Perm() | 0o111
	if err := f.Chmod(mode); err != nil {
		return Installed{}, fmt.Errorf("ota: chmod %s: %w", tmp, err)
	}
	u.keepOwner(f, cur, log)
	if err := f.Sync(); err != nil {
		return Installed{}, fmt.Errorf("ota: fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return Installed{}, fmt.Errorf("ota: close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, u.exePath); err != nil {
		return Installed{}, fmt.Errorf("ota: rename %s over %s: %w", tmp, u.exePath, err)
	}
	committed = true
	// The rename is done and visible; a failed directory fsync only weakens
	// crash durability, so it is logged, not returned as a failed update.
	if err := atomicfile.SyncDir(dir); err != nil {
		log.Warn().Err(err).Msg("ota: fsync of the executable's directory failed")
	}
	return Installed{
		Version: cmd.Version,
		Path:    u.exePath,
		SHA256:  sum,
		Size:    size,
		Mode:    mode,
		Elapsed: time.Since(start),
	}, nil
}

// download streams rawURL into f, hashing exactly the bytes written.
func (u *Updater) download(ctx context.Context, rawURL string, f *os.File) (int64, string, error) {
	shown := dist.RedactURL(rawURL)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return 0, "", fmt.Errorf("%w: field url: %v", ErrInvalidCommand, err)
	}
	if u.bearer != "" && sameOrigin(req.URL, u.bearerOrigin) {
		req.Header.Set("Authorization", "Bearer "+u.bearer)
	}
	req.Header.Set("Accept", "application/octet-stream")
	resp, err := u.client.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("ota: download %s: %w", shown, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		msg := strings.TrimSpace(string(snippet))
		if msg != "" {
			msg = ": " + msg
		}
		return 0, "", fmt.Errorf("ota: download %s: HTTP %s%s", shown, resp.Status, msg)
	}
	if resp.ContentLength > u.maxSize {
		return 0, "", fmt.Errorf("ota: download %s: Content-Length %d exceeds the %d-byte limit", shown, resp.ContentLength, u.maxSize)
	}

	h := sha256.New()
	buf := make([]byte, copyBuf)
	var n int64
	for {
		r, rerr := resp.Body.Read(buf)
		if r > 0 {
			if n+int64(r) > u.maxSize {
				return n, "", fmt.Errorf("ota: download %s: body exceeds the %d-byte limit", shown, u.maxSize)
			}
			if _, werr := f.Write(buf[:r]); werr != nil {
				return n, "", fmt.Errorf("ota: write %s: %w", f.Name(), werr)
			}
			h.Write(buf[:r])
			n += int64(r)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return n, "", fmt.Errorf("ota: download %s interrupted after %d bytes: %w", shown, n, rerr)
		}
	}
	// net/http already fails a short body with io.ErrUnexpectedEOF; this
	// check keeps the guarantee independent of the transport.
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, "", fmt.Errorf("ota: download %s truncated: got %d of %d bytes", shown, n, resp.ContentLength)
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// keepOwner gives the new file the old one's owner when the daemon runs as
// someone else (typically root updating a binary owned by a deploy user).
// Only root can do that; anyone else already owns what they create.
func (u *Updater) keepOwner(f *os.File, cur fs.FileInfo, log zerolog.Logger) {
	st, ok := cur.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) == os.Geteuid() && int(st.Gid) == os.Getegid() {
		return
	}
	if err := f.Chown(int(st.Uid), int(st.Gid)); err != nil {
		log.Debug().Err(err).Msg("ota: could not keep the executable's owner")
	}
}

// removeStaleTemps deletes temporary files left by a process that died
// mid-download. Files of live processes (including this one) are kept.
func (u *Updater) removeStaleTemps(dir string) {
	matches, err := filepath.Glob(filepath.Join(dir, tempPrefix+"*"+tempSuffix))
	if err != nil {
		return
	}
	for _, m := range matches {
		rest := strings.TrimPrefix(filepath.Base(m), tempPrefix)
		pidStr, _, ok := strings.Cut(rest, "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err := os.Remove(m); err == nil {
			u.log.Info().Str("temp", m).Int("pid", pid).Msg("ota: removed a temporary file left by a dead process")
		}
	}
}

// Exec replaces the process image with the executable at ExePath, passing
// the original argv and environment; the PID stays the same. On success it
// does not return. It returns ErrSelfExecDisabled when the build or the
// options turned it off, and ErrBusy while an Install is running.
func (u *Updater) Exec() error {
	if !u.selfExec {
		return ErrSelfExecDisabled
	}
	if u.exeErr != nil {
		return u.exeErr
	}
	if !u.busy.TryLock() {
		return ErrBusy
	}
	defer u.busy.Unlock()
	u.log.Info().Str("path", u.exePath).Strs("args", u.args).Msg("ota: exec new binary")
	// The new binary starts with the timer slack this one began with, and
	// coarsens it again itself (package timerslack).
	err := timerslack.Child(func() error { return syscall.Exec(u.exePath, u.args, u.env) })
	return fmt.Errorf("ota: exec %s: %w", u.exePath, err)
}

func sameOrigin(a, b *url.URL) bool {
	return b != nil && strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Host, b.Host)
}
