package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/localdaemon"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/servecli"
	"nymph/messages"
)

const adminToken = "admin-secret"

// step is one thing a fake exec does when it is next read: emit output,
// or finish with an exit code.
type step struct {
	out    string
	finish bool
	code   int32
	result messages.ExecResult
}

type fakeExec struct {
	id, worker, command string
	steps               []step
	output              []byte
	state               string
	result              *operatorapi.ExecResult
}

// fakeCP is a control plane speaking operatorapi over real HTTP, with
// canned workers and scripted execs, recording every mutating request.
type fakeCP struct {
	t   *testing.T
	url string

	mu        sync.Mutex
	workers   []operatorapi.Worker
	steps     []step // script for the next exec
	execs     map[string]*fakeExec
	execReqs  []operatorapi.ExecRequest
	execPaths []string
	killed    []string
	killQuery []string
	cleanups  []operatorapi.CleanupRequest
	hibernate []operatorapi.HibernateRequest
	cancels   []operatorapi.CancelRequest
	setups    []operatorapi.SetupRequest
	resets    []string
	tokens    []operatorapi.TokenRequest
	getExecs  int
	// failGetExecs answers this many exec reads with a 503 first.
	failGetExecs int
	paths        []string
	// hibernateErr, when set, is returned for hibernate requests.
	hibernateErr *operatorapi.Error
}

func newFakeCP(t *testing.T, workers ...operatorapi.Worker) *fakeCP {
	t.Helper()
	f := &fakeCP{t: t, workers: workers, execs: map[string]*fakeExec{}}
	mux := http.NewServeMux()
	mux.HandleFunc(operatorapi.RouteListWorkers, f.list)
	mux.HandleFunc(operatorapi.RouteGetWorker, f.get)
	mux.HandleFunc(operatorapi.RouteKillWorker, f.kill)
	mux.HandleFunc(operatorapi.RouteCleanup, f.cleanup)
	mux.HandleFunc(operatorapi.RouteWorkerExec, f.exec)
	mux.HandleFunc(operatorapi.RouteQueueExec, f.exec)
	mux.HandleFunc(operatorapi.RouteGetExec, f.getExec)
	mux.HandleFunc(operatorapi.RouteSetup, f.queued("setup", &f.setups))
	mux.HandleFunc(operatorapi.RouteHibernate, f.hib)
	mux.HandleFunc(operatorapi.RouteReset, func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.resets = append(f.resets, r.PathValue("id"))
		f.mu.Unlock()
		reply(w, 202, operatorapi.Queued{CommandID: "cmd-reset", WorkerID: r.PathValue("id"), Kind: "reset_backoff"})
	})
	mux.HandleFunc(operatorapi.RouteCancel, f.queued("cancel", &f.cancels))
	mux.HandleFunc(operatorapi.RouteListCommands, func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, []operatorapi.CommandInfo{{ID: "c1", Kind: "setup", State: "queued", CreatedAt: time.Now()}})
	})
	mux.HandleFunc(operatorapi.RouteCreateToken, mintToken(&f.mu, &f.tokens))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+adminToken {
			reply(w, 401, operatorapi.Error{Error: "missing or wrong admin token"})
			return
		}
		f.mu.Lock()
		f.paths = append(f.paths, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeCP) find(id string) (operatorapi.Worker, bool) {
	for _, w := range f.workers {
		if w.ID == id {
			return w, true
		}
	}
	return operatorapi.Worker{}, false
}

func (f *fakeCP) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Reverse order, so the CLI's own sorting is what the tests see.
	out := make([]operatorapi.Worker, 0, len(f.workers))
	for i := len(f.workers) - 1; i >= 0; i-- {
		out = append(out, f.workers[i])
	}
	reply(w, 200, operatorapi.WorkerList{Workers: out})
}

func (f *fakeCP) get(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	wk, ok := f.find(r.PathValue("id"))
	if !ok {
		reply(w, 404, operatorapi.Error{Error: "no such worker", Field: "id"})
		return
	}
	reply(w, 200, wk)
}

func (f *fakeCP) kill(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := r.PathValue("id")
	if _, ok := f.find(id); !ok {
		reply(w, 404, operatorapi.Error{Error: "no such worker", Field: "id"})
		return
	}
	f.killed = append(f.killed, id)
	f.killQuery = append(f.killQuery, r.URL.RawQuery)
	reply(w, 200, operatorapi.KillResponse{Deleted: id, Terminated: r.URL.Query().Get("terminate") != "false"})
}

func (f *fakeCP) cleanup(w http.ResponseWriter, r *http.Request) {
	var req operatorapi.CleanupRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		reply(w, 400, operatorapi.Error{Error: err.Error()})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, req)
	if req.OlderThanHours <= 0 || req.OlderThanHours > operatorapi.MaxCleanupHours {
		reply(w, 400, operatorapi.Error{Error: "olderThanHours must be in (0, 168]", Field: "olderThanHours"})
		return
	}
	cut := time.Now().Add(-time.Duration(req.OlderThanHours * float64(time.Hour)))
	resp := operatorapi.CleanupResponse{DryRun: req.DryRun, Deleted: []operatorapi.Worker{}}
	var keep []operatorapi.Worker
	for _, wk := range f.workers {
		if wk.LastSeenAt.Before(cut) {
			resp.Deleted = append(resp.Deleted, wk)
		} else {
			keep = append(keep, wk)
		}
	}
	resp.Count = len(resp.Deleted)
	if !req.DryRun {
		f.workers = keep
	}
	reply(w, 200, resp)
}

func (f *fakeCP) exec(w http.ResponseWriter, r *http.Request) {
	var req operatorapi.ExecRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		reply(w, 400, operatorapi.Error{Error: err.Error()})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// Like the real control plane: an id, or a label only one worker has.
	worker, label := r.PathValue("id"), ""
	if worker == "" {
		worker = "queue-picked"
	} else if wk, ok := f.find(worker); ok {
		label = wk.Label
	} else {
		var named []operatorapi.Worker
		for _, wk := range f.workers {
			if wk.Label == worker {
				named = append(named, wk)
			}
		}
		switch len(named) {
		case 0:
			reply(w, 404, operatorapi.Error{Error: "no such worker", Field: "id"})
			return
		case 1:
			worker, label = named[0].ID, named[0].Label
		default:
			reply(w, 409, operatorapi.Error{Error: "label names several workers; use an id", Field: "id"})
			return
		}
	}
	id := "exec-" + strconv.Itoa(len(f.execs)+1)
	f.execs[id] = &fakeExec{id: id, worker: worker, command: req.Command, steps: f.steps, state: operatorapi.ExecQueued}
	f.execReqs = append(f.execReqs, req)
	f.execPaths = append(f.execPaths, r.URL.Path)
	reply(w, 202, operatorapi.ExecAccepted{ExecID: id, WorkerID: worker, Label: label})
}

// getExec advances the exec one step per read. An exec with no steps left
// and no result long-polls for the requested wait, as the real one does.
func (f *fakeCP) getExec(w http.ResponseWriter, r *http.Request) {
	offset, _ := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	wait, _ := strconv.Atoi(r.URL.Query().Get("wait"))
	f.mu.Lock()
	f.getExecs++
	if f.failGetExecs > 0 {
		f.failGetExecs--
		f.mu.Unlock()
		reply(w, 503, operatorapi.Error{Error: "the control plane is shutting down"})
		return
	}
	ex, ok := f.execs[r.PathValue("exec_id")]
	if !ok {
		f.mu.Unlock()
		reply(w, 404, operatorapi.Error{Error: "no such exec", Field: "exec_id"})
		return
	}
	if len(ex.steps) > 0 {
		s := ex.steps[0]
		ex.steps = ex.steps[1:]
		ex.state = operatorapi.ExecRunning
		ex.output = append(ex.output, s.out...)
		if s.finish {
			res := operatorapi.ExecResultOf(s.result)
			res.ExitCode = s.code
			ex.result = &res
			ex.state = operatorapi.ExecFinished
		}
	} else if ex.result == nil && wait > 0 {
		f.mu.Unlock()
		select {
		case <-time.After(time.Duration(wait) * time.Second):
		case <-r.Context().Done():
			return
		}
		f.mu.Lock()
	}
	out := operatorapi.Exec{ExecID: ex.id, WorkerID: ex.worker, Command: ex.command, State: ex.state,
		Offset: offset, NextOffset: int64(len(ex.output)), Result: ex.result}
	if offset < int64(len(ex.output)) {
		out.Output = ex.output[offset:]
	}
	f.mu.Unlock()
	reply(w, 200, out)
}

func (f *fakeCP) hib(w http.ResponseWriter, r *http.Request) {
	var req operatorapi.HibernateRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hibernate = append(f.hibernate, req)
	if f.hibernateErr != nil {
		reply(w, 400, f.hibernateErr)
		return
	}
	reply(w, 202, operatorapi.Queued{CommandID: "cmd-hib", WorkerID: r.PathValue("id"), Kind: "hibernate"})
}

func (f *fakeCP) queued(kind string, into any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		switch dst := into.(type) {
		case *[]operatorapi.SetupRequest:
			var req operatorapi.SetupRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			*dst = append(*dst, req)
		case *[]operatorapi.CancelRequest:
			var req operatorapi.CancelRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			*dst = append(*dst, req)
		}
		reply(w, 202, operatorapi.Queued{CommandID: "cmd-" + kind, WorkerID: r.PathValue("id"), Kind: kind})
	}
}

// result of one in-process lakeshore run.
type result struct {
	stdout, stderr string
	code           int
}

// runOpts tune run.
type runOpts struct {
	stdin     string
	stdinTTY  bool
	stderrTTY bool
	env       map[string]string
	ctx       context.Context
	stdout    io.Writer // extra sink, e.g. to cancel on first output
	procName  string    // the program name daemon status and stop look for
}

// adminEnv points the CLI at url with the admin token and a credentials
// file of its own.
func adminEnv(t *testing.T, url string) map[string]string {
	return map[string]string{
		cli.EnvURL:         url,
		cli.EnvAdminToken:  adminToken,
		cli.EnvCredentials: filepath.Join(t.TempDir(), "credentials.json"),
	}
}

// run drives cli.Main in-process against f.
func (f *fakeCP) run(t *testing.T, o runOpts, args ...string) result {
	t.Helper()
	env := adminEnv(t, f.url)
	for k, v := range o.env {
		env[k] = v
	}
	return runCLI(t, o, env, args...)
}

func runCLI(t *testing.T, o runOpts, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	var out io.Writer = &syncBuf{b: &stdout}
	if o.stdout != nil {
		out = io.MultiWriter(out, o.stdout)
	}
	ctx := o.ctx
	if ctx == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
	}
	procName := o.procName
	if procName == "" {
		procName = "no-such-daemon-name-for-tests"
	}
	code := cli.Main(ctx, args, cli.Env{
		Stdin:     strings.NewReader(o.stdin),
		Stdout:    out,
		Stderr:    &syncBuf{b: &stderr},
		Getenv:    func(k string) string { return env[k] },
		StdinTTY:  o.stdinTTY,
		StderrTTY: o.stderrTTY,
		Now:       time.Now,
		Procs:     localdaemon.Scanner{Name: procName},
		// The whole tree, as lakeshore-server has it: serve and blobs run
		// in-process.
		ServerVerbs: servecli.Verbs,
	})
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

type syncBuf struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func fleet() []operatorapi.Worker {
	now := time.Now().UTC()
	return []operatorapi.Worker{
		{ID: "aaaa000000000000000000a1", Label: "gpu-rig-1", State: operatorapi.StateActive, Queues: []string{"gpu"}, Runners: []string{"process", "docker"}, LastSeenAt: now.Add(-2 * time.Second)},
		{ID: "aaaa000000000000000000a2", Label: "gpu-rig-2", State: operatorapi.StateActive, Queues: []string{"gpu"}, Runners: []string{"process"}, LastSeenAt: now.Add(-3 * time.Second)},
		{ID: "bbbb000000000000000000b1", Label: "cpu", State: operatorapi.StateStale, Runners: []string{"process"}, LastSeenAt: now.Add(-5 * time.Hour)},
		{ID: "cccc000000000000000000c1", Label: "fleet-00", State: operatorapi.StateActive, LastSeenAt: now.Add(-30 * time.Hour)},
		{ID: "cccc000000000000000000c2", Label: "fleet-01", State: operatorapi.StateGone, LastSeenAt: now.Add(-50 * time.Hour)},
	}
}

// mintToken answers token create with "dlt_minted", recording each request
// in *tokens under mu.
func mintToken(mu *sync.Mutex, tokens *[]operatorapi.TokenRequest) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req operatorapi.TokenRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		*tokens = append(*tokens, req)
		mu.Unlock()
		reply(w, 201, operatorapi.TokenResponse{Token: "dlt_minted", Kind: req.Kind})
	}
}

// daemonRequest is a msgpack POST of body to url, as a daemon sends it,
// with bearer when it is not empty; it returns the body too, for signing.
func daemonRequest(t *testing.T, url, bearer string, body any) (*http.Request, []byte) {
	t.Helper()
	b, err := messages.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", messages.ContentType)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	return req, b
}
