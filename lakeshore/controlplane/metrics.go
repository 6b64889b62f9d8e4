package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"nymph/buildinfo"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/lakeshore/store/sqlstore"
	"nymph/messages"
)

// Metrics. Each Server has a registry of its own, built in New (nothing
// is registered at init, nothing is global), served at GET /metrics on
// the main listener behind Config.MetricsToken or the admin token, and
// unauthenticated on Config.MetricsAddr. README.md's "Metrics" section
// lists every family; TestMetricsREADMEListsEveryFamily keeps it so.
//
// What happens (a request, a delivery, an exec's result) is counted where
// it happens, on the path that already has the instants in hand. What is
// (daemons by state, commands queued) is counted at scrape time by one
// grouped query each, kept for metricsCacheTTL, so a Prometheus scraping
// every second, or several of them, cost the store one pair of queries
// per TTL whatever the fleet's size.

// metricsCacheTTL is how long a scrape's fleet counts serve the next.
const metricsCacheTTL = 5 * time.Second

// metricsQueryTimeout bounds the fleet counts of one scrape.
const metricsQueryTimeout = 5 * time.Second

// Buckets. Dispatch spans a wake-up (milliseconds) to a daemon that was
// not polling (minutes); jobs run from milliseconds to hours; requests and
// statements are the client library's defaults but for the long-poll's
// 20 s.
var (
	dispatchBuckets = []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 1800}
	jobBuckets      = []float64{.01, .1, .5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600}
	requestBuckets  = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 25}
	storeBuckets    = []float64{.0001, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5}
	lagBuckets      = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5}
)

// Exec outcome classes: what its exit code says (messages.Exit*), and
// lost when the control plane gave up on its daemon.
const (
	execSucceeded = "succeeded" // exit code 0
	execFailed    = "failed"    // exit code > 0
	execTimedOut  = "timeout"   // killed after timeout_s
	execError     = "error"     // could not be run, or was killed
	execLost      = "lost"      // its daemon went away (lost.go)
)

// routeUnmatched is the route label of a request no pattern matched.
const routeUnmatched = "unmatched"

type metrics struct {
	reg *prometheus.Registry
	// all is every collector, registered or not (the lag histogram only
	// with a notifier), for the README test.
	all []prometheus.Collector

	pollsHeld          prometheus.Gauge
	dispatch           *prometheus.HistogramVec
	execDuration       *prometheus.HistogramVec
	execOutcomes       *prometheus.CounterVec
	runDuration        *prometheus.HistogramVec
	invocationOutcomes *prometheus.CounterVec
	http               *prometheus.HistogramVec
	storeOps           *prometheus.HistogramVec
	storeErrors        *prometheus.CounterVec
	notifyLag          prometheus.Histogram
	fleet              *fleetCollector
}

// newMetrics builds a server's metrics; the notification lag is
// registered only when lag is set (replicas).
func newMetrics(s *Server, lag bool) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.pollsHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lakeshore_long_polls_held",
		Help: "Daemon long-polls parked on this control plane now, waiting for a command or their time.",
	})
	m.dispatch = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lakeshore_dispatch_latency_seconds",
		Help:    "From a command queued to the poll answer that first delivers it, by command kind.",
		Buckets: dispatchBuckets,
	}, []string{"kind"})
	m.execDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lakeshore_exec_duration_seconds",
		Help:    "How long a finished exec ran, as its daemon measured it (duration_ms), by outcome.",
		Buckets: jobBuckets,
	}, []string{"outcome"})
	m.execOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lakeshore_exec_outcomes_total",
		Help: "Execs finished, by outcome: succeeded, failed (exit > 0), timeout, error (not run or killed), lost.",
	}, []string{"outcome"})
	m.runDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lakeshore_run_duration_seconds",
		Help:    "From an invocation's start on its daemon to its end, by final state.",
		Buckets: jobBuckets,
	}, []string{"state"})
	m.invocationOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lakeshore_invocation_outcomes_total",
		Help: "Invocations finished, by final state: succeeded, failed (lost included), killed, cancelled.",
	}, []string{"state"})
	m.http = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lakeshore_http_request_duration_seconds",
		Help:    "HTTP requests answered, by route pattern (\"POST /v1/daemon/poll\"; unmatched for none) and status.",
		Buckets: requestBuckets,
	}, []string{"route", "status"})
	m.storeOps = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lakeshore_store_operation_duration_seconds",
		Help:    "Store statements, by operation: the SQL verb and first table (select_workers), or pipeline.",
		Buckets: storeBuckets,
	}, []string{"operation"})
	m.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lakeshore_store_operation_errors_total",
		Help: "Store statements that failed, by operation.",
	}, []string{"operation"})
	m.notifyLag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lakeshore_replica_notification_lag_seconds",
		Help:    "From another replica sending a wake-up notification to its arrival here (the two clocks' skew included).",
		Buckets: lagBuckets,
	})
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lakeshore_build_info",
		Help: "Always 1: the version of this lakeshore and the Go it was built with.",
	}, []string{"version", "go_version"})
	build.WithLabelValues(buildinfo.Version, runtime.Version()).Set(1)
	m.fleet = newFleetCollector(s)

	m.all = []prometheus.Collector{m.pollsHeld, m.dispatch, m.execDuration, m.execOutcomes, m.runDuration,
		m.invocationOutcomes, m.http, m.storeOps, m.storeErrors, build, m.fleet}
	for _, c := range m.all {
		m.reg.MustRegister(c)
	}
	m.all = append(m.all, m.notifyLag)
	if lag {
		m.reg.MustRegister(m.notifyLag)
	}
	return m
}

// observeOp is the store's statement observer (sqlstore.OpObserver).
func (m *metrics) observeOp(op string, took time.Duration, failed bool) {
	m.storeOps.WithLabelValues(op).Observe(took.Seconds())
	if failed {
		m.storeErrors.WithLabelValues(op).Inc()
	}
}

// observeRequest counts one answered request.
func (m *metrics) observeRequest(route string, status int, took time.Duration) {
	if route == "" {
		route = routeUnmatched
	}
	if status == 0 {
		// A handler that wrote nothing answered 200.
		status = http.StatusOK
	}
	m.http.WithLabelValues(route, strconv.Itoa(status)).Observe(took.Seconds())
}

// observeDelivered counts the commands a poll answer delivers for the
// first time (taken at takenAt; a delivery again, after an answer lost on
// the way, keeps its first delivered_at), from their queueing to now.
func (m *metrics) observeDelivered(cmds []store.Command, takenAt, now time.Time) {
	for _, c := range cmds {
		if c.DeliveredAt == nil || c.DeliveredAt.UnixMilli() != takenAt.UnixMilli() {
			continue
		}
		m.dispatch.WithLabelValues(c.Kind).Observe(max(now.Sub(c.CreatedAt), 0).Seconds())
	}
}

// execOutcome classes an exec result by its exit code.
func execOutcome(res messages.ExecResult) string {
	switch {
	case res.ExitCode == 0:
		return execSucceeded
	case res.ExitCode > 0:
		return execFailed
	case res.ExitCode == messages.ExitTimeout:
		return execTimedOut
	default:
		return execError
	}
}

// observeExec counts an exec result stored.
func (m *metrics) observeExec(res messages.ExecResult) {
	o := execOutcome(res)
	m.execOutcomes.WithLabelValues(o).Inc()
	m.execDuration.WithLabelValues(o).Observe((time.Duration(res.DurationMs) * time.Millisecond).Seconds())
}

// observeInvocation counts an invocation finished; one that never started
// (cancelled while queued) has no run duration.
func (m *metrics) observeInvocation(inv store.Invocation) {
	m.invocationOutcomes.WithLabelValues(inv.State).Inc()
	if inv.StartedAt != nil && inv.FinishedAt != nil {
		m.runDuration.WithLabelValues(inv.State).Observe(max(inv.FinishedAt.Sub(*inv.StartedAt), 0).Seconds())
	}
}

// observeLag counts a notification from another replica sent at sent
// (zero: its publisher does not say).
func (m *metrics) observeLag(sent time.Time) {
	if !sent.IsZero() {
		m.notifyLag.Observe(max(time.Since(sent), 0).Seconds())
	}
}

// opObservable is a store that reports its statements (both engines, by
// their sqlstore.DB).
type opObservable interface {
	ObserveOps(o sqlstore.OpObserver)
}

// sentListener is a Notifier that says when each key was sent (the
// PostgreSQL one).
type sentListener interface {
	ListenSent(ctx context.Context, deliver func(key string, sent time.Time)) error
}

// fleetCollector counts daemons by state and commands queued at scrape
// time, from one grouped query each, kept metricsCacheTTL.
type fleetCollector struct {
	s       *Server
	daemons *prometheus.Desc
	queued  *prometheus.Desc

	// mu guards what follows: one scrape reads the store at a time, and
	// those that wait serve what it read.
	mu    sync.Mutex
	ttl   time.Duration
	at    time.Time // when the counts were read (the zero time: never)
	byKey map[string]float64
	queue []store.QueuedCount
	ok    bool
}

// workerStates are the states every scrape reports, zero or not, so a
// state that empties reads 0 rather than vanishing.
var workerStates = []string{operatorapi.StatePending, operatorapi.StateSettingUp, operatorapi.StateJoining,
	operatorapi.StateActive, operatorapi.StateStale, operatorapi.StateGone}

func newFleetCollector(s *Server) *fleetCollector {
	return &fleetCollector{
		s:   s,
		ttl: metricsCacheTTL,
		daemons: prometheus.NewDesc("lakeshore_daemons",
			"Daemons (workers) by state, stale derived as reads derive it: not seen for the stale window.", []string{"state"}, nil),
		queued: prometheus.NewDesc("lakeshore_commands_queued",
			"Commands not yet delivered, by kind and the queue their daemon polls; kind invocation: invocations waiting for a daemon, by their queue.",
			[]string{"kind", "queue"}, nil),
	}
}

// setTTL changes how long the counts are kept (tests).
func (f *fleetCollector) setTTL(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ttl = d
}

func (f *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- f.daemons
	ch <- f.queued
}

func (f *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at.IsZero() || time.Since(f.at) >= f.ttl {
		f.read()
	}
	if !f.ok {
		// The store did not answer: nothing rather than zeros that
		// would read as an empty fleet.
		return
	}
	for _, st := range workerStates {
		ch <- prometheus.MustNewConstMetric(f.daemons, prometheus.GaugeValue, f.byKey[st], st)
	}
	for st, n := range f.byKey {
		if !isWorkerState(st) {
			ch <- prometheus.MustNewConstMetric(f.daemons, prometheus.GaugeValue, n, st)
		}
	}
	for _, q := range f.queue {
		ch <- prometheus.MustNewConstMetric(f.queued, prometheus.GaugeValue, float64(q.N), q.Kind, q.Queue)
	}
}

func isWorkerState(st string) bool {
	for _, w := range workerStates {
		if w == st {
			return true
		}
	}
	return false
}

// read runs the two counts, under f.mu.
func (f *fleetCollector) read() {
	ctx, cancel := context.WithTimeout(context.Background(), metricsQueryTimeout)
	defer cancel()
	now := f.s.now()
	f.at = time.Now()
	workers, err := f.s.st.CountWorkers(ctx, now.Add(-f.s.staleAfter))
	var queued []store.QueuedCount
	if err == nil {
		queued, err = f.s.st.CountQueued(ctx)
	}
	if err != nil {
		f.s.log.Warn().Err(err).Msg("metrics: counting daemons and queued commands")
		f.ok = false
		return
	}
	by := make(map[string]float64, len(workerStates))
	for _, c := range workers {
		st := c.State
		// As derivedState: pending and gone never read back stale.
		if c.SeenBefore && st != operatorapi.StateGone && st != operatorapi.StatePending {
			st = operatorapi.StateStale
		}
		by[st] += float64(c.N)
	}
	f.byKey, f.queue, f.ok = by, queued, true
}

// metricsHandler serves the registry in the text format.
func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{
		ErrorLog:      promLogger{s},
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// promLogger hands the client library's errors to the server's logger.
type promLogger struct{ s *Server }

func (l promLogger) Println(v ...any) { l.s.log.Warn().Msg("metrics: " + fmt.Sprint(v...)) }

// handleMetrics is GET /metrics on the main listener: behind the metrics
// token (or the admin token) when one is set, absent otherwise.
func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if s.metricsToken == "" {
		writeJSON(w, http.StatusNotFound, operatorapi.Error{Error: "metrics are not served on this listener: " +
			"start serve with --metrics-token (or $LAKESHORE_METRICS_TOKEN) to serve them here behind that bearer, " +
			"or with --metrics-addr HOST:PORT to serve them unauthenticated on a listener of their own"})
		return
	}
	tok, ok := bearer(r)
	if !ok || !sameSecret(tok, s.metricsToken) && !sameSecret(tok, s.adminToken) {
		closeUnread(w)
		w.Header().Set("WWW-Authenticate", `Bearer realm="lakeshore-metrics"`)
		writeJSON(w, http.StatusUnauthorized, operatorapi.Error{Error: "missing or wrong metrics token", Field: "authorization"})
		return
	}
	s.metricsHTTP.ServeHTTP(w, r)
}

// listenMetrics binds Config.MetricsAddr.
func listenMetrics(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener (--metrics-addr %s): %w", addr, err)
	}
	return ln, nil
}

// MetricsAddr is the address of the separate metrics listener, "" without
// one.
func (s *Server) MetricsAddr() string {
	if s.metricsLn == nil {
		return ""
	}
	return s.metricsLn.Addr().String()
}

// serveMetrics serves GET /metrics alone, unauthenticated, on the
// separate listener until ctx is done or the server closes.
func (s *Server) serveMetrics(ctx context.Context) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.metricsHTTP)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: s.limits.HeaderTimeout,
		IdleTimeout:       s.limits.IdleTimeout,
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-s.closing:
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	s.log.Info().Str("addr", s.metricsLn.Addr().String()).Msg("metrics listening (unauthenticated)")
	if err := srv.Serve(s.metricsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.log.Error().Err(err).Msg("metrics listener stopped")
	}
}

func isSentListener(n Notifier) bool {
	_, ok := n.(sentListener)
	return ok
}
