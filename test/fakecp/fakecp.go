// Package fakecp is a FAKE control plane for testing the nymph daemon over
// real HTTP. It is not the control plane (that is package controlplane); it
// speaks only the daemon routes, keeps everything in memory, and exists so a
// test can script the server side exactly:
//
//   - every request is recorded (route, headers, raw and decoded body);
//   - commands are queued by the test and delivered on polls, either with
//     the cursor extension (commands stay until a poll acknowledges them) or
//     the legacy delete-on-delivery behaviour;
//   - faults are injected per route: an HTTP status, a hang until the
//     client gives up, a malformed 200 body, or (for polls) a batch taken
//     from the queue whose response is never written;
//   - an empty poll is held up to the daemon's timeout_s (at most a cap),
//     or, WithHoldForever, until the daemon gives up;
//   - a test waits for a condition with Wait, which re-checks it each time a
//     request arrives instead of sleeping.
package fakecp

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"nymph/messages"
)

// Route names a family of daemon requests.
type Route string

// Routes of the fake.
const (
	RouteHello   Route = "hello"
	RoutePoll    Route = "poll"
	RouteAck     Route = "ack"
	RouteResult  Route = "result"
	RouteChunk   Route = "chunk"
	RoutePresign Route = "presign"
	RouteBlob    Route = "blob"
	RouteKeys    Route = "keys"
	RouteEvent   Route = "event"
)

// Request is one recorded request.
type Request struct {
	Route  Route
	Method string
	Path   string
	// ID is the exec id of result and chunk routes.
	ID     string
	Header http.Header
	Body   []byte
	At     time.Time
	// Status is what the fake answered.
	Status int
}

// fault is an injected misbehaviour for the next n requests of a route.
type fault struct {
	kind   string // "status", "hang", "malform", "drop"
	status int
	n      int
}

type queued struct {
	seq int64
	cmd messages.Command
}

// CP is the fake control plane.
type CP struct {
	// URL is the base URL to put in the daemon's config.
	URL string

	t      testing.TB
	srv    *httptest.Server
	closed chan struct{}

	mu        sync.Mutex
	changed   chan struct{}
	requests  []Request
	hellos    []messages.HelloRequest
	polls     []messages.PollRequest
	acks      []messages.Ack
	results   map[string][]messages.ExecResult
	chunks    map[string][]byte
	keys      []messages.KeysRequest
	events    []messages.Event
	faults    map[Route][]*fault
	queue     []queued
	seq       int64
	acked     int64
	cursor    bool
	maxBatch  int
	maxHold   time.Duration
	holdEver  bool
	delivered map[string]int
	workerID  *string
	helloFunc func(*messages.HelloRequest) messages.HelloResponse
	token     string
	pollHook  func(messages.PollRequest)
	blobs     map[string][]byte
	nextID    int
}

// Option configures the fake.
type Option func(*CP)

// WithLegacyCursor makes the fake behave like the original control plane:
// cursor always null, commands deleted as they are delivered.
func WithLegacyCursor() Option { return func(c *CP) { c.cursor = false } }

// WithMaxBatch caps the commands delivered per poll (default 100).
func WithMaxBatch(n int) Option { return func(c *CP) { c.maxBatch = n } }

// WithMaxHold caps how long an empty poll is held open (default 2 s; the
// daemon's timeout_s is honoured when shorter).
func WithMaxHold(d time.Duration) Option { return func(c *CP) { c.maxHold = d } }

// WithHoldForever holds every empty poll open until the client gives up
// (or the fake closes), whatever its timeout_s: a daemon that must not wait
// for a held poll is seen not to.
func WithHoldForever() Option { return func(c *CP) { c.holdEver = true } }

// WithWorkerID sets the worker_id hello answers; nil makes the daemon keep
// its provisional id. Default "w-fake".
func WithWorkerID(id *string) Option { return func(c *CP) { c.workerID = id } }

// WithHello replaces the hello answer entirely (rejects, for instance).
func WithHello(f func(*messages.HelloRequest) messages.HelloResponse) Option {
	return func(c *CP) { c.helloFunc = f }
}

// WithToken makes every route but blobs require "Authorization: Bearer tok".
func WithToken(tok string) Option { return func(c *CP) { c.token = tok } }

// WithPollHook has f called with each poll as it arrives, before it is
// recorded or answered: for a test that looks at the world at that moment.
func WithPollHook(f func(messages.PollRequest)) Option { return func(c *CP) { c.pollHook = f } }

// New starts a fake control plane on loopback; it stops when the test ends.
func New(t testing.TB, opts ...Option) *CP {
	t.Helper()
	wid := "w-fake"
	c := &CP{
		t: t, closed: make(chan struct{}), changed: make(chan struct{}),
		results: map[string][]messages.ExecResult{}, chunks: map[string][]byte{},
		faults: map[Route][]*fault{}, cursor: true, maxBatch: 100, maxHold: 2 * time.Second,
		workerID: &wid, blobs: map[string][]byte{}, delivered: map[string]int{},
	}
	for _, o := range opts {
		o(c)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/daemon/hello", c.handle(RouteHello, c.hello))
	mux.HandleFunc("POST /v1/daemon/poll", c.handle(RoutePoll, c.poll))
	mux.HandleFunc("POST /v1/daemon/ack", c.handle(RouteAck, c.ack))
	mux.HandleFunc("POST /v1/daemon/keys", c.handle(RouteKeys, c.keysRoute))
	mux.HandleFunc("POST /v1/daemon/event", c.handle(RouteEvent, c.event))
	mux.HandleFunc("POST /v1/daemon/exec/{exec_id}/result", c.handle(RouteResult, c.result))
	mux.HandleFunc("POST /v1/daemon/exec/{exec_id}/chunk", c.handle(RouteChunk, c.chunk))
	mux.HandleFunc("POST /v1/namespaces/{ns}/payloads/presign", c.handle(RoutePresign, c.presign))
	mux.HandleFunc("GET /blobs/{key}", c.handle(RouteBlob, c.blob))
	c.srv = httptest.NewServer(mux)
	c.URL = c.srv.URL
	t.Cleanup(c.Close)
	return c
}

// Close releases held requests and stops the server. Tests need not call
// it; it runs at cleanup.
func (c *CP) Close() {
	c.mu.Lock()
	select {
	case <-c.closed:
		c.mu.Unlock()
		return
	default:
		close(c.closed)
	}
	c.mu.Unlock()
	c.srv.CloseClientConnections()
	c.srv.Close()
}

// CloseClientConnections drops every open connection (idle ones included),
// so goroutine counts can be compared.
func (c *CP) CloseClientConnections() { c.srv.CloseClientConnections() }

// Changed returns a channel closed at the next recorded request or queue
// change.
func (c *CP) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// notify must be called with mu held.
func (c *CP) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Wait blocks until cond holds, re-checking on every change and at least
// every 50 ms, and fails the test with what after timeout.
func (c *CP) Wait(timeout time.Duration, what string, cond func() bool) {
	c.t.Helper()
	if !c.WaitUntil(timeout, cond) {
		c.t.Fatalf("fakecp: timed out after %v waiting for %s", timeout, what)
	}
}

// WaitUntil is Wait without failing: it reports whether cond came true.
func (c *CP) WaitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ch := c.Changed()
		if cond() {
			return true
		}
		select {
		case <-ch:
		case <-tick.C:
		case <-deadline.C:
			return cond()
		}
	}
}

// --- commands ---

// NewID returns a fresh command id.
func (c *CP) NewID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID++
	return fmt.Sprintf("cmd-%d", c.nextID)
}

// Queue appends commands for delivery, in order.
func (c *CP) Queue(cmds ...messages.Command) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cmd := range cmds {
		c.seq++
		c.queue = append(c.queue, queued{seq: c.seq, cmd: cmd})
	}
	c.notify()
}

// QueueKind encodes body as a command of kind and queues it; it returns the
// command id. A nil body is sent as msgpack nil.
func (c *CP) QueueKind(kind string, body any) string {
	id := c.NewID()
	cmd, err := messages.EncodeCommand(id, kind, body)
	if err != nil {
		c.t.Fatalf("fakecp: encode %s: %v", kind, err)
	}
	c.Queue(cmd)
	return id
}

// QueueRaw queues a command whose body is exactly raw (malformed on purpose,
// say).
func (c *CP) QueueRaw(id, kind string, raw []byte) {
	c.Queue(messages.Command{ID: id, Kind: kind, Body: raw})
}

// QueueExec queues an exec.
func (c *CP) QueueExec(e messages.Exec) string { return c.QueueKind(messages.KindExec, &e) }

// QueueSetup queues a setup.
func (c *CP) QueueSetup(s messages.Setup) string { return c.QueueKind(messages.KindSetup, &s) }

// QueueRun queues a run.
func (c *CP) QueueRun(r messages.Run) string { return c.QueueKind(messages.KindRun, &r) }

// Queued is how many commands are not acknowledged yet.
func (c *CP) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// PutBlob stores a payload for presign "get" of key.
func (c *CP) PutBlob(key string, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.blobs[key] = data
}

// --- faults ---

// Fail answers the next n requests of route with status.
func (c *CP) Fail(route Route, n, status int) {
	c.addFault(route, &fault{kind: "status", status: status, n: n})
}

// Hang holds the next n requests of route until the client gives up.
func (c *CP) Hang(route Route, n int) { c.addFault(route, &fault{kind: "hang", n: n}) }

// Malform answers the next n requests of route with 200 and a body that is
// not msgpack.
func (c *CP) Malform(route Route, n int) { c.addFault(route, &fault{kind: "malform", n: n}) }

// DropPollResponses takes a batch from the queue for the next n polls, as a
// real poll would, then never writes the response: the daemon has to
// abandon the poll. With the cursor the batch is delivered again later.
func (c *CP) DropPollResponses(n int) { c.addFault(RoutePoll, &fault{kind: "drop", n: n}) }

func (c *CP) addFault(route Route, f *fault) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults[route] = append(c.faults[route], f)
}

// takeFault must be called with mu held.
func (c *CP) takeFault(route Route) *fault {
	fs := c.faults[route]
	if len(fs) == 0 {
		return nil
	}
	f := fs[0]
	f.n--
	if f.n <= 0 {
		c.faults[route] = fs[1:]
	}
	return f
}

// --- recordings ---

// Requests returns every request so far.
func (c *CP) Requests() []Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.requests)
}

// Count is how many requests of route arrived.
func (c *CP) Count(route Route) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.requests {
		if r.Route == route {
			n++
		}
	}
	return n
}

// Hellos returns the decoded hello requests.
func (c *CP) Hellos() []messages.HelloRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.hellos)
}

// Polls returns the decoded poll requests.
func (c *CP) Polls() []messages.PollRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.polls)
}

// Acks returns the accepted acks, in arrival order.
func (c *CP) Acks() []messages.Ack {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.acks)
}

// Results returns every accepted exec result by exec id (more than one
// entry for an id means it was posted more than once).
func (c *CP) Results() map[string][]messages.ExecResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string][]messages.ExecResult, len(c.results))
	for k, v := range c.results {
		out[k] = slices.Clone(v)
	}
	return out
}

// Result returns the first accepted result of an exec.
func (c *CP) Result(execID string) (messages.ExecResult, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.results[execID]
	if len(r) == 0 {
		return messages.ExecResult{}, false
	}
	return r[0], true
}

// WaitResult waits for an exec's result and returns it.
func (c *CP) WaitResult(execID string, timeout time.Duration) messages.ExecResult {
	c.t.Helper()
	var r messages.ExecResult
	c.Wait(timeout, "result of exec "+execID, func() bool {
		var ok bool
		r, ok = c.Result(execID)
		return ok
	})
	return r
}

// DeliveredBy returns the index, in Polls(), of the poll whose answer first
// carried command id; ok is false while no answer has carried it.
func (c *CP) DeliveredBy(id string) (poll int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	poll, ok = c.delivered[id]
	return poll, ok
}

// Chunks returns the accepted log bytes of an exec, concatenated in order.
func (c *CP) Chunks(execID string) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.chunks[execID])
}

// Events returns the accepted events, in arrival order (a repeated post
// appears twice).
func (c *CP) Events() []messages.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// Keys returns the recorded key rotation requests.
func (c *CP) Keys() []messages.KeysRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.keys)
}

// --- handlers ---

type handler func(w http.ResponseWriter, r *http.Request, rec *Request) int

func (c *CP) handle(route Route, h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := Request{Route: route, Method: r.Method, Path: r.URL.Path, ID: r.PathValue("exec_id"),
			Header: r.Header.Clone(), Body: body, At: time.Now()}
		rw := &recorder{ResponseWriter: w, commit: func(status int) {
			rec.Status = status
			c.mu.Lock()
			c.requests = append(c.requests, rec)
			c.notify()
			c.mu.Unlock()
		}}
		status := c.serve(route, h, rw, r, &rec)
		rw.record(status)
	}
}

// recorder records a request the moment its answer starts, before the
// client can see any of it: a test that waits on what the daemon did after
// an answer always finds the request that got it in Requests().
type recorder struct {
	http.ResponseWriter
	commit func(status int)
	done   bool
}

func (w *recorder) record(status int) {
	if !w.done {
		w.done = true
		w.commit(status)
	}
}

func (w *recorder) WriteHeader(code int) {
	w.record(code)
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	w.record(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (c *CP) serve(route Route, h handler, w http.ResponseWriter, r *http.Request, rec *Request) int {
	if c.token != "" && route != RouteBlob && r.Header.Get("Authorization") != "Bearer "+c.token {
		http.Error(w, "bad token", http.StatusUnauthorized)
		return http.StatusUnauthorized
	}
	c.mu.Lock()
	f := c.takeFault(route)
	c.mu.Unlock()
	if f != nil {
		switch f.kind {
		case "status":
			http.Error(w, "injected failure", f.status)
			return f.status
		case "hang":
			c.hold(r, 0)
			return 0
		case "malform":
			w.Header().Set("Content-Type", messages.ContentType)
			_, _ = w.Write([]byte{0xc1, 0x00, 0xff})
			return http.StatusOK
		case "drop":
			var req messages.PollRequest
			if err := messages.Unmarshal(rec.Body, &req); err == nil {
				c.mu.Lock()
				c.polls = append(c.polls, req)
				_, _ = c.take(&req)
				c.mu.Unlock()
			}
			c.hold(r, 0)
			return 0
		}
	}
	return h(w, r, rec)
}

// hold blocks until the client goes away, the fake closes, or d passes
// (d = 0: no limit).
func (c *CP) hold(r *http.Request, d time.Duration) {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-r.Context().Done():
	case <-c.closed:
	case <-timeout:
	}
}

func (c *CP) write(w http.ResponseWriter, v any) int {
	b, err := messages.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", messages.ContentType)
	_, _ = w.Write(b)
	return http.StatusOK
}

func (c *CP) bad(w http.ResponseWriter, err error, field string) int {
	b, _ := messages.Marshal(&messages.ValidationError{Error: err.Error(), Field: field})
	w.Header().Set("Content-Type", messages.ContentType)
	w.WriteHeader(http.StatusUnprocessableEntity)
	_, _ = w.Write(b)
	return http.StatusUnprocessableEntity
}

func (c *CP) hello(w http.ResponseWriter, r *http.Request, rec *Request) int {
	var req messages.HelloRequest
	if err := messages.Unmarshal(rec.Body, &req); err != nil {
		return c.bad(w, err, "body")
	}
	if req.MachineID == "" {
		return c.bad(w, fmt.Errorf("missing"), "machine_id")
	}
	c.mu.Lock()
	c.hellos = append(c.hellos, req)
	resp := messages.HelloResponse{WorkerID: c.workerID, SessionTTLS: 86400, Config: map[string]any{}}
	if c.cursor {
		cur := strconv.FormatInt(c.acked, 10)
		resp.Cursor = &cur
	}
	f := c.helloFunc
	c.mu.Unlock()
	if f != nil {
		resp = f(&req)
	}
	return c.write(w, &resp)
}

// take removes what the poll's cursor acknowledges and returns the batch to
// deliver; mu must be held.
func (c *CP) take(req *messages.PollRequest) ([]messages.Command, int64) {
	if c.cursor && req.Cursor != nil {
		if n, err := strconv.ParseInt(*req.Cursor, 10, 64); err == nil && n > c.acked {
			c.acked = n
			c.queue = slices.DeleteFunc(c.queue, func(q queued) bool { return q.seq <= n })
		}
	}
	var batch []messages.Command
	var lastSeq int64
	for _, q := range c.queue {
		if len(batch) == c.maxBatch {
			break
		}
		// Unlike the real store, the fake does not end a batch at a
		// hibernate: tests need to see the daemon discard the rest.
		batch = append(batch, q.cmd)
		lastSeq = q.seq
	}
	if len(batch) > 0 && (!c.cursor || req.Cursor == nil) {
		c.queue = c.queue[len(batch):]
		c.acked = lastSeq
	}
	return batch, lastSeq
}

func (c *CP) poll(w http.ResponseWriter, r *http.Request, rec *Request) int {
	var req messages.PollRequest
	if err := messages.Unmarshal(rec.Body, &req); err != nil {
		return c.bad(w, err, "body")
	}
	if c.pollHook != nil {
		c.pollHook(req)
	}
	c.mu.Lock()
	c.polls = append(c.polls, req)
	index := len(c.polls) - 1
	holdEver := c.holdEver
	c.notify()
	c.mu.Unlock()
	hold := min(time.Duration(req.TimeoutS*float64(time.Second)), c.maxHold)
	deadline := time.NewTimer(hold)
	defer deadline.Stop()
	var expired <-chan time.Time
	if !holdEver {
		expired = deadline.C
	}
	for {
		c.mu.Lock()
		batch, lastSeq := c.take(&req)
		ch := c.changed
		resp := messages.PollResponse{Commands: batch}
		if c.cursor {
			cur := strconv.FormatInt(max(c.acked, lastSeq), 10)
			resp.Cursor = &cur
		}
		for _, cmd := range batch {
			if _, seen := c.delivered[cmd.ID]; !seen {
				c.delivered[cmd.ID] = index
			}
		}
		c.mu.Unlock()
		if len(batch) > 0 {
			return c.write(w, &resp)
		}
		select {
		case <-ch:
		case <-expired:
			return c.write(w, &resp)
		case <-r.Context().Done():
			return 0
		case <-c.closed:
			return 0
		}
	}
}

func (c *CP) ack(w http.ResponseWriter, r *http.Request, rec *Request) int {
	var a messages.Ack
	if err := messages.Unmarshal(rec.Body, &a); err != nil {
		return c.bad(w, err, "body")
	}
	c.mu.Lock()
	c.acks = append(c.acks, a)
	c.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

func (c *CP) event(w http.ResponseWriter, r *http.Request, rec *Request) int {
	var e messages.Event
	if err := messages.Unmarshal(rec.Body, &e); err != nil {
		return c.bad(w, err, "body")
	}
	if e.InvocationID == "" || e.Kind == "" {
		return c.bad(w, fmt.Errorf("missing"), "invocation_id")
	}
	c.mu.Lock()
	c.events = append(c.events, e)
	c.mu.Unlock()
	return c.write(w, map[string]any{"ok": true})
}

func (c *CP) keysRoute(w http.ResponseWriter, r *http.Request, rec *Request) int {
	var k messages.KeysRequest
	if err := messages.Unmarshal(rec.Body, &k); err != nil {
		return c.bad(w, err, "body")
	}
	c.mu.Lock()
	c.keys = append(c.keys, k)
	c.mu.Unlock()
	return c.write(w, &messages.KeysResponse{KeyID: &k.KeyID})
}

func (c *CP) result(w http.ResponseWriter, r *http.Request, rec *Request) int {
	var res messages.ExecResult
	if err := messages.Unmarshal(rec.Body, &res); err != nil {
		return c.bad(w, err, "body")
	}
	c.mu.Lock()
	c.results[rec.ID] = append(c.results[rec.ID], res)
	c.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

func (c *CP) chunk(w http.ResponseWriter, r *http.Request, rec *Request) int {
	if r.Header.Get("Content-Type") != "application/octet-stream" {
		http.Error(w, "want application/octet-stream", http.StatusUnsupportedMediaType)
		return http.StatusUnsupportedMediaType
	}
	c.mu.Lock()
	c.chunks[rec.ID] = append(c.chunks[rec.ID], rec.Body...)
	c.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

func (c *CP) presign(w http.ResponseWriter, r *http.Request, rec *Request) int {
	var req messages.PresignRequest
	if err := messages.Unmarshal(rec.Body, &req); err != nil {
		return c.bad(w, err, "body")
	}
	if req.Op != messages.PresignGet || req.Key == nil {
		return c.bad(w, fmt.Errorf("only get with a key"), "op")
	}
	c.mu.Lock()
	_, ok := c.blobs[*req.Key]
	c.mu.Unlock()
	if !ok {
		http.Error(w, "no such payload", http.StatusNotFound)
		return http.StatusNotFound
	}
	return c.write(w, &messages.PresignResponse{URL: "/blobs/" + *req.Key, Key: *req.Key,
		ExpiresAtS: messages.Epoch(time.Now().Add(time.Hour).Unix())})
}

func (c *CP) blob(w http.ResponseWriter, r *http.Request, rec *Request) int {
	c.mu.Lock()
	data, ok := c.blobs[r.PathValue("key")]
	c.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return http.StatusNotFound
	}
	_, _ = w.Write(data)
	return http.StatusOK
}
