package metrics_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"

	"nymph/actors/metrics"
	"nymph/test/wait"
)

// jobs is a settable metrics.Jobs.
type jobs struct{ n sync.Map }

func (j *jobs) Running(kind string) int {
	v, _ := j.n.Load(kind)
	n, _ := v.(int)
	return n
}

type backlog struct{ n atomic.Int64 }

func (b *backlog) Pending() int { return int(b.n.Load()) }

type worker string

func (w worker) WorkerID() string { return string(w) }

type fixture struct {
	rec     *metrics.Recorder
	jobs    *jobs
	backlog *backlog
	tf      *metrics.Textfile
	path    string
	log     *bytes.Buffer
}

func newFixture(t *testing.T, path string) *fixture {
	t.Helper()
	f := &fixture{rec: metrics.NewRecorder(), jobs: &jobs{}, backlog: &backlog{}, path: path, log: &bytes.Buffer{}}
	f.rec.Known(metrics.KindExec, "exit_zero", "exit_nonzero")
	tf, err := metrics.NewTextfile(path, metrics.Sources{
		Recorder: f.rec, Jobs: f.jobs, Backlog: f.backlog, Worker: worker("w-1"),
		Label: `gpu "rig"\n`, MachineID: "m1", Version: "1.2.3",
	}, zerolog.New(&syncWriter{w: f.log}))
	if err != nil {
		t.Fatal(err)
	}
	f.tf = tf
	return f
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// parse reads data as node_exporter's textfile collector does (the same
// parser) and checks that every family has its HELP and TYPE lines.
func parse(t *testing.T, data []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("the file does not parse: %v\n%s", err, data)
	}
	if len(mfs) == 0 {
		t.Fatalf("no metric in:\n%s", data)
	}
	for name, mf := range mfs {
		if !bytes.Contains(data, []byte("# HELP "+name+" ")) || mf.GetHelp() == "" {
			t.Errorf("%s has no HELP", name)
		}
		if !bytes.Contains(data, []byte("# TYPE "+name+" ")) || mf.GetType() == dto.MetricType_UNTYPED {
			t.Errorf("%s has no TYPE", name)
		}
	}
	return mfs
}

// value is the value of the series of family name with labels (pairs).
func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	t.Helper()
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if got[labels[i]] != labels[i+1] {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}

func readFile(t *testing.T, path string) map[string]*dto.MetricFamily {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, data)
}

func TestFileCarriesEveryMetricValidForNodeExporter(t *testing.T) {
	f := newFixture(t, filepath.Join(t.TempDir(), "nymph.prom"))
	f.jobs.n.Store(metrics.KindExec, 2)
	f.jobs.n.Store(metrics.KindSetup, 1)
	f.backlog.n.Store(3)
	f.rec.ExecFinished("exit_zero")
	f.rec.ExecFinished("exit_zero")
	f.rec.ExecFinished("killed")
	f.rec.RunFinished("succeeded")
	f.rec.SetupFinished("failed")
	f.rec.JobFinished(metrics.KindRun, metrics.OutcomeLost)
	f.rec.PollFailed(1500 * time.Millisecond)
	f.rec.PollFailed(3 * time.Second)
	if err := f.tf.Write(); err != nil {
		t.Fatal(err)
	}
	mfs := readFile(t, f.path)
	for _, name := range metrics.Names() {
		if _, ok := mfs[name]; !ok {
			t.Errorf("%s missing", name)
		}
	}
	for name := range mfs {
		if !slices.Contains(metrics.Names(), name) {
			t.Errorf("%s is not in metrics.Names", name)
		}
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"nymph_build_info", []string{"version", "1.2.3"}, 1},
		// A label with quotes, a backslash and a newline is escaped, not
		// a broken file.
		{"nymph_daemon_info", []string{"worker_id", "w-1", "label", `gpu "rig"\n`, "machine_id", "m1"}, 1},
		{"nymph_jobs_running", []string{"kind", "exec"}, 2},
		{"nymph_jobs_running", []string{"kind", "run"}, 0},
		{"nymph_jobs_running", []string{"kind", "setup"}, 1},
		{"nymph_jobs_finished_total", []string{"kind", "exec", "outcome", "exit_zero"}, 2},
		{"nymph_jobs_finished_total", []string{"kind", "exec", "outcome", "exit_nonzero"}, 0}, // Known: there at 0
		{"nymph_jobs_finished_total", []string{"kind", "exec", "outcome", "killed"}, 1},
		{"nymph_jobs_finished_total", []string{"kind", "run", "outcome", "succeeded"}, 1},
		{"nymph_jobs_finished_total", []string{"kind", "run", "outcome", "lost"}, 1},
		{"nymph_jobs_finished_total", []string{"kind", "setup", "outcome", "failed"}, 1},
		{"nymph_poll_errors_total", nil, 2},
		{"nymph_poll_backoff_seconds", nil, 3},
		{"nymph_last_successful_poll_timestamp_seconds", nil, 0},
		{"nymph_outbox_pending", nil, 3},
	} {
		if got, ok := value(t, mfs, c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if got := mfs["nymph_jobs_finished_total"].GetType(); got != dto.MetricType_COUNTER {
		t.Errorf("nymph_jobs_finished_total is a %v", got)
	}

	// A success ends the backoff and stamps the time.
	at := time.Unix(1_700_000_000, 250_000_000)
	f.rec.PollSucceeded(at)
	if err := f.tf.Write(); err != nil {
		t.Fatal(err)
	}
	mfs = readFile(t, f.path)
	if got, _ := value(t, mfs, "nymph_poll_backoff_seconds"); got != 0 {
		t.Errorf("backoff after a success: %v", got)
	}
	if got, _ := value(t, mfs, "nymph_last_successful_poll_timestamp_seconds"); got != 1_700_000_000.25 {
		t.Errorf("last successful poll: %v", got)
	}
	if got, _ := value(t, mfs, "nymph_poll_errors_total"); got != 2 {
		t.Errorf("poll errors after a success: %v (a counter never goes back)", got)
	}
}

func TestNameMustEndInProm(t *testing.T) {
	_, err := metrics.NewTextfile(filepath.Join(t.TempDir(), "nymph.txt"), metrics.Sources{Recorder: metrics.NewRecorder(), Jobs: &jobs{}}, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), ".prom") {
		t.Fatalf("got %v", err)
	}
}

// A reader that opens the file while the writer replaces it in a loop
// always finds a whole file, and the directory holds nothing else after.
func TestReplacedAtomically(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, filepath.Join(dir, "nymph.prom"))
	if err := f.tf.Write(); err != nil {
		t.Fatal(err)
	}
	// Enough of both that reads land in every phase of a replacement.
	const enoughReads, enoughWrites = 300, 200
	var reads atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	failures := make(chan string, 1)
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			data, err := os.ReadFile(f.path)
			if err == nil {
				p := expfmt.NewTextParser(model.UTF8Validation)
				var mfs map[string]*dto.MetricFamily
				mfs, err = p.TextToMetricFamilies(bytes.NewReader(data))
				if err == nil && len(mfs) != len(metrics.Names()) {
					err = errors.New("families missing")
				}
			}
			if err != nil {
				failures <- err.Error()
				return
			}
			reads.Add(1)
		}
	}()
	writes := 0
	for ; writes < enoughWrites || reads.Load() < enoughReads; writes++ {
		select {
		case msg := <-failures:
			t.Fatalf("a reader saw a file that does not parse after %d reads: %s", reads.Load(), msg)
		default:
		}
		// Every write changes the content, and its length now and then.
		f.rec.PollFailed(time.Duration(writes) * time.Millisecond)
		f.rec.JobFinished(metrics.KindExec, "exit_zero")
		if writes%7 == 0 {
			f.rec.JobFinished(metrics.KindRun, "o"+strings.Repeat("x", writes%50))
		}
		if err := f.tf.Write(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
	select {
	case msg := <-failures:
		t.Fatalf("a reader saw a file that does not parse after %d reads: %s", reads.Load(), msg)
	default:
	}
	t.Logf("%d reads during %d writes", reads.Load(), writes)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "nymph.prom" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("the directory holds %v", names)
	}
}

// logLines returns the log's records at level.
func logLines(t *testing.T, buf *bytes.Buffer, level string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["level"] == level {
			out = append(out, rec)
		}
	}
	return out
}

// A directory the file cannot be written to is logged once per change of
// the error, not at every write, and the writes go on.
func TestUnwritableDirectoryLoggedOncePerChange(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "textfile")
	f := newFixture(t, filepath.Join(dir, "nymph.prom"))
	for range 5 {
		if err := f.tf.Write(); err == nil {
			t.Fatal("a write into a missing directory worked")
		}
	}
	if errs := logLines(t, f.log, "error"); len(errs) != 1 {
		t.Fatalf("%d error lines for one error repeated:\n%s", len(errs), f.log)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := f.tf.Write(); err != nil {
			t.Fatal(err)
		}
	}
	if infos := logLines(t, f.log, "info"); len(infos) != 1 || !strings.Contains(infos[0]["message"].(string), "written again") {
		t.Fatalf("recovery: %s", f.log)
	}
	readFile(t, f.path)
	// Another error (the directory is now a file) is logged again, once.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if err := f.tf.Write(); err == nil {
			t.Fatal("a write under a file worked")
		}
	}
	errs := logLines(t, f.log, "error")
	if len(errs) != 2 {
		t.Fatalf("%d error lines for two errors:\n%s", len(errs), f.log)
	}
	if errs[0]["error"] == errs[1]["error"] {
		t.Fatalf("the same error logged twice: %v", errs)
	}
}

// poison makes the writer panic, as the chaos tests crash actors.
type poison struct{}

func poisonMiddleware(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
		if _, ok := env.Message.(*poison); ok {
			panic("poisoned")
		}
		next(c, env)
	}
}

func errorsOf(t *testing.T, path string) float64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	v, _ := value(t, parse(t, data), "nymph_poll_errors_total")
	return v
}

// The writer writes when it starts, again after a crash (its counters are
// the Recorder's, outside it: nothing is lost), and once more when it
// stops. The interval is an hour, so only those writes can show a change.
func TestWriterSurvivesACrashAndWritesAtStop(t *testing.T) {
	f := newFixture(t, filepath.Join(t.TempDir(), "nymph.prom"))
	var wg sync.WaitGroup
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	defer sys.Shutdown()
	pid := sys.Root.Spawn(metrics.Props(&metrics.WriterDeps{
		Textfile: f.tf, Interval: time.Hour, Jobs: &wg,
		PropsOptions: []actor.PropsOption{actor.WithReceiverMiddleware(poisonMiddleware)},
	}))
	// Spawned at the root, a crash restarts it (protoactor's default
	// strategy), as the daemon's root supervisor does.
	wait.For(t, 10*time.Second, "the first write", func() bool { return errorsOf(t, f.path) == 0 })

	f.rec.PollFailed(time.Second)
	sys.Root.Send(pid, &poison{})
	wait.For(t, 10*time.Second, "a write by the restarted writer", func() bool { return errorsOf(t, f.path) == 1 })

	f.rec.PollFailed(time.Second)
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if got := errorsOf(t, f.path); got != 2 {
		t.Fatalf("after the stop the file says %v poll errors, want 2", got)
	}
}

// The writer's own timer ticks: a change shows without anything sent to it.
func TestWriterTicks(t *testing.T) {
	f := newFixture(t, filepath.Join(t.TempDir(), "nymph.prom"))
	var wg sync.WaitGroup
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	defer sys.Shutdown()
	pid := sys.Root.Spawn(metrics.Props(&metrics.WriterDeps{Textfile: f.tf, Interval: time.Second, Jobs: &wg}))
	wait.For(t, 10*time.Second, "the first write", func() bool { return errorsOf(t, f.path) == 0 })
	for want := 1.0; want <= 2; want++ {
		f.rec.PollFailed(time.Second)
		wait.For(t, 10*time.Second, "a tick's write", func() bool { return errorsOf(t, f.path) == want })
	}
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// The README's "nymph metrics" table lists every metric the file carries.
func TestREADMEListsEveryMetric(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## nymph metrics\n")
	if !ok {
		t.Fatal(`README.md has no "## nymph metrics" section`)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(nymph_[a-z_]+)`").FindAllStringSubmatch(section, -1) {
		listed[m[1]] = true
	}
	// What a written file carries, every family there.
	f := newFixture(t, filepath.Join(t.TempDir(), "nymph.prom"))
	if err := f.tf.Write(); err != nil {
		t.Fatal(err)
	}
	for name := range readFile(t, f.path) {
		if !listed[name] {
			t.Errorf("the file carries %s, which README.md's nymph metrics table does not list", name)
		}
	}
	for _, name := range metrics.Names() {
		if !listed[name] {
			t.Errorf("metrics.Names has %s, which README.md's nymph metrics table does not list", name)
		}
	}
}

// BenchmarkRender is the cost of one rendering (every family, the Known
// outcomes); BenchmarkWrite adds the atomic replacement (fsyncs included).
func BenchmarkRender(b *testing.B) {
	f := newFixtureB(b)
	for b.Loop() {
		data, err := f.tf.Render()
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(data)))
	}
}

func BenchmarkWrite(b *testing.B) {
	f := newFixtureB(b)
	for b.Loop() {
		if err := f.tf.Write(); err != nil {
			b.Fatal(err)
		}
	}
}

func newFixtureB(b *testing.B) *fixture {
	rec := metrics.NewRecorder()
	rec.Known(metrics.KindExec, "exit_zero", "exit_nonzero", "timeout", "killed", "failed", "refused", "lost")
	rec.Known(metrics.KindRun, "succeeded", "failed", "killed", "lost")
	rec.Known(metrics.KindSetup, "succeeded", "failed")
	path := filepath.Join(b.TempDir(), "nymph.prom")
	tf, err := metrics.NewTextfile(path, metrics.Sources{Recorder: rec, Jobs: &jobs{}, Backlog: &backlog{}, Worker: worker("w-1"),
		Label: "rig", MachineID: "m1", Version: "1.2.3"}, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	return &fixture{rec: rec, tf: tf, path: path}
}
