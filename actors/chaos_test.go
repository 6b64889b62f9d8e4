package actors_test

// The chaos run: jobs of every kind (short, streaming and timing-out execs,
// runs, setups) on one daemon, real child processes all, while a monkey
// crashes and stops its actors at random; then every job is accounted for.
// TestChaos is the short run of make test; TestChaosSoak is the same run
// sized up, for make chaos. Both live here, beside the harness they share,
// because the daemon under test is the actor tree itself, built the way
// the harness builds it (a program under test/ would need a second harness).

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"nymph/actors"
	"nymph/actors/execs"
	"nymph/actors/invocations"
	"nymph/actors/ledger"
	"nymph/actors/metrics"
	"nymph/daemon/orphans"
	"nymph/messages"
	"nymph/test/fakecp"
	"nymph/test/wait"
)

// poison makes any actor of the tree panic: the chaos middleware below is
// the only place that knows it, so production code carries no test hook.
type poison struct{}

func poisonMiddleware(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
		if _, ok := env.Message.(*poison); ok {
			panic("chaos: poisoned")
		}
		next(c, env)
	}
}

func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos test skipped in -short mode")
	}
	r := runChaos(t, chaosConfig{
		mix:            chaosMix{kindExec: 110, kindStream: 45, kindTimeout: 35, kindRun: 45, kindSetup: 20},
		seed:           1,
		maxInvocations: 64,
		killEvery:      10 * time.Millisecond,
		stall:          30 * time.Second,
	})
	t.Log(r)
	r.check(t)
	// Setups ran in FIFO order (an interrupted one runs again right away).
	var want []string
	for i := range r.cfg.mix[kindSetup] {
		want = append(want, strconv.Itoa(i))
	}
	if got := strings.Join(r.setupOrder, ","); got != strings.Join(want, ",") {
		t.Fatalf("setup order %s, want %s", got, strings.Join(want, ","))
	}
	if r.outcomes["exec ok"] == 0 || r.outcomes["timeout -2"] == 0 || r.outcomes["run succeeded"] == 0 {
		// Not a failure: runChaos checked the normal outcomes once the
		// monkey stopped.
		t.Logf("the storm left some kind no normal outcome (a loaded machine): %v", r.outcomes)
	}
	wait.For(t, 10*time.Second, "no child process alive", func() bool { return len(children()) == 0 })
}

// TestChaosSoak is make chaos: CHAOS_JOBS jobs (10,000 there) in the mix of
// soakMix. Its knobs come from the environment: CHAOS_JOBS, CHAOS_SEED
// (default: from the clock; printed, for a rerun), CHAOS_MAX_INVOCATIONS
// (permits, default 48), CHAOS_KILL_EVERY (mean pause between two blows of
// the monkey, default 150ms), CHAOS_LOG (where the daemon's log goes,
// default a file in the temp dir, removed when the soak passes).
func TestChaosSoak(t *testing.T) {
	jobs := envInt(t, "CHAOS_JOBS", 0)
	if jobs <= 0 {
		t.Skip("the soak runs with CHAOS_JOBS set: make chaos")
	}
	seed := uint64(envInt(t, "CHAOS_SEED", int(time.Now().UnixNano()%1e6)))
	every := 150 * time.Millisecond
	if v := os.Getenv("CHAOS_KILL_EVERY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("CHAOS_KILL_EVERY=%q: want a positive duration such as 150ms", v)
		}
		every = d
	}
	logPath := os.Getenv("CHAOS_LOG")
	keepLog := logPath != ""
	if logPath == "" {
		logPath = filepath.Join(os.TempDir(), fmt.Sprintf("nymph-chaos-%d.log", seed))
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()

	permits := envInt(t, "CHAOS_MAX_INVOCATIONS", 48)
	if permits < 0 {
		t.Fatalf("CHAOS_MAX_INVOCATIONS=%d: want 0 (unbounded) or more", permits)
	}
	r := runChaos(t, chaosConfig{
		mix:            soakMix(jobs),
		seed:           seed,
		maxInvocations: permits,
		killEvery:      every,
		stall:          60 * time.Second,
		log:            logFile,
	})
	t.Log(r)
	if r.failed() {
		t.Logf("the daemon's log: %s", logPath)
	} else if !keepLog {
		_ = os.Remove(logPath)
	}
	r.check(t)
}

// soakMix splits n jobs: 40% short execs, 15% streaming, 5% timing out,
// 30% runs, the rest (10%) setups.
func soakMix(n int) chaosMix {
	m := chaosMix{kindExec: n * 40 / 100, kindStream: n * 15 / 100, kindTimeout: n * 5 / 100, kindRun: n * 30 / 100}
	m[kindSetup] = n - m[kindExec] - m[kindStream] - m[kindTimeout] - m[kindRun]
	return m
}

func envInt(t *testing.T, key string, def int) int {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: want an integer", key, v)
	}
	return n
}

type jobKind int

const (
	kindExec jobKind = iota
	kindStream
	kindTimeout
	kindRun
	kindSetup
	nKinds
)

var kindNames = [nKinds]string{"exec", "streaming", "timeout", "run", "setup"}

// chaosMix is how many jobs of each kind a run sends.
type chaosMix [nKinds]int

func (m chaosMix) total() int {
	n := 0
	for _, k := range m {
		n += k
	}
	return n
}

type chaosConfig struct {
	mix  chaosMix
	seed uint64
	// maxInvocations is the daemon's permits (0: unbounded); each poll
	// also takes at most this many commands, so that permits bound the
	// running jobs (a poll takes a whole batch whatever the free permits).
	maxInvocations int
	// killEvery is the mean pause between two blows of the monkey.
	killEvery time.Duration
	// stall is how long without a new outcome before the jobs still
	// without one are counted as lost.
	stall time.Duration
	// log takes every line the daemon logs; nil: warnings and errors go
	// to t.Log.
	log io.Writer
}

// Env keys of the marks: every process of the run carries the run's mark,
// which the test process puts in its own environment; exec and run
// processes also carry their job's, so that a job is counted once however
// many processes it has. A setup has no env of its own: its processes are
// told apart by process group, which each job leads.
const (
	runMarkKey = "NYMPH_CHAOS_RUN"
	jobMarkKey = "NYMPH_CHAOS_JOB"
)

// chaosJob is one job of the plan.
type chaosJob struct {
	kind jobKind
	// id is the exec id, the invocation id, or the setup's command id.
	id string
	// want is the output of a job that ends normally: stdout, streamed
	// bytes or result bytes ("" for no check).
	want string
	// setupN is the setup's place in the FIFO.
	setupN int
}

// chaosReport is what a run found.
type chaosReport struct {
	cfg     chaosConfig
	elapsed time.Duration
	// kindsDone is when the last job of each kind had its outcome.
	kindsDone                    [nKinds]time.Duration
	lost, duplicated, orphaned   int
	lostIDs, dupIDs, orphanedIDs []string
	// wrong lists outcomes that contradict their job (an exec that should
	// time out exiting 0, output that is not the job's).
	wrong []string
	// metricsWrong lists where the daemon's metrics file disagrees with
	// what the control plane received.
	metricsWrong []string
	goroutines   int
	crashes      int64
	stops        int64
	outcomes     map[string]int
	setupOrder   []string
	stacks       string
}

func (r *chaosReport) failed() bool {
	return r.lost+r.duplicated+r.orphaned > 0 || len(r.wrong) > 0 || len(r.metricsWrong) > 0 || r.goroutines > goroutineSlack
}

func (r *chaosReport) String() string {
	var b strings.Builder
	total := r.cfg.mix.total()
	var parts []string
	for k, n := range r.cfg.mix {
		parts = append(parts, fmt.Sprintf("%d %s", n, kindNames[k]))
	}
	fmt.Fprintf(&b, "chaos: %d jobs (%s) in %.0fs = %.1f jobs/s; lost %d, duplicated %d, orphaned %d; goroutines %+d; actor kills %d (crash %d, stop %d)",
		total, strings.Join(parts, ", "), r.elapsed.Seconds(), float64(total)/r.elapsed.Seconds(),
		r.lost, r.duplicated, r.orphaned, r.goroutines, r.crashes+r.stops, r.crashes, r.stops)
	keys := make([]string, 0, len(r.outcomes))
	for k := range r.outcomes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var outs []string
	for _, k := range keys {
		outs = append(outs, fmt.Sprintf("%s %d", k, r.outcomes[k]))
	}
	var done []string
	for k, d := range r.kindsDone {
		if d > 0 {
			done = append(done, fmt.Sprintf("%s %.0fs", kindNames[k], d.Seconds()))
		}
	}
	fmt.Fprintf(&b, "\n  outcomes: %s; wrong %d\n  all in: %s; seed %d, max_invocations %d, a blow every %v on average",
		strings.Join(outs, ", "), len(r.wrong), strings.Join(done, ", "), r.cfg.seed, r.cfg.maxInvocations, r.cfg.killEvery)
	for _, l := range []struct {
		what string
		ids  []string
	}{{"lost", r.lostIDs}, {"duplicated", r.dupIDs}, {"orphaned", r.orphanedIDs}, {"wrong", r.wrong}, {"metrics file", r.metricsWrong}} {
		if len(l.ids) > 0 {
			fmt.Fprintf(&b, "\n  %s: %s", l.what, strings.Join(first(l.ids, 20), " | "))
		}
	}
	return b.String()
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(slices.Clone(s[:n]), fmt.Sprintf("… %d more", len(s)-n))
	}
	return s
}

// check fails t unless every job had exactly one outcome, the right one,
// nothing of the run is left alive and no goroutine leaked.
func (r *chaosReport) check(t *testing.T) {
	t.Helper()
	if r.failed() {
		if r.goroutines > goroutineSlack {
			t.Errorf("goroutines %+d after the daemon stopped (slack %d)\n%s", r.goroutines, goroutineSlack, r.stacks)
		}
		t.Fatalf("chaos: lost %d, duplicated %d, orphaned %d, wrong %d, metrics file wrong %d, goroutines %+d: want 0, 0, 0, 0, 0 and at most +%d",
			r.lost, r.duplicated, r.orphaned, len(r.wrong), len(r.metricsWrong), r.goroutines, goroutineSlack)
	}
}

// goroutineSlack is how many more goroutines than before its start may be
// left once the daemon stopped and the count settled: protoactor keeps
// a few of its system's own after Shutdown, and net/http may hold a
// connection being torn down.
const goroutineSlack = 8

func runChaos(t *testing.T, cfg chaosConfig) *chaosReport {
	runMark := strconv.FormatInt(time.Now().UnixNano(), 36)
	// Every process the daemon spawns inherits it: execs through the
	// environment the shell is built with, runs and setups through the
	// process runner's.
	t.Setenv(runMarkKey, runMark)
	out := &levelFilter{next: cfg.log}
	if cfg.log == nil {
		out.next, out.min = newTestLog(t), zerolog.WarnLevel
	}
	var cpOpts []fakecp.Option
	if cfg.maxInvocations > 0 {
		cpOpts = append(cpOpts, fakecp.WithMaxBatch(cfg.maxInvocations))
	}
	h := newHarness(t, setup{
		level:  zerolog.InfoLevel,
		logTo:  out,
		cpOpts: cpOpts,
		opts:   []actors.Option{actors.WithPropsOptions(actor.WithReceiverMiddleware(poisonMiddleware))},
		settings: func(s *actors.Settings) {
			s.MaxRestarts = 1 << 20
			s.KillGrace = 100 * time.Millisecond
			s.Poll.WaitMax = 500 * time.Millisecond
			s.Poll.MaxInvocations = cfg.maxInvocations
			// The metrics writer is in the tree, and among the monkey's
			// victims; its counts are checked against the control plane's.
			s.Metrics = actors.MetricsSettings{Textfile: filepath.Join(s.Workdir, "nymph.prom"), Interval: time.Second, Version: "chaos"}
		},
		noStart: true,
	})
	orderFile := filepath.Join(h.workdir, "setup-order")
	plan := planChaos(h, cfg, orderFile)

	before := settledGoroutines(h)
	began := time.Now()
	if err := h.d.Start(); err != nil {
		t.Fatal(err)
	}
	m := startMonkey(h, cfg.seed, cfg.killEvery)
	for _, q := range plan.queue {
		q()
	}

	// Wait for an outcome of every job; when none comes for cfg.stall,
	// what is missing is lost.
	want := cfg.mix.total()
	last, lastChange := -1, time.Now()
	var kindsDone [nKinds]time.Duration
	wait.Until(24*time.Hour, func() bool {
		byKind := plan.outcomes(h)
		n := 0
		for k, got := range byKind {
			n += got
			if got == cfg.mix[k] && kindsDone[k] == 0 {
				kindsDone[k] = time.Since(began)
			}
		}
		if n != last {
			last, lastChange = n, time.Now()
		}
		return n >= want || time.Since(lastChange) > cfg.stall
	})
	elapsed := time.Since(began)
	m.halt()

	// The daemon still polls and gives each kind its normal outcome after
	// the storm: an exec exits 0, a timeout is -2, a run succeeds. (During
	// the storm a loaded machine can see every job killed first: the
	// accounting holds either way, but says nothing of the normal paths.)
	h.exec("after-chaos", "echo alive")
	h.cp.QueueExec(messages.Exec{ExecID: "after-chaos-timeout", Command: "sleep 5", TimeoutS: ptr(0.1)})
	h.cp.QueueRun(messages.Run{InvocationID: "after-chaos-run", RunConfig: messages.RunConfig{Runner: ptr("echo")},
		ArgsBlob: messages.Bytes("after")})
	if r := h.cp.WaitResult("after-chaos", 30*time.Second); r.ExitCode != 0 || r.Stdout != "alive\n" {
		t.Errorf("after chaos: %+v %s", r, errOf(r))
	}
	if r := h.cp.WaitResult("after-chaos-timeout", 30*time.Second); r.ExitCode != messages.ExitTimeout {
		t.Errorf("a timeout after chaos: %+v %s", r, errOf(r))
	}
	h.cp.Wait(30*time.Second, "the run after chaos", func() bool { return ackCounts(h.cp)["after-chaos-run"] > 0 })
	for _, a := range h.cp.Acks() {
		if a.InvocationID == "after-chaos-run" && (a.State != messages.StateSucceeded || string(a.ResultBlob) != "after") {
			t.Errorf("a run after chaos: %+v", a)
		}
	}
	h.d.Shutdown(0)
	if err := h.wait(60 * time.Second); err != nil {
		t.Errorf("daemon stopped with %v", err)
	}

	r := &chaosReport{cfg: cfg, elapsed: elapsed, kindsDone: kindsDone, crashes: m.crashes.Load(), stops: m.stops.Load(), outcomes: map[string]int{}}
	plan.account(h, r)
	r.metricsWrong = checkMetricsFile(t, h, filepath.Join(h.workdir, "nymph.prom"))
	r.setupOrder = setupOrder(t, orderFile)
	r.orphanedIDs = orphanedJobs(t, runMark)
	r.orphaned = len(r.orphanedIDs)

	var after int
	wait.Until(20*time.Second, func() bool {
		h.client.CloseIdleConnections()
		h.cp.CloseClientConnections()
		after = runtime.NumGoroutine()
		return after <= before
	})
	r.goroutines = after - before
	if r.goroutines > goroutineSlack {
		buf := make([]byte, 1<<20)
		r.stacks = string(buf[:runtime.Stack(buf, true)])
	}
	return r
}

// chaosPlan is the jobs of a run, in the order they are queued.
type chaosPlan struct {
	jobs  []chaosJob
	queue []func()
}

// planChaos makes cfg.mix's jobs, shuffled by cfg.seed; each is queued by
// a func of plan.queue (a setup's command id is known once it is queued).
func planChaos(h *harness, cfg chaosConfig, orderFile string) *chaosPlan {
	rng := rand.New(rand.NewPCG(cfg.seed, 3))
	var kinds []jobKind
	for k, n := range cfg.mix {
		for range n {
			kinds = append(kinds, jobKind(k))
		}
	}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	p := &chaosPlan{jobs: make([]chaosJob, len(kinds))}
	setups := 0
	for i, k := range kinds {
		j := &p.jobs[i]
		j.kind = k
		j.id = fmt.Sprintf("%s-%05d", kindNames[k], i)
		env := map[string]string{jobMarkKey: j.id}
		switch k {
		case kindExec:
			e := messages.Exec{ExecID: j.id, Env: env}
			switch rng.IntN(3) {
			case 0:
				e.Command = "true"
			case 1:
				e.Command, j.want = "echo "+j.id, j.id+"\n"
			default:
				e.Command, j.want = fmt.Sprintf("sleep 0.0%d; echo %s", 1+rng.IntN(9), j.id), j.id+"\n"
			}
			p.queue = append(p.queue, func() { h.cp.QueueExec(e) })
		case kindStream:
			e := messages.Exec{ExecID: j.id, Env: env,
				Command: fmt.Sprintf("for n in 1 2 3 4 5; do echo %s-$n; sleep 0.02; done", j.id),
				Log:     &messages.LogSink{StdoutURL: "/v1/daemon/exec/" + j.id + "/chunk", FlushMs: 10}}
			for n := 1; n <= 5; n++ {
				j.want += fmt.Sprintf("%s-%d\n", j.id, n)
			}
			p.queue = append(p.queue, func() { h.cp.QueueExec(e) })
		case kindTimeout:
			e := messages.Exec{ExecID: j.id, Env: env, Command: "sleep 5", TimeoutS: ptr(0.1 + 0.1*float64(rng.IntN(3)))}
			p.queue = append(p.queue, func() { h.cp.QueueExec(e) })
		case kindRun:
			r := messages.Run{InvocationID: j.id, RunConfig: messages.RunConfig{Env: env}}
			j.want = j.id
			if rng.IntN(3) == 0 {
				r.RunConfig.Runner, r.ArgsBlob = ptr("echo"), messages.Bytes(j.id)
			} else {
				r.Script = ptr(fmt.Sprintf(`sleep 0.0%d; printf %%s %s > "$NYMPH_RESULT_PATH"`, 1+rng.IntN(9), j.id))
			}
			p.queue = append(p.queue, func() { h.cp.QueueRun(r) })
		case kindSetup:
			j.setupN = setups
			setups++
			s := messages.Setup{Name: ptr(j.id), Script: fmt.Sprintf("sleep 0.0%d; echo %d >> %s", 1+rng.IntN(2), j.setupN, orderFile)}
			p.queue = append(p.queue, func() { j.id = h.cp.QueueSetup(s) })
		}
	}
	return p
}

// outcomes counts the jobs of each kind with at least one outcome so far.
func (p *chaosPlan) outcomes(h *harness) [nKinds]int {
	results, acks, setups := h.cp.Results(), ackCounts(h.cp), setupEvents(h.cp)
	var n [nKinds]int
	for _, j := range p.jobs {
		var got bool
		switch j.kind {
		case kindRun:
			got = acks[j.id] > 0
		case kindSetup:
			got = setups[j.id] > 0
		default:
			got = len(results[j.id]) > 0
		}
		if got {
			n[j.kind]++
		}
	}
	return n
}

func ackCounts(cp *fakecp.CP) map[string]int {
	m := map[string]int{}
	for _, a := range cp.Acks() {
		m[a.InvocationID]++
	}
	return m
}

// account counts each job's outcomes into r: none is lost, more than one
// duplicated, and a single one is classified and checked against the job.
func (p *chaosPlan) account(h *harness, r *chaosReport) {
	results, setups := h.cp.Results(), setupEvents(h.cp)
	acks := map[string][]messages.Ack{}
	for _, a := range h.cp.Acks() {
		acks[a.InvocationID] = append(acks[a.InvocationID], a)
	}
	for _, j := range p.jobs {
		var n int
		switch j.kind {
		case kindRun:
			n = len(acks[j.id])
		case kindSetup:
			n = setups[j.id]
		default:
			n = len(results[j.id])
		}
		switch {
		case n == 0:
			r.lost++
			r.lostIDs = append(r.lostIDs, j.id)
			continue
		case n > 1:
			r.duplicated++
			r.dupIDs = append(r.dupIDs, fmt.Sprintf("%s ×%d", j.id, n))
			continue
		}
		switch j.kind {
		case kindRun:
			r.classifyRun(j, acks[j.id][0])
		case kindSetup:
			r.outcomes["setup done"]++
		default:
			r.classifyExec(j, results[j.id][0], h.cp.Chunks(j.id))
		}
	}
}

func (r *chaosReport) classifyExec(j chaosJob, res messages.ExecResult, chunks []byte) {
	name := kindNames[j.kind]
	wrong := func(why string) {
		r.wrong = append(r.wrong, fmt.Sprintf("%s: %s (exit %d, %s)", j.id, why, res.ExitCode, errOf(res)))
	}
	switch res.ExitCode {
	case 0:
		r.outcomes[name+" ok"]++
		switch {
		case j.kind == kindTimeout:
			wrong("a timing-out exec exited 0")
		case j.kind == kindStream && string(chunks) != j.want:
			wrong(fmt.Sprintf("streamed %q", chunks))
		case j.kind == kindExec && res.Stdout != j.want:
			wrong(fmt.Sprintf("stdout %q", res.Stdout))
		}
	case messages.ExitTimeout:
		r.outcomes[name+" -2"]++
		if j.kind != kindTimeout {
			wrong("timed out")
		}
	case messages.ExitFailed:
		r.outcomes[name+" -1"]++
		if res.Error == nil || *res.Error == "" {
			wrong("-1 without an error")
		}
	default:
		wrong("unexpected exit code")
	}
}

func (r *chaosReport) classifyRun(j chaosJob, a messages.Ack) {
	r.outcomes["run "+a.State]++
	switch a.State {
	case messages.StateSucceeded:
		if string(a.ResultBlob) != j.want {
			r.wrong = append(r.wrong, fmt.Sprintf("%s: result %q", j.id, a.ResultBlob))
		}
	case messages.StateKilled, messages.StateFailed:
		if a.Error == nil || a.Error.Message == "" {
			r.wrong = append(r.wrong, fmt.Sprintf("%s: %s without an error", j.id, a.State))
		}
	default:
		r.wrong = append(r.wrong, fmt.Sprintf("%s: state %q", j.id, a.State))
	}
}

// setupEvents counts the setup.finished events the control plane received,
// by setup command id: what the operator sees of each setup (its script
// may well run twice, as an interrupted setup runs again from the head of
// the queue, but its outcome is reported once).
func setupEvents(cp *fakecp.CP) map[string]int {
	m := map[string]int{}
	for _, e := range cp.Events() {
		if e.Kind == messages.EventSetupFinished {
			m[e.InvocationID]++
		}
	}
	return m
}

// levelFilter passes the daemon's log lines at level min or above to next.
type levelFilter struct {
	next io.Writer
	min  zerolog.Level
	mu   sync.Mutex
}

func (f *levelFilter) Write(p []byte) (int, error) {
	return f.WriteLevel(zerolog.NoLevel, p)
}

// WriteLevel implements zerolog.LevelWriter.
func (f *levelFilter) WriteLevel(level zerolog.Level, p []byte) (int, error) {
	if level != zerolog.NoLevel && level < f.min {
		return len(p), nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next.Write(p)
}

// setupOrder is the order the setups finished their scripts in, a setup
// that ran twice in a row counted once.
func setupOrder(t *testing.T, path string) []string {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var order []string
	for _, line := range strings.Fields(string(b)) {
		if len(order) == 0 || order[len(order)-1] != line {
			order = append(order, line)
		}
	}
	return order
}

// orphanedJobs lists the jobs of the run that still have a live process:
// by their job's mark, or for a setup's processes by their process group.
func orphanedJobs(t *testing.T, runMark string) []string {
	pids, err := orphans.WithEnv("/proc", runMarkKey+"="+runMark)
	if err != nil {
		t.Fatal(err)
	}
	// Counted, then ended: a run leaves nothing behind.
	t.Cleanup(func() {
		for _, pid := range pids {
			killMarked(pid, runMarkKey+"="+runMark)
		}
	})
	seen := map[string]bool{}
	var jobs []string
	for _, pid := range pids {
		job := envOf(pid, jobMarkKey)
		if job == "" {
			pgid, err := syscall.Getpgid(pid)
			if err != nil {
				continue // gone meanwhile
			}
			job = "process group " + strconv.Itoa(pgid)
		}
		if !seen[job] {
			seen[job] = true
			jobs = append(jobs, fmt.Sprintf("%s (pid %d)", job, pid))
		}
	}
	return jobs
}

// killMarked SIGKILLs process pid if it still carries the mark kv. The pid
// is not our child, so it may have died and been reused meanwhile: the
// pidfd pins one process, and the mark is read after it is opened, so the
// signal reaches a process of ours or none.
func killMarked(pid int, kv string) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	k, v, _ := strings.Cut(kv, "=")
	if envOf(pid, k) == v {
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	}
}

// envOf is the value of key in the initial environment of process pid.
func envOf(pid int, key string) string {
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return ""
	}
	for _, kv := range bytes.Split(env, []byte{0}) {
		if k, v, ok := bytes.Cut(kv, []byte("=")); ok && string(k) == key {
			return string(v)
		}
	}
	return ""
}

// settledGoroutines drops pooled connections on both sides and returns the
// goroutine count once two checks in a row agree.
func settledGoroutines(h *harness) int {
	prev := -1
	var n int
	wait.Until(10*time.Second, func() bool {
		h.client.CloseIdleConnections()
		h.cp.CloseClientConnections()
		n = runtime.NumGoroutine()
		settled := n == prev
		prev = n
		return settled
	})
	return n
}

// monkey crashes (a poison message) and stops actors of the tree at random:
// the poller, the setup queue, the execs and invocations parents, the
// metrics writer, and the children of single jobs.
type monkey struct {
	crashes, stops atomic.Int64
	stop, done     chan struct{}
}

func startMonkey(h *harness, seed uint64, every time.Duration) *monkey {
	m := &monkey{stop: make(chan struct{}), done: make(chan struct{})}
	rng := rand.New(rand.NewPCG(seed, 2))
	root := h.d.System().Root
	randomChild := func(kind ledger.Kind) *actor.PID {
		ids := h.d.Ledger().IDs(kind)
		if len(ids) == 0 {
			return nil
		}
		id := ids[rng.IntN(len(ids))]
		parent, child := h.d.Child(actors.ExecsName), execs.ChildName(id)
		if kind != ledger.Exec {
			parent, child = h.d.Child(actors.InvocationsName), invocations.ChildName(id)
		}
		if parent == nil {
			return nil
		}
		return actor.NewPID(parent.Address, parent.Id+"/"+child)
	}
	go func() {
		defer close(m.done)
		pause := time.NewTimer(every)
		defer pause.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-pause.C:
				// Uniform in [0, 2·every): a mean of every, at random.
				pause.Reset(time.Duration(rng.Int64N(int64(2 * every))))
			}
			var pid *actor.PID
			isParent := false
			switch rng.IntN(11) {
			case 10:
				pid = h.d.Child(metrics.Name)
			case 0:
				pid = h.d.Child(actors.PollerName)
			case 1:
				pid = h.d.Child(actors.SetupName)
			case 2:
				pid, isParent = h.d.Child(actors.ExecsName), true
			case 3:
				pid, isParent = h.d.Child(actors.InvocationsName), true
			case 4, 5, 6, 7:
				pid = randomChild(ledger.Exec)
			default:
				pid = randomChild(ledger.Run)
			}
			if pid == nil {
				continue
			}
			// Parents are hit rarely: a parent crash takes all its
			// children with it, and some work should also succeed.
			if isParent && rng.IntN(4) != 0 {
				continue
			}
			// Only blows at a live actor count (a job's child is
			// spawned some time after its job is accepted).
			if _, alive := h.d.System().ProcessRegistry.Get(pid); !alive {
				continue
			}
			if rng.IntN(2) == 0 {
				root.Stop(pid)
				m.stops.Add(1)
			} else {
				root.Send(pid, &poison{})
				m.crashes.Add(1)
			}
		}
	}()
	return m
}

// halt stops the monkey and waits until it has.
func (m *monkey) halt() {
	close(m.stop)
	<-m.done
}

func TestRepeatedCrashesEscalate(t *testing.T) {
	h := newHarness(t, setup{
		opts:     []actors.Option{actors.WithPropsOptions(actor.WithReceiverMiddleware(poisonMiddleware))},
		settings: func(s *actors.Settings) { s.MaxRestarts = 2; s.RestartWindow = time.Minute },
	})
	h.waitPolls(1)
	h.exec("victim", "sleep 30")
	wait.For(t, 10*time.Second, "running", func() bool { return h.d.Ledger().Active() == 1 })
	for range 3 {
		h.d.System().Root.Send(h.d.Child(actors.PollerName), &poison{})
	}
	err := h.wait(20 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "crashed 3 times") {
		t.Fatalf("err = %v", err)
	}
	// the running exec was killed and reported on the way out
	if r := h.cp.WaitResult("victim", 10*time.Second); r.ExitCode != messages.ExitFailed {
		t.Fatalf("%+v", r)
	}
}

// checkMetricsFile reads the metrics file the stopped daemon left at path
// and compares its counts of finished jobs with what the control plane
// received: one exec result per exit-code class, one ack per state, one
// setup outcome each. The writer was crashed and stopped with the rest of
// the tree; the counters, outside it, must not have missed or doubled one.
func checkMetricsFile(t *testing.T, h *harness, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return []string{err.Error()}
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		return []string{"does not parse: " + err.Error()}
	}
	got := map[string]float64{}
	for _, m := range mfs["nymph_jobs_finished_total"].GetMetric() {
		var kind, outcome string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "kind":
				kind = l.GetValue()
			case "outcome":
				outcome = l.GetValue()
			}
		}
		got[kind+" "+outcome] = m.GetCounter().GetValue()
	}
	want := map[string]float64{}
	for _, rs := range h.cp.Results() {
		switch c := rs[0].ExitCode; {
		case c == 0:
			want["exec exit_zero"]++
		case c > 0:
			want["exec exit_nonzero"]++
		case c == messages.ExitTimeout:
			want["exec timeout"]++
		default:
			want["exec -1"]++
		}
	}
	for _, a := range h.cp.Acks() {
		want["run "+a.State]++
	}
	for _, n := range setupEvents(h.cp) {
		want["setup"] += float64(min(n, 1))
	}
	// An exec reported -1 was killed, could not run, or was refused: the
	// result alone does not tell which.
	got["exec -1"] = got["exec killed"] + got["exec failed"] + got["exec refused"]
	got["setup"] = got["setup succeeded"] + got["setup failed"]
	var wrong []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			wrong = append(wrong, fmt.Sprintf("%s: the file says %v, the control plane got %v", k, got[k], want[k]))
		}
	}
	for _, k := range []string{"exec exit_zero", "exec exit_nonzero", "exec timeout", "run succeeded", "run failed", "run killed"} {
		if _, ok := want[k]; !ok && got[k] != 0 {
			wrong = append(wrong, fmt.Sprintf("%s: the file says %v, the control plane got none", k, got[k]))
		}
	}
	if v := mfs["nymph_jobs_running"].GetMetric(); len(v) != 3 {
		wrong = append(wrong, fmt.Sprintf("nymph_jobs_running has %d series", len(v)))
	} else {
		for _, m := range v {
			if m.GetGauge().GetValue() != 0 {
				wrong = append(wrong, "a job still running after the stop")
			}
		}
	}
	return wrong
}
