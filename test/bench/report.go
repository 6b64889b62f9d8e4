//go:build bench

package bench

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// row is one line of the report: a measured figure, the baseline it is
// compared with, and the target the ratio must meet.
type row struct {
	name     string
	value    string
	baseline string
	ratio    float64
	target   string
	ok       *bool
}

type report struct {
	rows []row
}

func (r *report) add(name, value, baseline string, ratio float64, target string, ok *bool) {
	r.rows = append(r.rows, row{name, value, baseline, ratio, target, ok})
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\n%-52s %-16s %-22s %-9s %-22s %s\n", "figure", "value", "baseline", "ratio", "target", "")
	fmt.Fprintln(w, strings.Repeat("-", 130))
	for _, x := range r.rows {
		verdict := ""
		if x.ok != nil {
			verdict = "ok"
			if !*x.ok {
				verdict = "MISSED"
			}
		}
		ratio := "-"
		if x.ratio > 0 {
			ratio = fmt.Sprintf("%.3f", x.ratio)
		}
		fmt.Fprintf(w, "%-52s %-16s %-22s %-9s %-22s %s\n", x.name, x.value, x.baseline, ratio, x.target, verdict)
	}
	fmt.Fprintln(w)
}

func boolp(b bool) *bool { return &b }

// timeN runs f n times and returns the median duration.
func timeN(t testing.TB, n int, f func() error) time.Duration {
	t.Helper()
	ds := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("iteration %d: %v", i, err)
		}
		ds = append(ds, time.Since(start))
	}
	return median(ds)
}

// timeOnce runs f once and returns how long it took.
func timeOnce(t testing.TB, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	if err := f(); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// median is the middle of ds.
func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func bashTrue() error { return exec.Command("bash", "-c", "true").Run() }

// rssKB reads VmRSS of a process.
func rssKB(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// cpuTicks is utime+stime of a process in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st, nil
}

// procCPU is the CPU time (user and system) of a process, and of its
// children it has reaped.
func procCPU(pid int) (self, children time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var v [4]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[11+i], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat field %d: %w", pid, 14+i, err)
		}
	}
	// Clock ticks: USER_HZ is 100 on every Linux this runs on.
	tick := 10 * time.Millisecond
	return time.Duration(v[0]+v[1]) * tick, time.Duration(v[2]+v[3]) * tick, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
