package procgroup

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// procStat is the part of /proc/<pid>/stat this package reads.
type procStat struct {
	state byte
	pgrp  int
}

// readStat parses /proc/<pid>/stat. The command name may contain spaces and
// parentheses, so fields are counted from the last ')'.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
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

// Members lists the live (not zombie, not dead) processes whose process
// group is pgid.
func Members(pgid int) ([]int, error) {
	return scan(func(pid int) bool {
		st, err := readStat(pid)
		return err == nil && st.pgrp == pgid && st.state != 'Z' && st.state != 'X'
	})
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
