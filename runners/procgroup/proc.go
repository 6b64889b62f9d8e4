package procgroup

import (
	"bytes"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// procStat is the part of /proc/<pid>/stat this package reads.
type procStat struct {
	state byte
	pgrp  int
}

// parseStat reads the state and the process group from the text of a
// /proc/<pid>/stat. The command name may contain spaces and parentheses,
// so fields are counted from the last ')'; the fields after it are
// numbers and a state letter, so a prefix that holds the pgrp field is
// enough (the name is at most 64 bytes).
func parseStat(pid int, b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("procgroup: malformed stat for pid %d", pid)
	}
	fields := bytes.Fields(b[i+1:])
	// state ppid pgrp ...
	if len(fields) < 3 || len(fields[0]) != 1 {
		return procStat{}, fmt.Errorf("procgroup: malformed stat for pid %d", pid)
	}
	pgrp, err := strconv.Atoi(string(fields[2]))
	if err != nil {
		return procStat{}, fmt.Errorf("procgroup: malformed stat for pid %d: %w", pid, err)
	}
	return procStat{state: fields[0][0], pgrp: pgrp}, nil
}

// statPrefix is how much of a stat file Members reads: the pid, a name of
// at most 64 bytes and the fields up to pgrp fit with room to spare.
const statPrefix = 256

// Members lists the live (not zombie, not dead) processes whose process
// group is pgid.
//
// It runs after every command (waitGone), whose result waits for it, and
// reads every process's stat: so each is read with three system calls
// into one buffer, relative to an open /proc, rather than through
// os.ReadFile (a stat, two reads, a poller registration and a finalizer
// per process), which made a scan of ~85 processes about 30% dearer.
func Members(pgid int) ([]int, error) {
	buf := make([]byte, statPrefix)
	var out []int
	err := scanFast(func(procfd int, name string, pid int) {
		n, err := readAt(procfd, name+"/stat", buf)
		if err != nil {
			return // gone meanwhile, or not ours to read
		}
		st, err := parseStat(pid, buf[:n])
		if err == nil && st.pgrp == pgid && st.state != 'Z' && st.state != 'X' {
			out = append(out, pid)
		}
	})
	return out, err
}

// readAt reads the start of file name under dirfd into buf.
func readAt(dirfd int, name string, buf []byte) (int, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Read(fd, buf)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// scanFast calls visit for every process in /proc, with an open /proc to
// read relative to.
func scanFast(visit func(procfd int, name string, pid int)) error {
	fd, err := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("procgroup: open /proc: %w", err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 32<<10)
	var names []string
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("procgroup: read /proc: %w", err)
		}
		if n <= 0 {
			break
		}
		names = names[:0]
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
		for _, name := range names {
			if pid, err := strconv.Atoi(name); err == nil && pid > 0 {
				visit(fd, name, pid)
			}
		}
	}
	return nil
}

// WithCmdline lists the live processes whose command line (arguments joined
// by NUL) contains marker. Zombies have an empty command line and never
// match.
func WithCmdline(marker string) ([]int, error) {
	m := []byte(marker)
	self := os.Getpid()
	return scan(func(pid int) bool {
		if pid == self {
			return false
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		return err == nil && bytes.Contains(b, m)
	})
}

func scan(match func(pid int) bool) ([]int, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, fmt.Errorf("procgroup: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("procgroup: read /proc: %w", err)
	}
	var out []int
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if match(pid) {
			out = append(out, pid)
		}
	}
	return out, nil
}
