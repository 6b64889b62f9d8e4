package scale

import (
	"os"
	"testing"
	"time"
)

func TestQuantileNearestRank(t *testing.T) {
	l := newLatencies(100)
	if got := l.quantile(0.99); got != 0 {
		t.Fatalf("no samples: p99 %v, want 0", got)
	}
	// 100 samples 1..100 ms, added out of order.
	for i := 100; i >= 1; i-- {
		l.add(time.Duration(i) * time.Millisecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{
		{0.5, 50 * time.Millisecond},
		{0.99, 99 * time.Millisecond},
		{1, 100 * time.Millisecond},
		{0.001, 1 * time.Millisecond},
	} {
		if got := l.quantile(tc.q); got != tc.want {
			t.Errorf("q %v of 1..100 ms: %v, want %v", tc.q, got, tc.want)
		}
	}
	// A sample added after a read is counted in the next one.
	l.add(0)
	if got := l.quantile(0.001); got != 0 {
		t.Errorf("after adding 0: min %v, want 0", got)
	}
	one := newLatencies(1)
	one.add(7 * time.Millisecond)
	if got := one.quantile(0.99); got != 7*time.Millisecond {
		t.Errorf("one sample: p99 %v, want it", got)
	}
}

func TestPacerCatchesUp(t *testing.T) {
	start := time.Unix(1000, 0)
	p := newPacer(100, start)
	if n := p.due(start); n != 0 {
		t.Fatalf("at start: %d due, want 0", n)
	}
	if n := p.due(start.Add(15 * time.Millisecond)); n != 1 {
		t.Fatalf("after 15 ms at 100/s: %d due, want 1", n)
	}
	// The same instant owes nothing more.
	if n := p.due(start.Add(15 * time.Millisecond)); n != 0 {
		t.Fatalf("asked twice: %d due, want 0", n)
	}
	// A caller stalled for a second is owed the whole second at once.
	if n := p.due(start.Add(1015 * time.Millisecond)); n != 100 {
		t.Fatalf("after a stall to 1.015 s: %d due, want 100", n)
	}
	if p.sent != 101 {
		t.Fatalf("sent %d, want 101", p.sent)
	}
	// A clock read before the start owes nothing, and takes nothing back.
	if n := p.due(start.Add(-time.Second)); n != 0 || p.sent != 101 {
		t.Fatalf("before the start: %d due, sent %d", n, p.sent)
	}
}

func TestParseProc(t *testing.T) {
	// The command name may hold spaces and parentheses.
	stat := "4242 (lake (shore) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 1 2 3"
	cpu, err := parseStatCPU(stat)
	if err != nil || cpu != 3250*time.Millisecond {
		t.Fatalf("cpu of %q: %v, %v; want 3.25s", stat, cpu, err)
	}
	if _, err := parseStatCPU("4242 (x) S 1 2"); err == nil {
		t.Fatal("a short stat line was read")
	}
	rss, hwm, err := parseStatusMem("Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n")
	if err != nil || rss != 1<<20 || hwm != 2<<20 {
		t.Fatalf("status: rss %d hwm %d, %v", rss, hwm, err)
	}
	if _, _, err := parseStatusMem("VmRSS:\t1 kB\n"); err == nil {
		t.Fatal("a status without VmHWM was read")
	}
	busy, err := parseMachineBusy("cpu  100 5 20 9000 50 1 2 3 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
	if err != nil || busy != 1310*time.Millisecond {
		t.Fatalf("machine busy: %v, %v; want 1.31s (idle and iowait left out)", busy, err)
	}
	if _, err := parseMachineBusy("intr 1 2 3\n"); err == nil {
		t.Fatal("a /proc/stat without its cpu line was read")
	}
	if _, err := machineBusy(); err != nil {
		t.Fatal(err)
	}
	// And the real thing: this process uses some CPU and memory.
	ps, err := readProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if ps.RSS <= 0 || ps.HWM < ps.RSS {
		t.Fatalf("this process: rss %d hwm %d", ps.RSS, ps.HWM)
	}
}
