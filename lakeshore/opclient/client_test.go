package opclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

const token = "secret-admin"

// fakeCP speaks operatorapi over real HTTP and records what it saw.
type fakeCP struct {
	mu   sync.Mutex
	seen []seenReq
	mux  *http.ServeMux
}

type seenReq struct {
	method, path, query, auth, body string
	values                          map[string]string
}

func newFakeCP(t *testing.T) (*fakeCP, *opclient.Client) {
	t.Helper()
	f := &fakeCP{mux: http.NewServeMux()}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := opclient.New(srv.URL+"/", token, opclient.Options{Namespace: "lab"})
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

func (f *fakeCP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+token {
		writeJSON(w, http.StatusUnauthorized, operatorapi.Error{Error: "missing or wrong admin token"})
		return
	}
	f.mux.ServeHTTP(w, r)
}

// handle registers route and answers with resp, recording the request and
// the path values named in keys.
func (f *fakeCP) handle(route string, status int, resp any, keys ...string) {
	f.mux.HandleFunc(route, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		vals := map[string]string{}
		for _, k := range append([]string{"ns"}, keys...) {
			vals[k] = r.PathValue(k)
		}
		f.mu.Lock()
		f.seen = append(f.seen, seenReq{method: r.Method, path: r.URL.EscapedPath(), query: r.URL.RawQuery, auth: r.Header.Get("Authorization"), body: string(b), values: vals})
		f.mu.Unlock()
		writeJSON(w, status, resp)
	})
}

func (f *fakeCP) last(t *testing.T) seenReq {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.seen) == 0 {
		t.Fatal("server saw no request")
	}
	return f.seen[len(f.seen)-1]
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestListAndGetWorkers(t *testing.T) {
	f, c := newFakeCP(t)
	seen := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f.handle(operatorapi.RouteListWorkers, 200, operatorapi.WorkerList{Workers: []operatorapi.Worker{
		{ID: "w1", Label: "gpu-a", State: operatorapi.StateActive, LastSeenAt: seen, Capabilities: operatorapi.Capabilities{Runners: []string{"process"}}},
	}})
	f.handle(operatorapi.RouteGetWorker, 200, operatorapi.Worker{ID: "w1", Label: "gpu-a"}, "id")

	ws, err := c.ListWorkers(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 1 || ws[0].Label != "gpu-a" || !ws[0].LastSeenAt.Equal(seen) || ws[0].Capabilities.Runners[0] != "process" {
		t.Fatalf("workers = %+v", ws)
	}
	got := f.last(t)
	if got.method != "GET" || got.path != "/v1/namespaces/lab/workers" || got.auth != "Bearer "+token {
		t.Fatalf("request = %+v", got)
	}

	w, err := c.GetWorker(ctx(t), "w1")
	if err != nil || w.ID != "w1" {
		t.Fatalf("GetWorker = %+v, %v", w, err)
	}
	if p := f.last(t).path; p != "/v1/namespaces/lab/workers/w1" {
		t.Fatalf("path = %s", p)
	}
}

func TestEmptyListIsNotNil(t *testing.T) {
	f, c := newFakeCP(t)
	f.handle(operatorapi.RouteListWorkers, 200, map[string]any{"workers": nil})
	ws, err := c.ListWorkers(ctx(t))
	if err != nil || ws == nil || len(ws) != 0 {
		t.Fatalf("ListWorkers = %#v, %v", ws, err)
	}
}

func TestPathValuesAreEscaped(t *testing.T) {
	f, c := newFakeCP(t)
	f.handle(operatorapi.RouteGetWorker, 200, operatorapi.Worker{ID: "x"}, "id")
	if _, err := c.GetWorker(ctx(t), "a/b c"); err != nil {
		t.Fatal(err)
	}
	got := f.last(t)
	if got.values["id"] != "a/b c" || got.values["ns"] != "lab" {
		t.Fatalf("server saw %+v", got)
	}
	if _, err := c.GetWorker(ctx(t), ""); err == nil {
		t.Fatal("empty id accepted")
	} else {
		var e *opclient.Error
		if !errors.As(err, &e) || e.Field != "id" {
			t.Fatalf("err = %v", err)
		}
	}
}

func TestKillAndCleanup(t *testing.T) {
	f, c := newFakeCP(t)
	f.handle(operatorapi.RouteKillWorker, 200, operatorapi.KillResponse{Deleted: "w1", Terminated: true}, "id")
	f.handle(operatorapi.RouteCleanup, 200, operatorapi.CleanupResponse{Count: 1, DryRun: true, Deleted: []operatorapi.Worker{{ID: "w9"}}})

	kr, err := c.KillWorker(ctx(t), "w1", true)
	if err != nil || kr.Deleted != "w1" || !kr.Terminated {
		t.Fatalf("kill = %+v, %v", kr, err)
	}
	if got := f.last(t); got.method != "DELETE" || got.query != "" {
		t.Fatalf("kill request = %+v", got)
	}
	if _, err := c.KillWorker(ctx(t), "w1", false); err != nil {
		t.Fatal(err)
	}
	if q := f.last(t).query; q != "terminate=false" {
		t.Fatalf("no-terminate query = %q", q)
	}

	cr, err := c.Cleanup(ctx(t), operatorapi.CleanupRequest{OlderThanHours: 2.5, DryRun: true})
	if err != nil || cr.Count != 1 || cr.Deleted[0].ID != "w9" {
		t.Fatalf("cleanup = %+v, %v", cr, err)
	}
	var body operatorapi.CleanupRequest
	if err := json.Unmarshal([]byte(f.last(t).body), &body); err != nil || body.OlderThanHours != 2.5 || !body.DryRun {
		t.Fatalf("cleanup body = %s (%v)", f.last(t).body, err)
	}
}

func TestExecRoundTrip(t *testing.T) {
	f, c := newFakeCP(t)
	f.handle(operatorapi.RouteWorkerExec, 202, operatorapi.ExecAccepted{ExecID: "e1", WorkerID: "w1"}, "id")
	f.handle(operatorapi.RouteQueueExec, 202, operatorapi.ExecAccepted{ExecID: "e2", WorkerID: "w2"})
	f.handle(operatorapi.RouteGetExec, 200, operatorapi.Exec{ExecID: "e1", State: operatorapi.ExecFinished, Output: []byte("hi\n"), Offset: 4, NextOffset: 7,
		Result: &operatorapi.ExecResult{ExitCode: 3}}, "exec_id")

	acc, err := c.Exec(ctx(t), "w1", operatorapi.ExecRequest{Command: "echo hi", Env: map[string]string{"A": "1"}, Stdin: []byte{0, 1, 2}, TimeoutS: 1.5, Stream: true})
	if err != nil || acc.ExecID != "e1" {
		t.Fatalf("exec = %+v, %v", acc, err)
	}
	var req operatorapi.ExecRequest
	if err := json.Unmarshal([]byte(f.last(t).body), &req); err != nil {
		t.Fatal(err)
	}
	if req.Command != "echo hi" || req.Env["A"] != "1" || string(req.Stdin) != "\x00\x01\x02" || req.TimeoutS != 1.5 || !req.Stream {
		t.Fatalf("exec body = %+v", req)
	}

	acc, err = c.QueueExec(ctx(t), operatorapi.ExecRequest{Command: "true", Queue: "gpu"})
	if err != nil || acc.WorkerID != "w2" {
		t.Fatalf("queue exec = %+v, %v", acc, err)
	}
	if got := f.last(t); got.path != "/v1/namespaces/lab/exec" || !strings.Contains(got.body, `"queue":"gpu"`) {
		t.Fatalf("queue exec request = %+v", got)
	}

	ex, err := c.GetExec(ctx(t), "e1", 1500*time.Millisecond, 4)
	if err != nil {
		t.Fatal(err)
	}
	if string(ex.Output) != "hi\n" || ex.NextOffset != 7 || ex.Result == nil || ex.Result.ExitCode != 3 {
		t.Fatalf("exec = %+v", ex)
	}
	if q := f.last(t).query; q != "offset=4&wait=1.5" { // the server takes fractions
		t.Fatalf("get exec query = %q", q)
	}
	if _, err := c.GetExec(ctx(t), "e1", 0, 0); err != nil {
		t.Fatal(err)
	}
	if q := f.last(t).query; q != "" {
		t.Fatalf("plain get exec query = %q", q)
	}
}

func TestWorkerCommands(t *testing.T) {
	f, c := newFakeCP(t)
	q := operatorapi.Queued{CommandID: "c1", WorkerID: "w1", Kind: "setup"}
	for _, r := range []string{operatorapi.RouteSetup, operatorapi.RouteHibernate, operatorapi.RouteReset, operatorapi.RouteCancel} {
		f.handle(r, 202, q, "id")
	}

	if _, err := c.Setup(ctx(t), "w1", operatorapi.SetupRequest{Script: "echo", Sudo: true, RefreshCapabilities: true, Name: "n"}); err != nil {
		t.Fatal(err)
	}
	var setup operatorapi.SetupRequest
	_ = json.Unmarshal([]byte(f.last(t).body), &setup)
	if setup != (operatorapi.SetupRequest{Script: "echo", Sudo: true, RefreshCapabilities: true, Name: "n"}) {
		t.Fatalf("setup body = %+v", setup)
	}

	until := time.Unix(1_900_000_000, 1)
	if _, err := c.Hibernate(ctx(t), "w1", until); err != nil {
		t.Fatal(err)
	}
	var hib operatorapi.HibernateRequest
	_ = json.Unmarshal([]byte(f.last(t).body), &hib)
	if hib.UntilEpochS != 1_900_000_001 {
		t.Fatalf("hibernate body = %s", f.last(t).body)
	}

	if _, err := c.Reset(ctx(t), "w1"); err != nil {
		t.Fatal(err)
	}
	if got := f.last(t); got.method != "POST" || got.path != "/v1/namespaces/lab/workers/w1/reset" {
		t.Fatalf("reset = %+v", got)
	}

	got, err := c.Cancel(ctx(t), "w1", operatorapi.CancelRequest{ExecID: "e7"})
	if err != nil || got != q {
		t.Fatalf("cancel = %+v, %v", got, err)
	}
	if b := f.last(t).body; !strings.Contains(b, `"execId":"e7"`) {
		t.Fatalf("cancel body = %s", b)
	}
}

func TestTokensAndCommands(t *testing.T) {
	f, c := newFakeCP(t)
	exp := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	f.handle(operatorapi.RouteCreateToken, 201, operatorapi.TokenResponse{Token: "dle_x", Kind: operatorapi.TokenEnroll, ExpiresAt: &exp})
	tr, err := c.CreateToken(ctx(t), operatorapi.TokenRequest{Kind: operatorapi.TokenEnroll, TTLS: 3600})
	if err != nil || tr.Token != "dle_x" || !tr.ExpiresAt.Equal(exp) {
		t.Fatalf("token = %+v, %v", tr, err)
	}
	if got := f.last(t); got.path != "/v1/tokens" || !strings.Contains(got.body, `"ttlS":3600`) {
		t.Fatalf("token request = %+v", got)
	}

	cmds := []operatorapi.CommandInfo{{ID: "c1", Kind: "exec", State: "queued"}}
	f.handle(operatorapi.RouteListCommands, 200, cmds, "id")
	list, err := c.ListCommands(ctx(t), "w1")
	if err != nil || len(list) != 1 || list[0].ID != "c1" {
		t.Fatalf("commands (array) = %+v, %v", list, err)
	}

	f2, c2 := newFakeCP(t)
	f2.handle(operatorapi.RouteListCommands, 200, map[string]any{"commands": cmds}, "id")
	list, err = c2.ListCommands(ctx(t), "w1")
	if err != nil || len(list) != 1 || list[0].Kind != "exec" {
		t.Fatalf("commands (object) = %+v, %v", list, err)
	}
}

func TestErrorsCarryStatusAndField(t *testing.T) {
	f, c := newFakeCP(t)
	f.handle(operatorapi.RouteHibernate, 400, operatorapi.Error{Error: "deadline is in the past", Field: "untilEpochS"}, "id")
	f.handle(operatorapi.RouteGetWorker, 404, operatorapi.Error{Error: "no such worker"}, "id")
	f.mux.HandleFunc(operatorapi.RouteReset, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
	})

	_, err := c.Hibernate(ctx(t), "w1", time.Unix(1, 0))
	var e *opclient.Error
	if !errors.As(err, &e) || e.Status != 400 || e.Field != "untilEpochS" || e.Message != "deadline is in the past" {
		t.Fatalf("err = %#v", err)
	}
	if msg := err.Error(); msg != `deadline is in the past (field "untilEpochS") (HTTP 400)` {
		t.Fatalf("message = %q", msg)
	}

	_, err = c.GetWorker(ctx(t), "nope")
	if !opclient.IsNotFound(err) || opclient.Retryable(err) {
		t.Fatalf("404 err = %v", err)
	}

	_, err = c.Reset(ctx(t), "w1")
	if opclient.StatusOf(err) != 503 || !opclient.Retryable(err) || !strings.Contains(err.Error(), "upstream unavailable") {
		t.Fatalf("503 err = %v", err)
	}

	bad, err := opclient.New(strings.TrimSuffix(c.BaseURL(), "/"), "wrong", opclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.ListWorkers(ctx(t)); !opclient.IsUnauthorized(err) {
		t.Fatalf("wrong token err = %v", err)
	}
}

func TestTransportError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c, err := opclient.New(url, token, opclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListWorkers(ctx(t))
	if !opclient.IsTransport(err) || !opclient.Retryable(err) || opclient.StatusOf(err) != 0 {
		t.Fatalf("err = %v", err)
	}

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.ListWorkers(cancelled)
	if !errors.Is(err, context.Canceled) || opclient.Retryable(err) {
		t.Fatalf("cancelled err = %v", err)
	}
}

func TestNewValidatesURL(t *testing.T) {
	for _, u := range []string{"", "  ", "ftp://x", "localhost:7700", "http://"} {
		if _, err := opclient.New(u, token, opclient.Options{}); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
	c, err := opclient.New("https://cp.example.internal:7700/", "", opclient.Options{})
	if err != nil || c.Namespace() != operatorapi.DefaultNamespace || c.BaseURL() != "https://cp.example.internal:7700" {
		t.Fatalf("New = %v, %v", c, err)
	}
}

func TestListWorkerPageSendsTheFilter(t *testing.T) {
	f, c := newFakeCP(t)
	f.handle(operatorapi.RouteListWorkers, 200, operatorapi.WorkerList{Total: 7,
		Counts: []operatorapi.StateCount{{State: operatorapi.StateStale, Count: 7}}})
	got, err := c.ListWorkerPage(ctx(t), opclient.WorkerFilter{State: "stale", Queue: "gpu", LabelPrefix: "rig a&b", Limit: 100, Offset: 200})
	if err != nil {
		t.Fatal(err)
	}
	if got.Workers == nil || got.Total != 7 || len(got.Counts) != 1 || got.Counts[0].Count != 7 {
		t.Fatalf("page = %+v", got)
	}
	if q := f.last(t).query; q != "labelPrefix=rig+a%26b&limit=100&offset=200&queue=gpu&state=stale" {
		t.Fatalf("query = %s", q)
	}
	// A zero filter sends no query: the whole list, as ListWorkers.
	if _, err := c.ListWorkerPage(ctx(t), opclient.WorkerFilter{}); err != nil || f.last(t).query != "" {
		t.Fatalf("zero filter: query %q, %v", f.last(t).query, err)
	}
}

func TestListExecsSendsTheFilter(t *testing.T) {
	f, c := newFakeCP(t)
	f.handle(operatorapi.RouteListExecs, 200, operatorapi.ExecList{Execs: []operatorapi.ExecSummary{{ExecID: "e1", State: "queued"}}})
	got, err := c.ListExecs(ctx(t), "w1", 5)
	if err != nil || len(got) != 1 || got[0].ExecID != "e1" {
		t.Fatalf("ListExecs = %+v, %v", got, err)
	}
	if r := f.last(t); r.path != "/v1/namespaces/lab/execs" || r.query != "limit=5&worker=w1" {
		t.Fatalf("request = %+v", r)
	}
}
