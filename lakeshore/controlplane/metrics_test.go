package controlplane

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"

	"nymph/buildinfo"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/lakeshore/store/postgres"
	"nymph/lakeshore/store/sqlite"
	"nymph/messages"
	"nymph/test/realparts"
	"nymph/test/wait"
)

const testMetricsToken = "metrics-secret"

func withMetricsToken(c *Config) { c.MetricsToken = testMetricsToken }

// families is one scrape, parsed by Prometheus's own text parser.
type families map[string]*dto.MetricFamily

// scrapeURL GETs url with token and parses the answer.
func scrapeURL(t testing.TB, url, token string) families {
	t.Helper()
	r := doCtx(t, context.Background(), http.MethodGet, url, "", token, nil)
	if r.status != http.StatusOK {
		t.Fatalf("GET %s: %d %q", url, r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("GET %s: Content-Type %q, want the text format", url, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		t.Fatalf("parse the scrape: %v\n%s", err, r.body)
	}
	return fams
}

func (e *env) scrape() families {
	e.t.Helper()
	return scrapeURL(e.t, e.url+"/metrics", testMetricsToken)
}

// series finds the series of family name with exactly labels; nil if none.
func (f families) series(name string, labels map[string]string) *dto.Metric {
	fam := f[name]
	if fam == nil {
		return nil
	}
	for _, m := range fam.Metric {
		if len(m.Label) != len(labels) {
			continue
		}
		match := true
		for _, l := range m.Label {
			if labels[l.GetName()] != l.GetValue() {
				match = false
			}
		}
		if match {
			return m
		}
	}
	return nil
}

// value is a counter's or gauge's value, 0 for a series not there.
func (f families) value(name string, labels map[string]string) float64 {
	m := f.series(name, labels)
	switch {
	case m == nil:
		return 0
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}

// hist is a histogram's count and sum, zeros for a series not there.
func (f families) hist(name string, labels map[string]string) (uint64, float64) {
	m := f.series(name, labels)
	if m == nil || m.Histogram == nil {
		return 0, 0
	}
	return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
}

func l(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// Execs, an invocation and the polls that carry them, through the real
// routes: every counter and histogram count moves by exactly what
// happened, and the fleet gauges say what the operator API says.
func TestMetricsCountWhatHappens(t *testing.T) {
	e := newEnv(t, withMetricsToken)
	e.srv.metrics.fleet.setTTL(0) // every scrape reads the store
	before := e.scrape()

	if got := before.value("lakeshore_build_info", l("version", buildinfo.Version, "go_version", runtime.Version())); got != 1 {
		t.Fatalf("build info %v", got)
	}
	if f := before["lakeshore_replica_notification_lag_seconds"]; f != nil {
		t.Fatalf("a lone control plane exports notification lag: %v", f)
	}

	id, hc := e.hello("m", "l")
	ok := e.exec(id, operatorapi.ExecRequest{Command: "true"})
	bad := e.exec(id, operatorapi.ExecRequest{Command: "false"})
	slow := e.exec(id, operatorapi.ExecRequest{Command: "sleep 9"})
	if got := e.scrape().value("lakeshore_commands_queued", l("kind", "exec", "queue", "")); got != 3 {
		t.Fatalf("queued execs %v, want 3", got)
	}
	e.clock.Advance(3 * time.Second)
	p := e.poll(id, &hc, 0, "")
	if len(p.Commands) != 3 {
		t.Fatalf("poll delivered %v", commandsOf(p))
	}
	// Delivered again (the cursor acknowledges none of them): no
	// dispatch counted a second time.
	e.clock.Advance(time.Second)
	if p := e.poll(id, &hc, 0, ""); len(p.Commands) != 3 {
		t.Fatalf("repeat poll delivered %v", commandsOf(p))
	}
	execResult(t, e, ok.ExecID, &messages.ExecResult{ExitCode: 0, DurationMs: 1500})
	execResult(t, e, bad.ExecID, &messages.ExecResult{ExitCode: 2, DurationMs: 250})
	execResult(t, e, slow.ExecID, &messages.ExecResult{ExitCode: messages.ExitTimeout, DurationMs: 9000})

	d := e.daemonUp(daemonSpec{machine: "d", label: "d", queue: "q", runners: []string{"echo"}})
	sub := e.submit(operatorapi.InvocationRequest{Queue: "q", Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("echo")}})
	if got := e.scrape().value("lakeshore_commands_queued", l("kind", "invocation", "queue", "q")); got != 1 {
		t.Fatalf("queued invocations %v, want 1", got)
	}
	if runs := d.poll(0); len(runs) != 1 || runs[0].InvocationID != sub.Invocation.ID {
		t.Fatalf("daemon got %+v", runs)
	}
	e.clock.Advance(4 * time.Second)
	if r := d.ack(&messages.Ack{InvocationID: sub.Invocation.ID, State: messages.StateSucceeded}); r.status != http.StatusOK {
		t.Fatalf("ack: %d %q", r.status, r.body)
	}
	// A repeated ack changes nothing, and counts nothing.
	if r := d.ack(&messages.Ack{InvocationID: sub.Invocation.ID, State: messages.StateSucceeded}); r.status != http.StatusOK {
		t.Fatalf("ack again: %d %q", r.status, r.body)
	}
	if r := e.do(http.MethodGet, "/no/such/route", "", "", nil); r.status != http.StatusNotFound {
		t.Fatalf("unmatched: %d", r.status)
	}

	after := e.scrape()
	delta := func(name string, labels map[string]string) float64 {
		return after.value(name, labels) - before.value(name, labels)
	}
	for _, c := range []struct {
		outcome string
		n       uint64
		sum     float64
	}{{execSucceeded, 1, 1.5}, {execFailed, 1, .25}, {execTimedOut, 1, 9}, {execError, 0, 0}} {
		if got := delta("lakeshore_exec_outcomes_total", l("outcome", c.outcome)); got != float64(c.n) {
			t.Errorf("exec outcomes %s: %v, want %d", c.outcome, got, c.n)
		}
		if n, sum := after.hist("lakeshore_exec_duration_seconds", l("outcome", c.outcome)); n != c.n || sum != c.sum {
			t.Errorf("exec duration %s: %d observations summing %v, want %d summing %v", c.outcome, n, sum, c.n, c.sum)
		}
	}
	// The execs were queued 3 s before the poll that first carried them,
	// on the test's clock; the run command was claimed by the poll that
	// carried it.
	if n, sum := after.hist("lakeshore_dispatch_latency_seconds", l("kind", "exec")); n != 3 || sum != 9 {
		t.Errorf("exec dispatch: %d observations summing %v, want 3 summing 9", n, sum)
	}
	if n, sum := after.hist("lakeshore_dispatch_latency_seconds", l("kind", "run")); n != 1 || sum != 0 {
		t.Errorf("run dispatch: %d observations summing %v, want 1 summing 0", n, sum)
	}
	if got := delta("lakeshore_invocation_outcomes_total", l("state", "succeeded")); got != 1 {
		t.Errorf("invocation outcomes: %v, want 1", got)
	}
	if n, sum := after.hist("lakeshore_run_duration_seconds", l("state", "succeeded")); n != 1 || sum != 4 {
		t.Errorf("run duration: %d observations summing %v, want 1 summing 4", n, sum)
	}
	if got := after.value("lakeshore_commands_queued", l("kind", "exec", "queue", "")); got != 0 {
		t.Errorf("queued execs after delivery %v", got)
	}
	if got := after.value("lakeshore_commands_queued", l("kind", "invocation", "queue", "q")); got != 0 {
		t.Errorf("queued invocations after the claim %v", got)
	}

	// Requests by route pattern and status, never by path: the three
	// results share one series.
	reqs := func(route, status string) uint64 {
		n, _ := after.hist("lakeshore_http_request_duration_seconds", l("route", route, "status", status))
		m, _ := before.hist("lakeshore_http_request_duration_seconds", l("route", route, "status", status))
		return n - m
	}
	for _, c := range []struct {
		route, status string
		n             uint64
	}{
		{"POST /v1/daemon/exec/{exec_id}/result", "200", 3},
		{routePoll, "200", 4}, // two of m's, daemonUp's and d's
		{"POST /v1/daemon/ack", "200", 2},
		{operatorapi.RouteWorkerExec, "202", 3},
		{operatorapi.RouteSubmitInvocation, "201", 1},
		{routeUnmatched, "404", 1},
		{"GET /metrics", "200", 3}, // the scrapes between before and after
	} {
		if got := reqs(c.route, c.status); got != c.n {
			t.Errorf("requests %s %s: %d, want %d", c.route, c.status, got, c.n)
		}
	}
	for _, m := range after["lakeshore_http_request_duration_seconds"].Metric {
		for _, lp := range m.Label {
			if lp.GetName() == "route" && strings.Contains(lp.GetValue(), ok.ExecID) {
				t.Errorf("a route label holds a path: %q", lp.GetValue())
			}
		}
	}

	// Store statements by operation: a verb and a table, a few dozen.
	ops := after["lakeshore_store_operation_duration_seconds"]
	if ops == nil || len(ops.Metric) < 5 || len(ops.Metric) > 80 {
		t.Fatalf("store operations: %v", ops)
	}
	opName := regexp.MustCompile(`^(select|insert|update|delete)_[a-z_0-9]+$|^pipeline$`)
	for _, m := range ops.Metric {
		if op := m.Label[0].GetValue(); !opName.MatchString(op) {
			t.Errorf("store operation label %q", op)
		}
	}
	if n, _ := after.hist("lakeshore_store_operation_duration_seconds", l("operation", "update_commands")); n == 0 {
		t.Errorf("no update_commands statement observed (Take marks commands delivered)")
	}

	// Daemons by state: what the operator API derives, stale included.
	states := func() map[string]float64 {
		ws := expectJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil), http.StatusOK, "list workers")
		by := map[string]float64{}
		for _, w := range ws.Workers {
			by[w.State]++
		}
		return by
	}
	checkStates := func(f families, want map[string]float64) {
		t.Helper()
		for _, st := range workerStates {
			if got := f.value("lakeshore_daemons", l("state", st)); got != want[st] {
				t.Errorf("daemons %s: %v, want %v (the API says %v)", st, got, want[st], want)
			}
			if f.series("lakeshore_daemons", l("state", st)) == nil {
				t.Errorf("no lakeshore_daemons series for state %s", st)
			}
		}
	}
	api := states()
	if api[operatorapi.StateStale] != 0 || len(api) == 0 {
		t.Fatalf("the API says %v", api)
	}
	checkStates(after, api)
	e.clock.Advance(operatorapi.StaleAfter + time.Second)
	api = states()
	if api[operatorapi.StateStale] != 2 {
		t.Fatalf("the API says %v after the stale window", api)
	}
	checkStates(e.scrape(), api)
}

// The fleet counts are read once per TTL however often Prometheus
// scrapes: a scrape within it serves what the last read found.
func TestMetricsFleetCountsAreCached(t *testing.T) {
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "lakeshore.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := &workerCountingStore{Store: db}
	e := newEnv(t, withMetricsToken, func(c *Config) { c.Store = st })
	e.hello("m", "l")
	first := e.scrape()
	if got := first.value("lakeshore_daemons", l("state", operatorapi.StateStale)); got != 0 {
		t.Fatalf("stale at once: %v", got)
	}
	e.clock.Advance(operatorapi.StaleAfter + time.Second)
	if n := st.counts.Load(); n != 1 {
		t.Fatalf("one scrape counted the workers %d times", n)
	}
	second := e.scrape()
	if got := second.value("lakeshore_daemons", l("state", operatorapi.StateStale)); got != 0 {
		t.Fatalf("a scrape within the TTL read the store again: stale %v", got)
	}
	if n := st.counts.Load(); n != 1 {
		t.Fatalf("two scrapes within the TTL counted the workers %d times", n)
	}
	e.srv.metrics.fleet.setTTL(0)
	if got := e.scrape().value("lakeshore_daemons", l("state", operatorapi.StateStale)); got != 1 {
		t.Fatalf("once the TTL is over: stale %v, want 1", got)
	}
}

// A long-poll parked counts as held until it is answered.
func TestMetricsLongPollsHeld(t *testing.T) {
	e := newEnv(t, withMetricsToken)
	id, cur := e.hello("m", "l")
	if got := e.scrape().value("lakeshore_long_polls_held", nil); got != 0 {
		t.Fatalf("held before any poll: %v", got)
	}
	answered := make(chan messages.PollResponse, 1)
	go func() {
		r := doCtx(t, context.Background(), http.MethodPost, e.url+"/v1/daemon/poll", messages.ContentType, testDaemon,
			mustMarshal(t, &messages.PollRequest{WorkerID: id, TimeoutS: 15, Cursor: &cur}))
		var p messages.PollResponse
		_ = messages.Unmarshal(r.body, &p)
		answered <- p
	}()
	e.waitParked(workerKey(id))
	if got := e.scrape().value("lakeshore_long_polls_held", nil); got != 1 {
		t.Fatalf("held while parked: %v, want 1", got)
	}
	e.exec(id, operatorapi.ExecRequest{Command: "true"})
	if p := <-answered; len(p.Commands) != 1 {
		t.Fatalf("the parked poll got %v", commandsOf(p))
	}
	if got := e.scrape().value("lakeshore_long_polls_held", nil); got != 0 {
		t.Fatalf("held once answered: %v", got)
	}
}

// On the main listener /metrics needs the metrics token or the admin
// token; without a metrics token configured it is a 404 that says how to
// serve it.
func TestMetricsAuth(t *testing.T) {
	e := newEnv(t, withMetricsToken)
	for _, c := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {"wrong", http.StatusUnauthorized}, {testDaemon, http.StatusUnauthorized},
		{testMetricsToken, http.StatusOK}, {testAdmin, http.StatusOK}} {
		r := e.do(http.MethodGet, "/metrics", "", c.token, nil)
		if r.status != c.want {
			t.Errorf("token %q: %d %q, want %d", c.token, r.status, r.body, c.want)
		}
		if c.want == http.StatusUnauthorized && (errField(t, r) != "authorization" || bytes.Contains(r.body, []byte("lakeshore_"))) {
			t.Errorf("token %q: refusal %q", c.token, r.body)
		}
	}
	if n, _ := e.scrape().hist("lakeshore_http_request_duration_seconds", l("route", "GET /metrics", "status", "401")); n != 3 {
		t.Errorf("refused scrapes counted %d, want 3", n)
	}

	off := newEnv(t)
	for _, tok := range []string{"", testAdmin, testMetricsToken} {
		r := off.do(http.MethodGet, "/metrics", "", tok, nil)
		if r.status != http.StatusNotFound || !bytes.Contains(r.body, []byte("--metrics-token")) || !bytes.Contains(r.body, []byte("--metrics-addr")) {
			t.Errorf("no metrics token, bearer %q: %d %q", tok, r.status, r.body)
		}
	}
}

// MetricsAddr is a listener of its own serving /metrics alone,
// unauthenticated; an address that cannot be bound stops New, naming the
// flag.
func TestMetricsSeparateListener(t *testing.T) {
	dir := t.TempDir()
	srv, err := newServer(context.Background(), Config{DataDir: dir, AdminToken: testAdmin, Logger: testLogger(t), MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr, cancel, served := serveLoopback(t, srv)
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	if srv.MetricsAddr() == "" || srv.MetricsAddr() == addr {
		t.Fatalf("metrics address %q (main %q)", srv.MetricsAddr(), addr)
	}
	f := scrapeURL(t, "http://"+srv.MetricsAddr()+"/metrics", "")
	if f["lakeshore_build_info"] == nil || f["lakeshore_daemons"] == nil {
		t.Fatalf("families %v", f)
	}
	for path, want := range map[string]int{"/metrics": http.StatusNotFound, "/healthz": http.StatusOK} {
		if r := doCtx(t, context.Background(), http.MethodGet, "http://"+addr+path, "", "", nil); r.status != want {
			t.Errorf("main listener %s: %d, want %d", path, r.status, want)
		}
	}
	for _, path := range []string{"/healthz", "/v1/namespaces/default/workers", "/"} {
		if r := doCtx(t, context.Background(), http.MethodGet, "http://"+srv.MetricsAddr()+path, "", testAdmin, nil); r.status != http.StatusNotFound {
			t.Errorf("metrics listener %s: %d, want 404", path, r.status)
		}
	}

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, err = newServer(context.Background(), Config{DataDir: t.TempDir(), AdminToken: testAdmin, Logger: testLogger(t), MetricsAddr: busy.Addr().String()})
	if err == nil || !strings.Contains(err.Error(), "--metrics-addr "+busy.Addr().String()) {
		t.Fatalf("New on a busy metrics address: %v", err)
	}
}

// README.md's Metrics section lists every family a Server can register,
// the replicas' lag included.
func TestMetricsREADMEListsEveryFamily(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, found := strings.Cut(string(readme), "\n## Metrics\n")
	if !found {
		t.Fatal(`README.md has no "## Metrics" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	e := newEnv(t)
	names := describedNames(t, e.srv.metrics.all)
	if len(names) < 12 {
		t.Fatalf("only %d families described: %v", len(names), names)
	}
	for _, n := range names {
		if !strings.HasPrefix(n, "lakeshore_") {
			t.Errorf("family %s is not named lakeshore_...", n)
		}
		if !strings.Contains(section, "| `"+n+"` |") {
			t.Errorf("README.md's Metrics table does not list %s", n)
		}
	}
	// And nothing is registered that newMetrics does not know of.
	fams, err := e.srv.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, n := range names {
		known[n] = true
	}
	for _, f := range fams {
		if !known[f.GetName()] {
			t.Errorf("registered family %s is not in metrics.all", f.GetName())
		}
	}
}

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

func describedNames(t *testing.T, cs []prometheus.Collector) []string {
	t.Helper()
	ch := make(chan *prometheus.Desc, 64)
	for _, c := range cs {
		c.Describe(ch)
	}
	close(ch)
	var out []string
	for d := range ch {
		m := descName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("desc %s", d)
		}
		out = append(out, m[1])
	}
	return out
}

func testLogger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
}

// workerCountingStore counts the worker counts a real store is asked for.
type workerCountingStore struct {
	store.Store
	counts atomic.Int64
}

func (c *workerCountingStore) CountWorkers(ctx context.Context, staleBefore time.Time) ([]store.WorkerCount, error) {
	c.counts.Add(1)
	return c.Store.CountWorkers(ctx, staleBefore)
}

// Two replicas on one PostgreSQL: the one whose parked poll another
// replica's exec wakes counts the notification's lag; a replica whose
// notifier says no send time (the in-process bus) exports none.
func TestMetricsReplicaNotificationLag(t *testing.T) {
	pg := realparts.StartPostgres(t)
	replica := func() *env {
		db, err := postgres.Open(context.Background(), pg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		return newEnv(t, withMetricsToken, func(c *Config) { c.Store, c.Notifier = db, db.Notifier() })
	}
	a, b := replica(), replica()
	// Until a replica listens it answers parked polls from the store, not
	// from a notification.
	wait.For(t, 10*time.Second, "the replicas to listen", func() bool { return a.srv.caches.live.Load() && b.srv.caches.live.Load() })
	before := a.scrape()
	if before["lakeshore_replica_notification_lag_seconds"] == nil {
		t.Fatal("a replica does not export the notification lag")
	}
	n0, _ := before.hist("lakeshore_replica_notification_lag_seconds", nil)

	id, cur := a.hello("m", "l")
	polled := make(chan messages.PollResponse, 1)
	go func() { polled <- a.poll(id, &cur, 15, "") }()
	a.waitParked(workerKey(id))
	b.exec(id, operatorapi.ExecRequest{Command: "true"})
	if p := <-polled; len(p.Commands) != 1 {
		t.Fatalf("the poll parked on A got %v", commandsOf(p))
	}
	// The worker's key reached A before its poll was answered.
	n, sum := a.scrape().hist("lakeshore_replica_notification_lag_seconds", nil)
	if n <= n0 || sum < 0 {
		t.Fatalf("lag observations %d (before %d), sum %v", n, n0, sum)
	}

	var bus bus
	lone := newEnv(t, withMetricsToken, func(c *Config) { c.Notifier = bus.member(0) })
	if f := lone.scrape()["lakeshore_replica_notification_lag_seconds"]; f != nil {
		t.Fatalf("a notifier without send times exports lag: %v", f)
	}
}
