package scale

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// latencies is one figure's samples; it sorts them once, when first read.
type latencies struct {
	ds     []time.Duration
	sorted bool
}

func newLatencies(capacity int) *latencies {
	return &latencies{ds: make([]time.Duration, 0, capacity)}
}

func (l *latencies) add(d time.Duration) {
	l.ds = append(l.ds, d)
	l.sorted = false
}

func (l *latencies) len() int { return len(l.ds) }

// quantile is the q-quantile (0 < q <= 1) by nearest rank: the smallest
// sample with at least q of all the samples at or below it, so a p99 of 100
// samples is the 99th, never an interpolation between two. It is 0 when
// there are no samples.
func (l *latencies) quantile(q float64) time.Duration {
	if len(l.ds) == 0 {
		return 0
	}
	if !l.sorted {
		slices.Sort(l.ds)
		l.sorted = true
	}
	// ceil(q·n), less a hair: 0.99·100 is 99.00000000000001 in floats.
	rank := int(math.Ceil(q*float64(len(l.ds)) - 1e-9))
	return l.ds[min(max(rank, 1), len(l.ds))-1]
}

// pacer paces an open-loop sender: however late its caller looks, due says
// how many sends the rate asks for by now that have not been made, so a
// stalled ticker is caught up instead of lowering the rate.
type pacer struct {
	rate  float64 // sends a second
	start time.Time
	sent  int64
}

func newPacer(rate float64, start time.Time) *pacer { return &pacer{rate: rate, start: start} }

// due counts as sent, and returns, the sends owed at now.
func (p *pacer) due(now time.Time) int {
	owed := int64(now.Sub(p.start).Seconds() * p.rate)
	n := max(owed-p.sent, 0)
	p.sent += n
	return int(n)
}

// procStat is what the benchmark reads of a process in /proc.
type procStat struct {
	// CPU is utime+stime.
	CPU time.Duration
	// RSS is VmRSS, HWM VmHWM (the peak RSS), in bytes.
	RSS, HWM int64
}

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat:
// 100 on every Linux architecture this runs on (sysconf needs cgo).
const clockTick = 10 * time.Millisecond

// readProc reads pid's CPU time and memory from /proc.
func readProc(pid int) (procStat, error) {
	var ps procStat
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ps, fmt.Errorf("cpu of pid %d: %w", pid, err)
	}
	if ps.CPU, err = parseStatCPU(string(b)); err != nil {
		return ps, fmt.Errorf("cpu of pid %d: %w", pid, err)
	}
	b, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ps, fmt.Errorf("memory of pid %d: %w", pid, err)
	}
	if ps.RSS, ps.HWM, err = parseStatusMem(string(b)); err != nil {
		return ps, fmt.Errorf("memory of pid %d: %w", pid, err)
	}
	return ps, nil
}

// parseStatCPU reads utime+stime from a /proc/PID/stat line. The command
// name in parentheses may hold spaces and parentheses, so the fields are
// counted from the last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command name", stat)
	}
	// After ") " come state (field 3) ... utime (14) and stime (15).
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("stat %q: %d fields after the name, want at least 13", stat, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat: utime/stime %q: %w", s, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * clockTick, nil
}

// parseStatusMem reads VmRSS and VmHWM (in kB) from /proc/PID/status.
func parseStatusMem(status string) (rss, hwm int64, err error) {
	found := 0
	for line := range strings.SplitSeq(status, "\n") {
		var dst *int64
		switch {
		case strings.HasPrefix(line, "VmRSS:"):
			dst = &rss
		case strings.HasPrefix(line, "VmHWM:"):
			dst = &hwm
		default:
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			return 0, 0, fmt.Errorf("status line %q: no value", line)
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("status line %q: %w", line, err)
		}
		*dst = kb << 10
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("status: VmRSS and VmHWM not both there")
	}
	return rss, hwm, nil
}

// machineBusy is the CPU time every core of the machine has spent busy
// (all but idle and iowait), from the first line of /proc/stat: with it a
// phase says how much of the machine other work took, on a shared host.
func machineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("machine cpu: %w", err)
	}
	return parseMachineBusy(string(b))
}

// parseMachineBusy reads "cpu user nice system idle iowait irq softirq
// steal ..." (guest time is already in user).
func parseMachineBusy(stat string) (time.Duration, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat %q: want the cpu line with 8 counters", line)
	}
	var ticks int64
	for i, s := range f[1:9] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat counter %q: %w", s, err)
		}
		if i != 3 && i != 4 { // idle, iowait
			ticks += v
		}
	}
	return time.Duration(ticks) * clockTick, nil
}
