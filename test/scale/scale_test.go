//go:build scale

package scale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
	"nymph/test/realparts"
	"nymph/test/wait"
)

// Phases of one fleet, each short so that the whole benchmark stays under
// ten minutes on two cores.
const (
	phaseDispatch   = 0 // 100 execs/s: dispatch and round-trip latency
	phaseThroughput = 1 // 1,000 execs/s: what finishes under overload
	phaseCross      = 2 // replicas: queued at A for daemons polling B
	phases          = 3

	dispatchRate   = 100
	throughputRate = 1000

	registerTimeout = 3 * time.Minute
	// An exec a missed wake-up leaves to its poll's timeout arrives within
	// 20 s: a drain longer than that counts it late, not lost.
	drainDispatch = 30 * time.Second
	// After the 1,000/s window the backlog gets this long to drain; what
	// is left then is reported as left, not as lost (an overloaded
	// control plane may simply be that far behind).
	drainThroughput = 20 * time.Second
	// fdMargin is what the test process needs beside the daemons'
	// connections: the operator's, the binaries', the logs'.
	fdMargin = operatorConns + 256
)

// config is the benchmark's knobs, from the environment.
type config struct {
	ns       []int
	seconds  time.Duration // the 100/s phase; the 1,000/s one is half
	replicas int           // daemons of the two-replica run; 0 skips it
}

func readConfig(t *testing.T) config {
	t.Helper()
	c := config{ns: []int{1000, 10000, 15000}, seconds: 20 * time.Second, replicas: 10000}
	if v := os.Getenv("SCALE_NS"); v == "0" {
		c.ns = nil // the replicas only
	} else if v != "" {
		c.ns = nil
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 {
				t.Fatalf("SCALE_NS=%q: want a comma-separated list of fleet sizes, such as 1000,10000, or 0 for none", v)
			}
			c.ns = append(c.ns, n)
		}
	}
	if v := os.Getenv("SCALE_SECONDS"); v != "" {
		s, err := strconv.ParseFloat(v, 64)
		if err != nil || s < 2 {
			t.Fatalf("SCALE_SECONDS=%q: want the length of the 100 execs/s phase in seconds, at least 2", v)
		}
		c.seconds = time.Duration(s * float64(time.Second))
	}
	if v := os.Getenv("SCALE_REPLICAS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n == 1 {
			t.Fatalf("SCALE_REPLICAS=%q: want the fleet size of the two-replica run (at least 2), or 0 to skip it", v)
		}
		c.replicas = n
	}
	return c
}

// raiseFDLimit raises this process's open-file limit to its hard limit
// (the control plane, a Go program, raises its own) and returns it.
func raiseFDLimit(t *testing.T) int {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("getrlimit: %v", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatalf("setrlimit NOFILE to %d: %v", lim.Max, err)
		}
	}
	return int(lim.Cur)
}

// TestScale is `make bench-scale`: for each fleet size a fresh `lakeshore
// serve` on SQLite, then two replicas on one PostgreSQL. It prints figures;
// it fails only on a broken run (nothing registered, a control plane that
// died), never on a missed target.
func TestScale(t *testing.T) {
	cfg := readConfig(t)
	fds := raiseFDLimit(t)
	fmt.Printf("\nfleet scale benchmark: fleets %v on SQLite, then %d daemons on two replicas (0: skipped); open files %d\n", cfg.ns, cfg.replicas, fds)
	fmt.Printf("phases: register (every daemon says hello at once; until all are answered, at most %v)\n", registerTimeout)
	fmt.Printf("        dispatch: %d execs/s for %v (drain at most %v)\n", dispatchRate, cfg.seconds, drainDispatch)
	fmt.Printf("        throughput: %d execs/s for %v (drain at most %v)\n", throughputRate, cfg.seconds/2, drainThroughput)
	fmt.Printf("        replicas: %d execs/s for %v queued at A for daemons polling B (drain at most %v)\n\n", dispatchRate, cfg.seconds, drainDispatch)

	fmt.Printf("machine before: %s\n", machineLoad())
	var runs []*runResult
	for _, n := range cfg.ns {
		if need := n + fdMargin; need > fds {
			fmt.Printf("N=%d skipped: it needs about %d open files in this process (%d connections and %d more), the limit is %d\n", n, need, n, fdMargin, fds)
			continue
		}
		t.Run(fmt.Sprintf("sqlite-%d", n), func(t *testing.T) {
			runs = append(runs, runSQLite(t, cfg, n))
		})
	}
	if len(cfg.ns) > 0 {
		printRuns(os.Stdout, runs)
	}
	fmt.Printf("machine after the fleets: %s\n", machineLoad())

	if cfg.replicas > 0 {
		n := cfg.replicas
		if max := fds - 2*fdMargin; n > max {
			fmt.Printf("two replicas: %d daemons instead of %d: this process holds one connection per daemon and has %d open files\n", max, n, fds)
			n = max
		}
		t.Run(fmt.Sprintf("replicas-%d", n), func(t *testing.T) {
			printReplicas(os.Stdout, runReplicas(t, cfg, n))
		})
		fmt.Printf("machine after the replicas: %s\n", machineLoad())
	}
}

// machineLoad is the load average and the CPU pressure (the share of time
// runnable tasks waited for a CPU), for a reader to judge the figures of
// a shared machine by.
func machineLoad() string {
	load, _ := os.ReadFile("/proc/loadavg")
	psi, err := os.ReadFile("/proc/pressure/cpu")
	f := strings.Fields(string(load))
	out := "load average " + strings.Join(f[:min(3, len(f))], " ")
	if err == nil {
		line, _, _ := strings.Cut(string(psi), "\n")
		out += "; cpu pressure " + line
	}
	return out
}

// bench is one fleet against one or more control planes.
type bench struct {
	t   *testing.T
	cps []*harness.ControlPlane
	tr  *tracker
	c   *counters
	f   *fleet
	op  *operator
	// cancel stops the daemons and the operator.
	cancel context.CancelFunc
	ctx    context.Context
}

// startBench makes a fleet token through cps[0] and n daemons split
// evenly between cps, waiting for boot.
func startBench(t *testing.T, cps []*harness.ControlPlane, n, execs int) *bench {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b := &bench{t: t, cps: cps, tr: newTracker(phases, execs), c: &counters{}, ctx: ctx, cancel: cancel}
	client, err := opclient.New(cps[0].URL, cps[0].AdminToken, opclient.Options{HTTPClient: operatorHTTP()})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := client.CreateToken(ctx, operatorapi.TokenRequest{Kind: operatorapi.TokenDaemon, Fleet: true, Label: "scale"})
	if err != nil {
		t.Fatalf("create the fleet token: %v", err)
	}
	addrs := make([]string, len(cps))
	for i, cp := range cps {
		addrs[i] = cp.Addr
	}
	b.f, err = newFleet(b.tr, b.c, n, addrs, tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	b.op = &operator{client: client, tr: b.tr, c: b.c}
	b.f.run(ctx)
	// Runs before the control planes' own cleanups (which find them
	// killed already): the held polls end when the servers are gone.
	t.Cleanup(b.stop)
	return b
}

// dead names a control plane that has exited, "" while all run.
func (b *bench) dead() string {
	for i, cp := range b.cps {
		select {
		case <-cp.Done():
			return fmt.Sprintf("control plane %d (pid %d) died; its log ends:\n%s", i, cp.PID(), tail(cp.Log(), 3000))
		default:
		}
	}
	return ""
}

func (b *bench) mustLive() {
	b.t.Helper()
	if d := b.dead(); d != "" {
		b.t.Fatal(d)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// sample is the /proc figures of one instant: every control plane's,
// then this process's, and the machine's busy time.
type sample struct {
	procs []procStat
	busy  time.Duration
	at    time.Time
}

func (b *bench) sample() sample {
	b.t.Helper()
	s := sample{procs: make([]procStat, 0, len(b.cps)+1), at: time.Now()}
	for _, cp := range b.cps {
		ps, err := readProc(cp.PID())
		if err != nil {
			b.mustLive()
			b.t.Fatal(err)
		}
		s.procs = append(s.procs, ps)
	}
	self, err := readProc(os.Getpid())
	if err != nil {
		b.t.Fatal(err)
	}
	s.procs = append(s.procs, self)
	if s.busy, err = machineBusy(); err != nil {
		b.t.Fatal(err)
	}
	return s
}

// cores is the CPU used between two samples, in cores: for each process
// (the control planes, then this one), then for everything else on the
// machine.
func cores(from, to sample) []float64 {
	wall := to.at.Sub(from.at).Seconds()
	out := make([]float64, 0, len(from.procs)+1)
	var ours time.Duration
	for i := range from.procs {
		d := to.procs[i].CPU - from.procs[i].CPU
		ours += d
		out = append(out, d.Seconds()/wall)
	}
	return append(out, max(to.busy-from.busy-ours, 0).Seconds()/wall)
}

// register boots the fleet and waits until every daemon is registered and
// polling; it returns the time to register all of them (to the last hello
// answered) and the CPU used meanwhile.
func (b *bench) register() (time.Duration, int, []float64) {
	b.t.Helper()
	n := int64(len(b.f.daemons))
	before := b.sample()
	t0 := b.tr.now()
	b.f.boot()
	wait.Until(registerTimeout, func() bool { return b.dead() != "" || b.f.registered.Load() == n })
	b.mustLive()
	got := b.f.registered.Load()
	if got == 0 {
		b.t.Fatalf("no daemon of %d registered in %v; errors: %v; last: %s", n, registerTimeout, b.c, lastErr(b.c))
	}
	took := time.Duration(b.f.lastHello.Load()) - t0
	cpu := cores(before, b.sample())
	// Every registered daemon has its first poll out before load starts.
	wait.Until(30*time.Second, func() bool { return b.f.polling.Load() >= b.f.registered.Load() })
	return took, int(got), cpu
}

// The hellos are answered by the time register returns, but the fleet's
// first polls are still being served: each is a full one (recorded, then
// the claim and the take), and thousands of them queue behind one another
// for seconds after the last hello (on PostgreSQL, for the pool). Execs
// offered meanwhile measure the boot, which "time to register all"
// already reports, not dispatch; so the phases wait until every control
// plane has gone quiet, under settleCores over one settleWindow (an idle
// fleet of 10,000 costs a few hundredths of a core).
const (
	settleCores   = 0.25
	settleWindow  = time.Second
	settleTimeout = time.Minute
)

// settle waits for the control planes to go quiet after the boot and
// returns how long that took, and whether they did within settleTimeout.
func (b *bench) settle() (time.Duration, bool) {
	b.t.Helper()
	t0 := time.Now()
	prev := b.sample()
	quiet := wait.Until(settleTimeout, func() bool {
		if b.dead() != "" {
			return true
		}
		now := b.sample()
		if now.at.Sub(prev.at) < settleWindow {
			return false
		}
		c := cores(prev, now)
		prev = now
		for _, v := range c[:len(b.cps)] {
			if v >= settleCores {
				return false
			}
		}
		return true
	})
	b.mustLive()
	return time.Since(t0), quiet
}

// settled is a settle's outcome as printed.
func settled(d time.Duration, quiet bool) string {
	s := fmt.Sprintf("%.2f s", d.Seconds())
	if !quiet {
		s += fmt.Sprintf(" (not quiet within %v)", settleTimeout)
	}
	return s
}

func lastErr(c *counters) string {
	if p := c.lastErr.Load(); p != nil {
		return *p
	}
	return "none"
}

// phaseResult is one offer window and its figures.
type phaseResult struct {
	w      window
	st     phaseStats
	cpu    []float64 // cores: per control plane, this process, the rest of the machine
	errors int64     // request errors from the window's start to the drain's end
}

// run offers rate execs a second for dur to targets as phase, then waits
// for them to drain (at most drain).
func (b *bench) run(phase int, rate float64, dur time.Duration, targets []string, drain time.Duration) phaseResult {
	b.t.Helper()
	b.mustLive()
	errs0 := b.c.total()
	before := b.sample()
	w := b.op.offer(b.ctx, phase, rate, dur, targets)
	cpu := cores(before, b.sample())
	wait.Until(drain, func() bool { return b.dead() != "" || (b.op.idle() && b.tr.drained(phase)) })
	b.mustLive()
	return phaseResult{w: w, st: b.tr.stats(phase, w.end), cpu: cpu, errors: b.c.total() - errs0}
}

// stop ends the daemons: the context first, so that the errors of the
// held polls cut by the servers' deaths are not counted, then the servers.
func (b *bench) stop() {
	b.cancel()
	for _, cp := range b.cps {
		cp.Kill()
	}
	b.f.wait()
}

// shuffled returns ids without the empty ones, in a fixed random order.
func shuffled(ids []string) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if id != "" {
			out = append(out, id)
		}
	}
	r := rand.New(rand.NewPCG(13, 13))
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// runResult is one fleet on one control plane with SQLite.
type runResult struct {
	n, registered int
	register      time.Duration
	cpuRegister   []float64
	// settle is how long the control plane took to go quiet after the
	// boot (see settle), quiet whether it did.
	settle     time.Duration
	quiet      bool
	dispatch   phaseResult
	throughput phaseResult
	mem        procStat
	// errors is every request error of the run, plus the execs of the
	// 100/s phase never delivered.
	errors      int64
	errDetail   string
	redelivered int
	dials       int
}

func runSQLite(t *testing.T, cfg config, n int) *runResult {
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	execs := int(cfg.seconds.Seconds()*dispatchRate + cfg.seconds.Seconds()/2*throughputRate)
	b := startBench(t, []*harness.ControlPlane{cp}, n, execs)
	r := &runResult{n: n}
	r.register, r.registered, r.cpuRegister = b.register()
	t.Logf("N=%d: %d registered in %v", n, r.registered, r.register.Round(time.Millisecond))
	r.settle, r.quiet = b.settle()
	targets := shuffled(b.f.workerIDs())
	r.dispatch = b.run(phaseDispatch, dispatchRate, cfg.seconds, targets, drainDispatch)
	t.Logf("N=%d: dispatch phase: %d offered, p99 %v", n, r.dispatch.w.offered, r.dispatch.st.dispatch.quantile(0.99))
	r.throughput = b.run(phaseThroughput, throughputRate, cfg.seconds/2, targets, drainThroughput)
	t.Logf("N=%d: throughput phase: %d offered, %d finished in the window", n, r.throughput.w.offered, r.throughput.st.finishedBy)
	r.mem = b.sample().procs[0]
	b.stop()
	r.errors = b.c.total() + int64(r.dispatch.st.undelivered)
	r.errDetail = fmt.Sprintf("%v; @100/s never delivered %d, never finished %d; @1000/s left after the drain: undelivered %d, unfinished %d; last error: %s",
		b.c, r.dispatch.st.undelivered, r.dispatch.st.unfinished, r.throughput.st.undelivered, r.throughput.st.unfinished, lastErr(b.c))
	r.redelivered = b.tr.redelivered
	r.dials = b.f.dials()
	return r
}

// replicaResult is the two-replica run.
type replicaResult struct {
	n, registered int
	register      time.Duration
	settle        time.Duration
	quiet         bool
	cross         phaseResult
	mem           []procStat
	errors        int64
	errDetail     string
	dials         int
}

func runReplicas(t *testing.T, cfg config, n int) *replicaResult {
	pg := realparts.StartPostgres(t)
	a := harness.StartControlPlane(t, harness.CPOptions{Args: []string{"--store", pg.DSN}})
	bcp := harness.StartControlPlane(t, harness.CPOptions{Args: []string{"--store", pg.DSN}, AdminToken: a.AdminToken, DaemonToken: a.DaemonToken})
	execs := int(cfg.seconds.Seconds() * dispatchRate)
	b := startBench(t, []*harness.ControlPlane{a, bcp}, n, execs)
	r := &replicaResult{n: n}
	r.register, r.registered, _ = b.register()
	t.Logf("replicas: %d registered in %v", r.registered, r.register.Round(time.Millisecond))
	r.settle, r.quiet = b.settle()
	// The second half of the fleet polls B; the operator talks to A.
	ids := b.f.workerIDs()
	targets := shuffled(ids[n/2:])
	if len(targets) == 0 {
		t.Fatalf("no daemon of replica B registered; errors: %v; last: %s", b.c, lastErr(b.c))
	}
	r.cross = b.run(phaseCross, dispatchRate, cfg.seconds, targets, drainDispatch)
	r.mem = b.sample().procs[:2]
	b.stop()
	r.errors = b.c.total() + int64(r.cross.st.undelivered)
	r.errDetail = fmt.Sprintf("%v; never delivered %d; delivered, never finished %d; last error: %s", b.c, r.cross.st.undelivered, r.cross.st.unfinished, lastErr(b.c))
	r.dials = b.f.dials()
	return r
}
