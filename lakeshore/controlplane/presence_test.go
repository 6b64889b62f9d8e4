package controlplane

import (
	"context"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/lakeshore/store/sqlite"
	"nymph/messages"
	"nymph/test/wait"
)

// countingStore counts the calls of every store method a daemon route
// can make, so a test can say which requests leave the store alone.
type countingStore struct {
	store.Store
	mu    sync.Mutex
	calls map[string]int
}

func (c *countingStore) count(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = map[string]int{}
	}
	c.calls[name]++
}

// take returns the calls since the last take, "" when there were none.
func (c *countingStore) take() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	for n, k := range c.calls {
		names = append(names, n+"×"+strings.Repeat("I", min(k, 9)))
	}
	sort.Strings(names)
	c.calls = nil
	return strings.Join(names, " ")
}

func (c *countingStore) RecordPoll(ctx context.Context, p store.Poll) (store.Worker, error) {
	c.count("RecordPoll")
	return c.Store.RecordPoll(ctx, p)
}

func (c *countingStore) AckThrough(ctx context.Context, id string, cursor int64, now time.Time) (int64, error) {
	c.count("AckThrough")
	return c.Store.AckThrough(ctx, id, cursor, now)
}

func (c *countingStore) Exec(ctx context.Context, id string) (store.Exec, error) {
	c.count("Exec")
	return c.Store.Exec(ctx, id)
}

func (c *countingStore) TouchWorkers(ctx context.Context, seen []store.Seen) ([]string, error) {
	c.count("TouchWorkers")
	return c.Store.TouchWorkers(ctx, seen)
}

func (c *countingStore) Take(ctx context.Context, id string, after int64, limit int, ackNow bool, now time.Time) ([]store.Command, error) {
	c.count("Take")
	return c.Store.Take(ctx, id, after, limit, ackNow, now)
}

func (c *countingStore) WakePending(ctx context.Context, id string, after int64) (bool, error) {
	c.count("WakePending")
	return c.Store.WakePending(ctx, id, after)
}

func (c *countingStore) ClaimInvocations(ctx context.Context, cl store.Claim) ([]store.Invocation, error) {
	c.count("ClaimInvocations")
	return c.Store.ClaimInvocations(ctx, cl)
}

func (c *countingStore) ReportRunning(ctx context.Context, r store.RunningReport) ([]store.LostInvocation, int, error) {
	c.count("ReportRunning")
	return c.Store.ReportRunning(ctx, r)
}

func (c *countingStore) TargetVersion(ctx context.Context, ns string) (*string, error) {
	c.count("TargetVersion")
	return c.Store.TargetVersion(ctx, ns)
}

func (c *countingStore) TokenByHash(ctx context.Context, hash string) (store.Token, error) {
	c.count("TokenByHash")
	return c.Store.TokenByHash(ctx, hash)
}

func (c *countingStore) Key(ctx context.Context, id string) (store.Key, error) {
	c.count("Key")
	return c.Store.Key(ctx, id)
}

func (c *countingStore) CurrentKey(ctx context.Context, workerID string) (store.Key, error) {
	c.count("CurrentKey")
	return c.Store.CurrentKey(ctx, workerID)
}

func (c *countingStore) UseNonces(ctx context.Context, uses []store.NonceUse) ([]bool, error) {
	c.count("UseNonces")
	return c.Store.UseNonces(ctx, uses)
}

func (c *countingStore) Worker(ctx context.Context, ns, id string) (store.Worker, error) {
	c.count("Worker")
	return c.Store.Worker(ctx, ns, id)
}

func (c *countingStore) ListWorkers(ctx context.Context, ns string) ([]store.Worker, error) {
	c.count("ListWorkers")
	return c.Store.ListWorkers(ctx, ns)
}

func openCounting(t *testing.T) *countingStore {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "counted.db"))
	if err != nil {
		t.Fatal(err)
	}
	return &countingStore{Store: db}
}

// TestEmptyPollTouchesNoStore: once a worker's first poll has recorded
// it, a poll that changes nothing (the same cursor, nothing running, no
// new capabilities) reads and writes nothing — token, worker, queue,
// claims, target version all come from memory — and neither does a
// hibernating daemon's watch poll. Whatever changes something goes to the
// store: a queued exec, the cursor that acknowledges it, new capabilities.
func TestEmptyPollTouchesNoStore(t *testing.T) {
	cs := openCounting(t)
	e := newEnv(t, func(c *Config) { c.Store = cs })
	tok := e.mintToken(operatorapi.TokenRequest{}).Token
	hr := e.helloWith(tok, "m", "quiet", "inc-1")
	id, cur := *hr.WorkerID, *hr.Cursor
	poll := func(req messages.PollRequest) messages.PollResponse {
		t.Helper()
		req.WorkerID = id
		r := e.daemonAs(tok, "/v1/daemon/poll", &req)
		if r.status != http.StatusOK {
			t.Fatalf("poll: %d %q", r.status, r.body)
		}
		return decodeMP[messages.PollResponse](t, r)
	}

	poll(messages.PollRequest{Cursor: &cur}) // the first records the worker
	cs.take()
	for i := 0; i < 3; i++ {
		if p := poll(messages.PollRequest{Cursor: &cur}); len(p.Commands) != 0 || *p.Cursor != cur {
			t.Fatalf("empty poll %d answered %v cursor %s", i, commandsOf(p), *p.Cursor)
		}
		if calls := cs.take(); calls != "" {
			t.Fatalf("empty poll %d called the store: %s", i, calls)
		}
	}
	poll(messages.PollRequest{Cursor: &cur, Hibernating: true})
	if calls := cs.take(); calls != "" {
		t.Fatalf("a watch poll with no wake queued called the store: %s", calls)
	}

	acc := e.exec(id, operatorapi.ExecRequest{Command: "true"})
	cs.take()
	p := poll(messages.PollRequest{Cursor: &cur})
	if len(p.Commands) != 1 || p.Commands[0].Kind != messages.KindExec {
		t.Fatalf("poll after an exec was queued answered %v", commandsOf(p))
	}
	if calls := cs.take(); !strings.Contains(calls, "Take") || strings.Contains(calls, "RecordPoll") {
		t.Fatalf("handing over the exec called %q: want a Take and no RecordPoll", calls)
	}
	next := *p.Cursor
	poll(messages.PollRequest{Cursor: &next}) // acknowledges it
	if calls := cs.take(); calls != "AckThrough×I" {
		t.Fatalf("the poll acknowledging the exec called %q: want its AckThrough alone", calls)
	}
	if cmds, _ := cs.ListCommands(context.Background(), id); len(cmds) != 1 || cmds[0].AckedAt == nil {
		t.Fatalf("exec command after the acknowledging poll: %+v", cmds)
	}
	poll(messages.PollRequest{Cursor: &next})
	if calls := cs.take(); calls != "" {
		t.Fatalf("empty poll after the acknowledgement called the store: %s", calls)
	}
	poll(messages.PollRequest{Cursor: &next, UpdatedCapabilities: &messages.Capabilities{Runners: []string{"echo"}, MaxInvocations: 2}})
	if calls := cs.take(); !strings.Contains(calls, "RecordPoll") {
		t.Fatalf("new capabilities were not recorded: %q", calls)
	}
	if w := e.worker(id); len(w.Capabilities.Runners) != 1 || w.Capabilities.Runners[0] != "echo" {
		t.Fatalf("capabilities after the poll that changed them: %+v", w.Capabilities)
	}
	_ = acc
}

// TestQuietPollsKeepTheWorkerFresh: the last seen of a poll answered from
// memory is what every read shows at once (the worker is not stale), and
// what the store holds after one flush — one TouchWorkers for the lot.
func TestQuietPollsKeepTheWorkerFresh(t *testing.T) {
	cs := openCounting(t)
	e := newEnv(t, func(c *Config) { c.Store = cs })
	a, acur := e.hello("ma", "a")
	b, bcur := e.hello("mb", "b")
	e.poll(a, &acur, 0, "")
	e.poll(b, &bcur, 0, "")
	e.clock.Advance(operatorapi.StaleAfter + time.Second)
	cs.take()
	e.poll(a, &acur, 0, "")
	e.poll(b, &bcur, 0, "")
	if calls := cs.take(); calls != "" {
		t.Fatalf("quiet polls called the store: %s", calls)
	}
	now := e.clock.Now()
	for _, id := range []string{a, b} {
		if w := e.worker(id); w.State == operatorapi.StateStale || !w.LastSeenAt.Equal(now) {
			t.Fatalf("worker %s reads %s, last seen %v, want active at %v", id, w.State, w.LastSeenAt, now)
		}
	}
	cs.take()
	e.srv.flushPresence(context.Background(), e.srv.log)
	if calls := cs.take(); calls != "TouchWorkers×I" {
		t.Fatalf("flush called %q, want one TouchWorkers", calls)
	}
	for _, id := range []string{a, b} {
		if w, err := cs.Store.Worker(context.Background(), "", id); err != nil || !w.LastSeenAt.Equal(now) {
			t.Fatalf("stored last seen of %s: %v %v, want %v", id, w.LastSeenAt, err, now)
		}
	}
	e.srv.flushPresence(context.Background(), e.srv.log)
	if calls := cs.take(); calls != "" {
		t.Fatalf("a flush with nothing new called %q", calls)
	}
}

// TestRemovedWorkerIsNotAnsweredFromMemory: removing a worker drops its
// memo, so its daemon's next poll is told the worker is unknown (and says
// hello again), as before.
func TestRemovedWorkerIsNotAnsweredFromMemory(t *testing.T) {
	e := newEnv(t)
	id, cur := e.hello("m", "doomed")
	e.poll(id, &cur, 0, "")
	e.poll(id, &cur, 0, "") // from memory
	if r := e.op(http.MethodDelete, "/v1/namespaces/default/workers/"+id, nil); r.status != http.StatusOK && r.status != http.StatusNoContent {
		t.Fatalf("kill: %d %s", r.status, r.body)
	}
	r := e.daemon("/v1/daemon/poll", &messages.PollRequest{WorkerID: id, Cursor: &cur})
	if r.status != http.StatusNotFound {
		t.Fatalf("poll of a removed worker: %d %q, want 404", r.status, r.body)
	}
}

// TestReplicasDropWhatChangedElsewhere: two control planes on one store,
// joined by a Notifier. A's caches and memos are dropped by what B
// changes: a token revoked through B is refused by A on the next request;
// a target version set through B is what A's next poll advertises; an
// exec queued through B for a worker A answers from memory is handed over
// by A's next poll.
func TestReplicasDropWhatChangedElsewhere(t *testing.T) {
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "shared.db"))
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{Store: db}
	var bus bus
	a := newEnv(t, func(c *Config) { c.Store, c.Notifier = cs, bus.member(0) })
	b := newEnv(t, func(c *Config) { c.Store, c.Notifier = db, bus.member(0) })
	for _, e := range []*env{a, b} {
		wait.For(t, 10*time.Second, "the replica to listen", e.srv.caches.live.Load)
	}
	tok := a.mintToken(operatorapi.TokenRequest{}).Token
	hr := a.helloWith(tok, "m", "shared", "inc-1")
	id, cur := *hr.WorkerID, *hr.Cursor
	poll := func() resp {
		return a.daemonAs(tok, "/v1/daemon/poll", &messages.PollRequest{WorkerID: id, Cursor: &cur})
	}
	poll()
	cs.take()
	if r := poll(); r.status != http.StatusOK {
		t.Fatalf("poll: %d", r.status)
	}
	if calls := cs.take(); calls != "" {
		t.Fatalf("the quiet poll on A called the store: %s", calls)
	}

	b.exec(id, operatorapi.ExecRequest{Command: "true"})
	r := poll()
	if p := decodeMP[messages.PollResponse](t, r); len(p.Commands) != 1 {
		t.Fatalf("A's poll after an exec queued through B answered %v", commandsOf(p))
	}
	// B said only that a command is queued: A's memo holds but for the
	// take, as when the exec is queued through A itself.
	if calls := cs.take(); !strings.Contains(calls, "Take") || strings.Contains(calls, "RecordPoll") || strings.Contains(calls, "Claim") {
		t.Fatalf("A handing over an exec queued through B called %q: want a Take, no RecordPoll, no claim", calls)
	}
	cur = *decodeMP[messages.PollResponse](t, r).Cursor
	poll()

	if r := b.op(http.MethodPut, "/v1/namespaces/default/target-version", operatorapi.SetTargetVersionRequest{Version: "9.9.9"}); r.status != http.StatusOK {
		t.Fatalf("set target version through B: %d %s", r.status, r.body)
	}
	if p := decodeMP[messages.PollResponse](t, poll()); p.TargetNymphVersion == nil || *p.TargetNymphVersion != "9.9.9" {
		t.Fatalf("A advertises target %v after B set 9.9.9", p.TargetNymphVersion)
	}

	list := expectJS[operatorapi.TokenList](t, b.op(http.MethodGet, "/v1/tokens", nil), http.StatusOK, "list tokens")
	var tokID string
	for _, tk := range list.Tokens {
		if tk.WorkerID == id {
			tokID = tk.ID
		}
	}
	if r := b.op(http.MethodDelete, "/v1/tokens/"+tokID, nil); r.status != http.StatusOK {
		t.Fatalf("revoke through B: %d %s", r.status, r.body)
	}
	if r := poll(); r.status != http.StatusUnauthorized {
		t.Fatalf("A answered a token revoked through B with %d, want 401", r.status)
	}
}

// TestCachesAreOffWhileNotListening: a replica that cannot hear the
// others (its Listen keeps failing) caches nothing: every request reads
// its token again.
func TestCachesAreOffWhileNotListening(t *testing.T) {
	cs := openCounting(t)
	var bus bus
	e := newEnv(t, func(c *Config) { c.Store, c.Notifier = cs, bus.member(1<<30) })
	tok := e.mintToken(operatorapi.TokenRequest{}).Token
	hr := e.helloWith(tok, "m", "deaf", "inc-1")
	id, cur := *hr.WorkerID, *hr.Cursor
	for i := 0; i < 2; i++ {
		cs.take()
		if r := e.daemonAs(tok, "/v1/daemon/poll", &messages.PollRequest{WorkerID: id, Cursor: &cur}); r.status != http.StatusOK {
			t.Fatalf("poll: %d", r.status)
		}
		if calls := cs.take(); !strings.Contains(calls, "TokenByHash") || !strings.Contains(calls, "RecordPoll") {
			t.Fatalf("poll %d of a replica that does not listen called %q: want the token and the worker read", i, calls)
		}
	}
}

// TestPollWaitSpreadsTheFleet: an empty poll ends between 0.8 and 1.0 of
// its wait, at random, so polls that began together end apart.
func TestPollWaitSpreadsTheFleet(t *testing.T) {
	s := &Server{pollCap: maxPollWait}
	seen := map[time.Duration]bool{}
	for i := 0; i < 200; i++ {
		d := s.pollWait(20)
		if d < 16*time.Second || d > 20*time.Second {
			t.Fatalf("wait %v outside [16s, 20s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Fatalf("200 waits took only %d distinct values", len(seen))
	}
	if d := s.pollWait(60); d > maxPollWait || d < maxPollWait*8/10 {
		t.Fatalf("a wait past the cap: %v", d)
	}
	if d := s.pollWait(0); d != 0 {
		t.Fatalf("timeout 0 waits %v", d)
	}
}

// TestALabelIsResolvedWithoutReadingTheFleet: `daemon exec <label>` finds
// its worker through the label's own rows, so its cost does not grow with
// the namespace; a label two workers share is still a 409 naming the way
// out, and an unknown one a 404.
func TestALabelIsResolvedWithoutReadingTheFleet(t *testing.T) {
	cs := openCounting(t)
	e := newEnv(t, func(c *Config) { c.Store = cs })
	tok := e.mintToken(operatorapi.TokenRequest{}).Token
	want := *e.helloWith(tok, "m1", "gpu-rig", "inc-1").WorkerID
	e.helloWith(e.mintToken(operatorapi.TokenRequest{}).Token, "m2", "gpu-rig-2", "inc-2")
	e.helloWith(e.mintToken(operatorapi.TokenRequest{}).Token, "m3", "twin", "inc-3")
	e.helloWith(e.mintToken(operatorapi.TokenRequest{}).Token, "m4", "twin", "inc-4")
	cs.take()

	w := expectJS[operatorapi.Worker](t, e.op(http.MethodGet, "/v1/namespaces/default/workers/gpu-rig", nil), http.StatusOK, "worker by label")
	if w.ID != want || w.Label != "gpu-rig" {
		t.Fatalf("gpu-rig resolved to %s (%s), want %s", w.ID, w.Label, want)
	}
	if calls := cs.take(); strings.Contains(calls, "ListWorkers") {
		t.Fatalf("resolving a label read the whole namespace: %s", calls)
	}
	if r := e.op(http.MethodGet, "/v1/namespaces/default/workers/twin", nil); r.status != http.StatusConflict || !strings.Contains(string(r.body), "use an id") {
		t.Fatalf("shared label: %d %s", r.status, r.body)
	}
	if r := e.op(http.MethodGet, "/v1/namespaces/default/workers/gpu", nil); r.status != http.StatusNotFound {
		t.Fatalf("a label prefix is not a label: %d %s", r.status, r.body)
	}
}

// TestExecByIDReadsNoWorker: an exec addressed by worker id reads no
// worker before it is queued (the enqueue tells what the answer shows);
// one addressed by label reads it; an id of no worker of the namespace is
// a 404 that queues nothing.
func TestExecByIDReadsNoWorker(t *testing.T) {
	cs := openCounting(t)
	e := newEnv(t, func(c *Config) { c.Store = cs })
	id, cur := e.hello("m", "by-id")
	e.poll(id, &cur, 0, "")
	cs.take()
	acc := e.exec(id, operatorapi.ExecRequest{Command: "true"})
	if calls := cs.take(); strings.Contains(calls, "Worker") {
		t.Fatalf("an exec by id called %q: want no worker read", calls)
	}
	if acc.WorkerID != id || acc.Label != "by-id" || acc.WorkerState != operatorapi.StateActive || acc.LastSeenAt == nil || acc.LastSeenAt.IsZero() {
		t.Fatalf("accepted %+v, want the worker's id, label, state and last seen", acc)
	}
	byLabel := e.exec("by-id", operatorapi.ExecRequest{Command: "true"})
	if calls := cs.take(); !strings.Contains(calls, "Worker") || byLabel.WorkerID != id {
		t.Fatalf("an exec by label called %q and went to %s", calls, byLabel.WorkerID)
	}
	for _, path := range []string{
		"/v1/namespaces/other/workers/" + id + "/exec",
		"/v1/namespaces/default/workers/0123456789abcdef01234567/exec",
	} {
		r := e.op(http.MethodPost, path, operatorapi.ExecRequest{Command: "true"})
		if r.status != http.StatusNotFound {
			t.Fatalf("%s: %d %s, want 404", path, r.status, r.body)
		}
	}
	if cmds, _ := cs.ListCommands(context.Background(), id); len(cmds) != 2 {
		t.Fatalf("commands queued: %d, want the two execs alone", len(cmds))
	}
}

// TestResultOfAnExecDeliveredHereReadsNoExec: the result of an exec this
// process handed to its worker is authorized from memory, without a read
// of the exec; a second result is refused as before, after a read.
func TestResultOfAnExecDeliveredHereReadsNoExec(t *testing.T) {
	cs := openCounting(t)
	e := newEnv(t, func(c *Config) { c.Store = cs })
	id, cur := e.hello("m", "results")
	acc := e.exec(id, operatorapi.ExecRequest{Command: "true"})
	if p := e.poll(id, &cur, 0, ""); len(p.Commands) != 1 {
		t.Fatalf("poll answered %v, want the exec", commandsOf(p))
	}
	cs.take()
	path := "/v1/daemon/exec/" + acc.ExecID + "/result"
	if r := e.daemon(path, &messages.ExecResult{ExitCode: 3}); r.status != http.StatusOK {
		t.Fatalf("result: %d %s", r.status, r.body)
	}
	if calls := cs.take(); strings.Contains(calls, "Exec×") {
		t.Fatalf("the result of an exec delivered here called %q: want no exec read", calls)
	}
	if got := e.getExec(acc.ExecID, ""); got.State != operatorapi.ExecFinished || got.Result == nil || got.Result.ExitCode != 3 {
		t.Fatalf("exec after its result: %+v", got)
	}
	if r := e.daemon(path, &messages.ExecResult{ExitCode: 4}); r.status != http.StatusConflict {
		t.Fatalf("second result: %d %s, want 409", r.status, r.body)
	}
}

// TestAckOfASetupSettlesTheWorker: a worker whose memo holds (it polled,
// quietly, before) goes setting_up when a setup is queued, and the poll
// that acknowledges the setup makes it active again, as RecordPoll does:
// the light acknowledgement is not for a worker a setup is settling.
func TestAckOfASetupSettlesTheWorker(t *testing.T) {
	e := newEnv(t)
	id, cur := e.hello("m", "settles")
	p := e.poll(id, &cur, 0, "")
	p = e.poll(id, p.Cursor, 0, "") // quiet: from the memo
	if r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/setup", operatorapi.SetupRequest{Script: "true"}); r.status != http.StatusAccepted {
		t.Fatalf("setup: %d %s", r.status, r.body)
	}
	p = e.poll(id, p.Cursor, 0, "")
	if got := commandsOf(p); len(got) != 1 || got[0] != "setup" {
		t.Fatalf("poll after the setup answered %v", got)
	}
	if w := e.worker(id); w.State != operatorapi.StateSettingUp {
		t.Fatalf("worker is %s with its setup delivered, want setting_up", w.State)
	}
	e.poll(id, p.Cursor, 0, "") // acknowledges it
	if w := e.worker(id); w.State != operatorapi.StateActive || w.SetupPending != 0 {
		t.Fatalf("worker is %s (%d setups pending) once its setup is acknowledged, want active", w.State, w.SetupPending)
	}
}

// TestAFirstPollAfterHelloIsAnsweredFromMemory: the hello that made a
// worker leaves its memo, and whether it has a key, so that worker's
// first poll neither records it nor reads its key; it only looks for an
// invocation to claim (one may wait for any worker). A command queued
// between the hello and that poll is handed over by it all the same. A
// worker that said hello before gets no memo from its hello: its first
// poll records it, as ever.
func TestAFirstPollAfterHelloIsAnsweredFromMemory(t *testing.T) {
	cs := openCounting(t)
	e := newEnv(t, func(c *Config) { c.Store = cs })
	tok := e.mintToken(operatorapi.TokenRequest{Fleet: true}).Token
	poll := func(id, cur string) (messages.PollResponse, string) {
		t.Helper()
		cs.take()
		r := e.daemonAs(tok, "/v1/daemon/poll", &messages.PollRequest{WorkerID: id, Cursor: &cur})
		if r.status != http.StatusOK {
			t.Fatalf("poll: %d %q", r.status, r.body)
		}
		return decodeMP[messages.PollResponse](t, r), cs.take()
	}

	// A first worker's poll caches what a namespace's polls share (its
	// target version).
	hr := e.helloWith(tok, "m0", "fresh", "inc-1")
	poll(*hr.WorkerID, *hr.Cursor)

	hr = e.helloWith(tok, "m1", "fresh", "inc-1")
	id, cur := *hr.WorkerID, *hr.Cursor
	if p, calls := poll(id, cur); len(p.Commands) != 0 || calls != "ClaimInvocations×I" {
		t.Fatalf("first poll of a new worker answered %v and called %q: want nothing and the claim alone", commandsOf(p), calls)
	}
	if _, calls := poll(id, cur); calls != "" {
		t.Fatalf("second poll of a new worker called %q", calls)
	}
	if w := e.worker(id); w.State != operatorapi.StateActive {
		t.Fatalf("new worker reads %s, want active", w.State)
	}

	hr = e.helloWith(tok, "m2", "fresh", "inc-1")
	id2, cur2 := *hr.WorkerID, *hr.Cursor
	e.exec(id2, operatorapi.ExecRequest{Command: "true"})
	if p, calls := poll(id2, cur2); len(p.Commands) != 1 || p.Commands[0].Kind != messages.KindExec || !strings.Contains(calls, "Take") {
		t.Fatalf("first poll after an exec was queued for a new worker answered %v, calling %q: want the exec, taken", commandsOf(p), calls)
	}

	hr = e.helloWith(tok, "m1", "fresh", "inc-2")
	if *hr.WorkerID != id {
		t.Fatalf("second hello of m1 made worker %s, want %s", *hr.WorkerID, id)
	}
	if _, calls := poll(id, *hr.Cursor); !strings.Contains(calls, "RecordPoll") {
		t.Fatalf("first poll after a second hello called %q: want it recorded", calls)
	}
}

// TestWelcomeLeavesNoMemoOnceTheWorkerWasTouched: whatever reaches a
// worker between the hello's expect and its welcome (a command queued, an
// invocation made claimable, a change, a removal) leaves no memo: its
// first poll goes the full way.
func TestWelcomeLeavesNoMemoOnceTheWorkerWasTouched(t *testing.T) {
	var live atomic.Bool
	live.Store(true)
	now := time.Unix(1_700_000_000, 0)
	w := store.Worker{ID: "w", Namespace: "default", State: operatorapi.StateActive}
	cur := int64(0)
	p := newPresence(&live)
	p.welcome(w, p.expect("w", now), now)
	if _, _, kind := p.look("w", "", &cur, false, false, now); kind != pollQuiet {
		t.Fatalf("a welcomed worker's first poll is %v, want quiet", kind)
	}
	if claim, take := p.due("w", 0); !claim || take {
		t.Fatalf("a welcomed worker is due claim %v take %v, want the claim alone", claim, take)
	}
	for name, touch := range map[string]func(*presence){
		"queued":     func(p *presence) { p.queued("w") },
		"claimable":  func(p *presence) { p.claimable("w") },
		"invalidate": func(p *presence) { p.invalidate("w") },
		"drop":       func(p *presence) { p.drop("w") },
	} {
		p := newPresence(&live)
		gen := p.expect("w", now)
		touch(p)
		p.welcome(w, gen, now)
		if _, _, kind := p.look("w", "", &cur, false, false, now); kind != pollFull {
			t.Errorf("%s between expect and welcome: first poll is %v, want full", name, kind)
		}
	}
}

// TestACacheDropSparesTheOtherRows: a row read while another row was
// dropped is cached; one read while it was itself dropped, or everything
// was, is not.
func TestACacheDropSparesTheOtherRows(t *testing.T) {
	c := newCaches(true)
	tok := store.Token{ID: "t1", Hash: "h1", Kind: store.TokenDaemon, WorkerID: "w"}

	e := c.mark()
	c.dropWorkerKeys("other")
	c.dropToken("t2")
	c.dropTargetVersion("elsewhere")
	c.putWorkerHasKey("w", true, e)
	c.putToken(tok, e)
	v := "1.2.3"
	c.putTargetVersion("default", &v, e)
	if has, known := c.workerHasKey("w"); !known || !has {
		t.Fatalf("has-key read across another worker's drop: known %v has %v, want cached", known, has)
	}
	if _, ok := c.token("h1"); !ok {
		t.Fatal("token read across another token's drop was not cached")
	}
	if got, ok := c.targetVersion("default"); !ok || got == nil || *got != v {
		t.Fatalf("target version read across another namespace's drop: %v %v", got, ok)
	}

	e = c.mark()
	c.dropWorkerKeys("w")
	c.dropToken("t1")
	c.dropTargetVersion("default")
	c.putWorkerHasKey("w", false, e)
	c.putToken(tok, e)
	c.putTargetVersion("default", nil, e)
	if _, known := c.workerHasKey("w"); known {
		t.Fatal("has-key read across its own drop was cached")
	}
	if _, ok := c.token("h1"); ok {
		t.Fatal("token read across its own drop was cached")
	}
	if _, ok := c.targetVersion("default"); ok {
		t.Fatal("target version read across its own drop was cached")
	}

	e = c.mark()
	c.clear()
	c.putWorkerHasKey("w", true, e)
	if _, known := c.workerHasKey("w"); known {
		t.Fatal("has-key read across a clear was cached")
	}

	// The record of drops is bounded: once full it starts again, and
	// every read begun before that is refused.
	e = c.mark()
	for i := 0; i <= maxCached; i++ {
		c.dropWorkerKeys(strconv.Itoa(i))
	}
	c.putWorkerHasKey("w", true, e)
	if _, known := c.workerHasKey("w"); known {
		t.Fatal("has-key read across the drops record's reset was cached")
	}
	if n := len(c.dropped); n > maxCached {
		t.Fatalf("drops record holds %d, more than %d", n, maxCached)
	}
}
