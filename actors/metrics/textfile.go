package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/rs/zerolog"

	"nymph/atomicfile"
)

// Suffix is the ending node_exporter's textfile collector requires of the
// files it reads; the temporary file beside the target does not have it,
// so the collector never reads a half-written one.
const Suffix = ".prom"

// Jobs tells how many jobs of a kind (KindExec, KindRun, KindSetup) run
// now. It must be safe for concurrent use.
type Jobs interface {
	Running(kind string) int
}

// Backlog tells how many results are kept on disk and not posted yet (the
// outbox's Pending). It must be safe for concurrent use.
type Backlog interface {
	Pending() int
}

// Worker names the daemon to the control plane (the poller's state); empty
// before the first hello. It must be safe for concurrent use.
type Worker interface {
	WorkerID() string
}

// Sources is where the file's numbers come from.
type Sources struct {
	Recorder *Recorder
	Jobs     Jobs
	// Backlog, when nil, leaves nymph_outbox_pending out.
	Backlog Backlog
	// Worker, Label and MachineID label nymph_daemon_info.
	Worker    Worker
	Label     string
	MachineID string
	// Version labels nymph_build_info.
	Version string
}

// Names lists every metric the file can carry, for documentation and the
// test that holds the README to it.
func Names() []string {
	return []string{
		"nymph_build_info",
		"nymph_daemon_info",
		"nymph_jobs_running",
		"nymph_jobs_finished_total",
		"nymph_poll_errors_total",
		"nymph_poll_backoff_seconds",
		"nymph_last_successful_poll_timestamp_seconds",
		"nymph_outbox_pending",
	}
}

// collector turns Sources into metrics at each Gather.
type collector struct {
	src                                        Sources
	build, info, running, finished, pollErrors *prometheus.Desc
	backoff, lastPoll, outbox                  *prometheus.Desc
}

var _ prometheus.Collector = (*collector)(nil)

func newCollector(src Sources) *collector {
	d := prometheus.NewDesc
	return &collector{
		src:   src,
		build: d("nymph_build_info", "The nymph build running: its version, always 1.", []string{"version"}, nil),
		info: d("nymph_daemon_info", "Who this daemon is: the worker id the control plane gave it (empty before its first hello), its label and machine id; always 1.",
			[]string{"worker_id", "label", "machine_id"}, nil),
		running: d("nymph_jobs_running", "Jobs running now, by kind (exec, run, setup).", []string{"kind"}, nil),
		finished: d("nymph_jobs_finished_total", "Jobs finished since this process started, by kind and outcome: "+
			"exec exit_zero, exit_nonzero, timeout, killed, failed, refused; run succeeded, failed, killed; setup succeeded, failed; "+
			"lost for an exec or run a previous process was running when it died.", []string{"kind", "outcome"}, nil),
		pollErrors: d("nymph_poll_errors_total", "Hello and poll requests to the control plane that failed.", nil, nil),
		backoff:    d("nymph_poll_backoff_seconds", "The delay before the poller's next retry after a failed request; 0 once a request succeeds.", nil, nil),
		lastPoll:   d("nymph_last_successful_poll_timestamp_seconds", "When the control plane last answered a hello or poll, in seconds since the epoch; 0 before the first.", nil, nil),
		outbox:     d("nymph_outbox_pending", "Results (exec results, run acks, events) kept in the outbox and not yet accepted by the control plane.", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.build, c.info, c.running, c.finished, c.pollErrors, c.backoff, c.lastPoll, c.outbox} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	s := c.src
	gauge(c.build, 1, s.Version)
	wid := ""
	if s.Worker != nil {
		wid = s.Worker.WorkerID()
	}
	gauge(c.info, 1, wid, s.Label, s.MachineID)
	for _, k := range []string{KindExec, KindRun, KindSetup} {
		gauge(c.running, float64(s.Jobs.Running(k)), k)
	}
	for _, f := range s.Recorder.Finished() {
		ch <- prometheus.MustNewConstMetric(c.finished, prometheus.CounterValue, float64(f.Count), f.Kind, f.Outcome)
	}
	ch <- prometheus.MustNewConstMetric(c.pollErrors, prometheus.CounterValue, float64(s.Recorder.PollErrors()))
	gauge(c.backoff, s.Recorder.Backoff().Seconds())
	last := 0.0
	if t := s.Recorder.LastPollSuccess(); !t.IsZero() {
		last = float64(t.Unix()) + float64(t.Nanosecond())/1e9
	}
	gauge(c.lastPoll, last)
	if s.Backlog != nil {
		gauge(c.outbox, float64(s.Backlog.Pending()))
	}
}

// Textfile writes the metrics to one file. Write and TryWrite may be called
// from any goroutine; writes are serialised, and what was last logged is
// kept here, outside the writer actor, so a restarted writer does not log
// an error it already logged.
type Textfile struct {
	path string
	reg  *prometheus.Registry
	log  zerolog.Logger

	mu sync.Mutex
	// lastErr is the key (errKey) of the last write's error; "" after a
	// write that worked.
	lastErr string
}

// NewTextfile returns the writer of path, which must end in Suffix.
func NewTextfile(path string, src Sources, log zerolog.Logger) (*Textfile, error) {
	if !strings.HasSuffix(path, Suffix) {
		return nil, fmt.Errorf("metrics textfile %q: the name must end in %s (node_exporter's textfile collector reads only those)", path, Suffix)
	}
	if src.Recorder == nil || src.Jobs == nil {
		return nil, errors.New("metrics: Sources.Recorder and Sources.Jobs are required")
	}
	// A private registry: the global one would add the Go runtime's and the
	// process's collectors, which are node_exporter's business, and be
	// shared with anything else in the process.
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(newCollector(src)); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return &Textfile{path: path, reg: reg, log: log}, nil
}

// Path is the file written.
func (t *Textfile) Path() string { return t.path }

// Render returns the metrics in the text exposition format.
func (t *Textfile) Render() ([]byte, error) {
	mfs, err := t.reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("metrics: gather: %w", err)
	}
	var buf bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
			return nil, fmt.Errorf("metrics: encode %s: %w", mf.GetName(), err)
		}
	}
	return buf.Bytes(), nil
}

// Write renders the metrics and replaces the file with them. A failure is
// logged when it differs from the previous write's (a directory that stays
// unwritable is logged once, not at every tick), and so is the first write
// that works after one failed.
func (t *Textfile) Write() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.write()
}

// TryWrite is Write unless a write is under way, in which case it does
// nothing and returns false: a tick that comes while a slow disk holds the
// previous write has nothing to add to it.
func (t *Textfile) TryWrite() bool {
	if !t.mu.TryLock() {
		return false
	}
	defer t.mu.Unlock()
	_ = t.write()
	return true
}

// write does the work of Write; t.mu is held.
func (t *Textfile) write() error {
	data, err := t.Render()
	if err == nil {
		err = atomicfile.Write(t.path, data, 0o644)
	}
	key := errKey(err)
	if key != t.lastErr {
		switch {
		case err != nil:
			t.log.Error().Err(err).Str("path", t.path).Msg("metrics textfile not written; retried every interval, logged again when the error changes")
		case t.lastErr != "":
			t.log.Info().Str("path", t.path).Msg("metrics textfile written again")
		}
		t.lastErr = key
	}
	return err
}

// errKey is what makes two write errors the same for logging: the failing
// operation and the system's error, without the temporary file's random
// name.
func errKey(err error) string {
	if err == nil {
		return ""
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}
