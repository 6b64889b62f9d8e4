package realparts

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// markerKey names the environment variable that tags every process of one
// component instance. It survives double forks and daemonisation (munged,
// the postmaster started by pg_ctl, slurmstepd forked by slurmd, ssh
// ControlMaster processes), which a parent/child walk alone would miss.
const markerKey = "REALPARTS_FAMILY"

// family is the set of processes started for one component instance.
type family struct {
	marker string // markerKey=<random>

	mu       sync.Mutex
	children []*child
}

// child is one process started directly by a family.
type child struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// newFamily returns an empty family whose processes are all killed when
// the test ends.
func newFamily(t testing.TB) *family {
	f := &family{marker: markerKey + "=" + randomHex(8)}
	t.Cleanup(f.kill)
	return f
}

// env is the environment given to the family's processes: the test's own
// plus the marker plus extra.
func (f *family) env(extra ...string) []string {
	env := append(os.Environ(), f.marker)
	return append(env, extra...)
}

// start runs cmd in its own process group with its output appended to
// logPath. cmd.Env, when unset, becomes f.env().
func (f *family) start(name string, cmd *exec.Cmd, logPath string) (*child, error) {
	if cmd.Env == nil {
		cmd.Env = f.env()
	} else {
		cmd.Env = append(cmd.Env, f.marker)
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: open log: %w", name, err)
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		logFile.Close()
		close(c.done)
	}()
	f.mu.Lock()
	f.children = append(f.children, c)
	f.mu.Unlock()
	return c, nil
}

// exited reports whether the child has terminated, with its exit error.
func (c *child) exited() (bool, error) {
	select {
	case <-c.done:
		return true, c.err
	default:
		return false, nil
	}
}

// failure describes a child that could not be brought up, with the end of
// its log so the test output says why.
func (c *child) failure(err error) error {
	return fmt.Errorf("%s: %w\n--- %s (tail) ---\n%s", c.name, err, c.logPath, tailFile(c.logPath, 3000))
}

// kill SIGKILLs every process of the family: the direct children, every
// process carrying the marker, and all their descendants; it repeats until
// a scan of /proc finds none, so processes forked while it runs die too.
func (f *family) kill() {
	f.mu.Lock()
	children := append([]*child(nil), f.children...)
	f.mu.Unlock()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		var roots []int
		for _, c := range children {
			if done, _ := c.exited(); !done {
				roots = append(roots, c.cmd.Process.Pid)
			}
		}
		victims := f.members(roots)
		if len(victims) == 0 {
			break
		}
		for _, pid := range victims {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond) // let the kernel deliver before rescanning
	}
	for _, c := range children {
		select {
		case <-c.done:
		case <-time.After(time.Until(deadline) + time.Second):
		}
	}
}

// members returns the live processes that belong to the family: roots,
// processes whose environment holds the marker, and their descendants.
func (f *family) members(roots []int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return roots
	}
	self := os.Getpid()
	marker := []byte(f.marker)
	kids := map[int][]int{}
	in := map[int]bool{}
	for _, pid := range roots {
		in[pid] = true
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		ppid, state, ok := procStat(pid)
		if !ok || state == 'Z' {
			delete(in, pid)
			continue
		}
		kids[ppid] = append(kids[ppid], pid)
		if env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ")); err == nil {
			for _, kv := range bytes.Split(env, []byte{0}) {
				if bytes.Equal(kv, marker) {
					in[pid] = true
					break
				}
			}
		}
	}
	queue := make([]int, 0, len(in))
	for pid := range in {
		queue = append(queue, pid)
	}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, k := range kids[pid] {
			if !in[k] {
				in[k] = true
				queue = append(queue, k)
			}
		}
	}
	delete(in, self)
	out := make([]int, 0, len(in))
	for pid := range in {
		out = append(out, pid)
	}
	return out
}

// procStat reads the parent pid and state letter of pid.
func procStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name may contain spaces and parentheses: fields start
	// after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(fields[1])
	if err != nil || len(fields[0]) != 1 {
		return 0, 0, false
	}
	return ppid, fields[0][0], true
}

// privateDir makes a short, world-traversable directory for one instance
// and removes it when the test ends. t.TempDir() paths grow with the test
// name and overflow the 108-byte unix socket limit (munge, slurmstepd,
// PostgreSQL and ssh ControlPath sockets live inside), and daemons that
// drop to their own user (munge, postgres) must be able to enter it.
func privateDir(t testing.TB, prefix string) string {
	t.Helper()
	base := os.TempDir()
	if len(base) > 24 {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, prefix)
	if err != nil {
		t.Fatalf("realparts: private dir: %v", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("realparts: private dir: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("realparts: remove %s: %v", dir, err)
		}
	})
	return dir
}

// freePort asks the kernel for a loopback TCP port that is free right now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// errNotYet is returned by a poll condition that should be retried.
var errNotYet = errors.New("not ready yet")

// poll calls cond every interval until it returns nil, a child in watch
// exits, or timeout passes. cond returns errNotYet (possibly wrapped) to
// keep polling and any other error to stop at once.
func poll(timeout, interval time.Duration, watch []*child, cond func() error) error {
	deadline := time.Now().Add(timeout)
	last := errNotYet
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if !errors.Is(err, errNotYet) {
			return err
		}
		last = err
		for _, c := range watch {
			if done, werr := c.exited(); done {
				return c.failure(fmt.Errorf("exited before it was ready: %v", werr))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %w", timeout, last)
		}
		time.Sleep(interval)
	}
}

// tailFile returns up to the last n bytes of a file, or why it cannot.
func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return err.Error()
	}
	return string(buf)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // documented to never return an error
	return hex.EncodeToString(b)
}

// chownTree gives path and everything below it to the named user.
func chownTree(path string, uid, gid int) error {
	return filepath.WalkDir(path, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}
