package localdaemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DefaultName is the program name Find looks for.
const DefaultName = "nymph"

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat start times; it is 100
// on every Linux architecture Go supports.
const clockTicks = 100

// Process is one nymph found on this machine.
type Process struct {
	PID        int       `json:"pid"`
	PPID       int       `json:"ppid"`
	UID        int       `json:"uid"`
	Exe        string    `json:"exe"`
	Args       []string  `json:"args"`
	ConfigPath string    `json:"configPath,omitempty"`
	StartedAt  time.Time `json:"startedAt"`
	// startTicks identifies this incarnation of PID, so a recycled pid is
	// never mistaken for the process that was found.
	startTicks uint64
}

// Scanner reads a proc filesystem. The zero value scans /proc for
// DefaultName and skips the calling process.
type Scanner struct {
	ProcRoot string
	Name     string
}

func (s Scanner) root() string {
	if s.ProcRoot == "" {
		return "/proc"
	}
	return s.ProcRoot
}

func (s Scanner) name() string {
	if s.Name == "" {
		return DefaultName
	}
	return s.Name
}

// Find returns every live process whose executable or argv[0] base name is
// the scanner's name, ordered by pid. Processes that vanish mid-scan or that
// cannot be read are skipped.
func (s Scanner) Find(ctx context.Context) ([]Process, error) {
	entries, err := os.ReadDir(s.root())
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	boot, err := bootTime(s.root())
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	out := []Process{}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		p, ok := s.read(pid, boot)
		if ok {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

// read inspects one pid; ok is false when it is not a live nymph.
func (s Scanner) read(pid int, boot time.Time) (Process, bool) {
	dir := filepath.Join(s.root(), strconv.Itoa(pid))
	st, err := readStat(dir)
	if err != nil || st.state == 'Z' || st.state == 'X' {
		return Process{}, false
	}
	raw, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return Process{}, false
	}
	args := splitCmdline(raw)
	exe, _ := os.Readlink(filepath.Join(dir, "exe"))
	// A binary replaced on disk (an over-the-air update) reads "(deleted)".
	exe = strings.TrimSuffix(exe, " (deleted)")
	name := s.name()
	argv0 := ""
	if len(args) > 0 {
		argv0 = filepath.Base(args[0])
	}
	if filepath.Base(exe) != name && argv0 != name {
		return Process{}, false
	}
	cfg := configFlag(args)
	if cfg != "" && !filepath.IsAbs(cfg) {
		// A relative --config is relative to the daemon's working directory.
		if cwd, err := os.Readlink(filepath.Join(dir, "cwd")); err == nil {
			cfg = filepath.Join(cwd, cfg)
		}
	}
	p := Process{
		PID:        pid,
		PPID:       st.ppid,
		UID:        readUID(dir),
		Exe:        exe,
		Args:       args,
		ConfigPath: cfg,
		StartedAt:  boot.Add(time.Duration(st.startTicks) * time.Second / clockTicks),
		startTicks: st.startTicks,
	}
	if p.Exe == "" && len(args) > 0 {
		p.Exe = args[0]
	}
	return p, true
}

// Alive reports whether the same incarnation of p is still running (not
// exited, not a zombie, pid not recycled).
func (s Scanner) Alive(p Process) bool {
	st, err := readStat(filepath.Join(s.root(), strconv.Itoa(p.PID)))
	if err != nil {
		return false
	}
	return st.state != 'Z' && st.state != 'X' && st.startTicks == p.startTicks
}

type stat struct {
	state      byte
	ppid       int
	startTicks uint64
}

// readStat parses /proc/<pid>/stat. The command name sits in parentheses
// and may itself contain spaces and parentheses, so fields are counted from
// the last ')'.
func readStat(dir string) (stat, error) {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return stat{}, err
	}
	return parseStat(b)
}

func parseStat(b []byte) (stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, errors.New("stat: no command name")
	}
	// Fields after the name: 3 state, 4 ppid, ... 22 starttime.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return stat{}, fmt.Errorf("stat: %d fields after the name", len(f))
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return stat{}, fmt.Errorf("stat ppid: %w", err)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return stat{}, fmt.Errorf("stat starttime: %w", err)
	}
	if len(f[0]) != 1 {
		return stat{}, fmt.Errorf("stat state %q", f[0])
	}
	return stat{state: f[0][0], ppid: ppid, startTicks: start}, nil
}

func splitCmdline(raw []byte) []string {
	raw = bytes.TrimRight(raw, "\x00")
	if len(raw) == 0 {
		return []string{}
	}
	parts := bytes.Split(raw, []byte{0})
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = string(p)
	}
	return out
}

// configFlag returns the value of --config in args, if any.
func configFlag(args []string) string {
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return ""
		case a == "--config":
			if i+1 < len(args) {
				return args[i+1]
			}
		case strings.HasPrefix(a, "--config="):
			return strings.TrimPrefix(a, "--config=")
		}
	}
	return ""
}

func readUID(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Uid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) > 0 {
			if uid, err := strconv.Atoi(f[0]); err == nil {
				return uid
			}
		}
	}
	return -1
}

func bootTime(root string) (time.Time, error) {
	b, err := os.ReadFile(filepath.Join(root, "stat"))
	if errors.Is(err, fs.ErrNotExist) {
		return time.Time{}, fmt.Errorf("%s/stat is missing: finding local daemons needs a Linux proc filesystem", root)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("read boot time: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "btime "); ok {
			secs, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("parse btime: %w", err)
			}
			return time.Unix(secs, 0), nil
		}
	}
	return time.Time{}, fmt.Errorf("%s/stat has no btime line", root)
}
