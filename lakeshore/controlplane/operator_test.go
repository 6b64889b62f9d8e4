package controlplane

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

func TestOperatorAuth(t *testing.T) {
	e := newEnv(t)
	routes := []string{
		operatorapi.RouteListWorkers, operatorapi.RouteGetWorker, operatorapi.RouteKillWorker, operatorapi.RouteCleanup,
		operatorapi.RouteWorkerExec, operatorapi.RouteQueueExec, operatorapi.RouteGetExec, operatorapi.RouteSetup,
		operatorapi.RouteHibernate, operatorapi.RouteReset, operatorapi.RouteCancel, operatorapi.RouteCreateToken, operatorapi.RouteListTokens, operatorapi.RouteRevokeToken, operatorapi.RouteDeleteRelease,
		operatorapi.RouteListCommands, operatorapi.RouteListExecs,
	}
	for _, route := range routes {
		method, path := routeURL(route, "w1", "e1")
		for _, tok := range []string{"", "wrong", testDaemon} {
			r := e.do(method, path, "application/json", tok, []byte(`{}`))
			if r.status != http.StatusUnauthorized {
				t.Fatalf("%s with token %q: %d", route, tok, r.status)
			}
			if f := errField(t, r); f != "authorization" {
				t.Fatalf("%s: field %q", route, f)
			}
		}
	}
	// Basic, not Bearer, and two Authorization headers are refused too.
	req, _ := http.NewRequest(http.MethodGet, e.url+"/v1/namespaces/default/workers", nil)
	req.Header.Add("Authorization", "Basic "+testAdmin)
	if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("basic auth: %v %v", r.StatusCode, err)
	}
	req.Header.Set("Authorization", "Bearer "+testAdmin)
	req.Header.Add("Authorization", "Bearer "+testAdmin)
	if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("two headers: %v %v", r.StatusCode, err)
	}
}

// routeURL fills an operatorapi route's placeholders.
func routeURL(route, worker, exec string) (method, path string) {
	method, path, _ = strings.Cut(route, " ")
	path = strings.NewReplacer("{ns}", "default", "{id}", worker, "{exec_id}", exec, "{inv_id}", "inv", "{token_id}", "tok", "{version}", "0.1.0", "{triple}", "x86_64-unknown-linux-gnu").Replace(path)
	return method, path
}

func TestStaleIsDerivedAtReadTime(t *testing.T) {
	e := newEnv(t)
	id, _ := e.hello("m", "l")
	if w := e.worker(id); w.State != operatorapi.StateActive {
		t.Fatalf("fresh worker %s", w.State)
	}
	e.clock.Advance(operatorapi.StaleAfter + time.Second)
	w := e.worker(id)
	if w.State != operatorapi.StateStale || w.StoredState != operatorapi.StateActive {
		t.Fatalf("after a minute of silence: state %s stored %s", w.State, w.StoredState)
	}
	list := decodeJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil))
	if len(list.Workers) != 1 || list.Workers[0].State != operatorapi.StateStale {
		t.Fatalf("list %+v", list)
	}
	e.poll(id, nil, 0, "")
	if w := e.worker(id); w.State != operatorapi.StateActive {
		t.Fatalf("after a poll: %s", w.State)
	}
}

func TestWorkerLookupByLabelAndNamespace(t *testing.T) {
	e := newEnv(t)
	id, _ := e.hello("m", "gpu-rig")
	if w := e.worker("gpu-rig"); w.ID != id {
		t.Fatalf("by label: %s", w.ID)
	}
	if r := e.op(http.MethodGet, "/v1/namespaces/default/workers/nope", nil); r.status != http.StatusNotFound || errField(t, r) != "id" {
		t.Fatalf("unknown: %d %q", r.status, r.body)
	}
	if r := e.op(http.MethodGet, "/v1/namespaces/other/workers/"+id, nil); r.status != http.StatusNotFound {
		t.Fatalf("other namespace: %d", r.status)
	}
	if r := e.op(http.MethodGet, "/v1/namespaces/b%20d/workers", nil); r.status != http.StatusBadRequest || errField(t, r) != "ns" {
		t.Fatalf("bad namespace: %d %q", r.status, r.body)
	}
	e.hello("m2", "gpu-rig")
	if r := e.op(http.MethodGet, "/v1/namespaces/default/workers/gpu-rig", nil); r.status != http.StatusConflict {
		t.Fatalf("ambiguous label: %d", r.status)
	}
}

func TestCleanupRules(t *testing.T) {
	e := newEnv(t)
	old, _ := e.hello("m1", "old")
	e.clock.Advance(3 * time.Hour)
	fresh, _ := e.hello("m2", "fresh")
	for _, body := range []string{`{"olderThanHours":0}`, `{"olderThanHours":-1}`, `{"olderThanHours":169}`, `{}`, `{"olderThanHours":"2"}`} {
		r := e.do(http.MethodPost, "/v1/namespaces/default/workers/cleanup", "application/json", testAdmin, []byte(body))
		if r.status != http.StatusBadRequest || errField(t, r) != "olderThanHours" {
			t.Fatalf("%s: %d %q", body, r.status, r.body)
		}
	}
	if r := e.do(http.MethodPost, "/v1/namespaces/default/workers/cleanup", "application/json", testAdmin, []byte(`{"olderThanHours":`)); r.status != http.StatusBadRequest {
		t.Fatalf("truncated JSON: %d", r.status)
	}
	dry := decodeJS[operatorapi.CleanupResponse](t, e.op(http.MethodPost, "/v1/namespaces/default/workers/cleanup", operatorapi.CleanupRequest{OlderThanHours: 2, DryRun: true}))
	if dry.Count != 1 || !dry.DryRun || dry.Deleted[0].ID != old {
		t.Fatalf("dry run %+v", dry)
	}
	if n := len(decodeJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil)).Workers); n != 2 {
		t.Fatalf("a dry run deleted: %d left", n)
	}
	res := decodeJS[operatorapi.CleanupResponse](t, e.op(http.MethodPost, "/v1/namespaces/default/workers/cleanup", operatorapi.CleanupRequest{OlderThanHours: 2}))
	if res.Count != 1 || res.DryRun || res.Deleted[0].ID != old || res.Deleted[0].Label != "old" {
		t.Fatalf("cleanup %+v", res)
	}
	list := decodeJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil))
	if len(list.Workers) != 1 || list.Workers[0].ID != fresh {
		t.Fatalf("left %+v", list.Workers)
	}
	if res := decodeJS[operatorapi.CleanupResponse](t, e.op(http.MethodPost, "/v1/namespaces/default/workers/cleanup", operatorapi.CleanupRequest{OlderThanHours: 168})); res.Count != 0 || res.Deleted == nil {
		t.Fatalf("nothing to clean: %+v", res)
	}
}

func TestKill(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.hello("m", "l")
	e.exec(id, operatorapi.ExecRequest{Command: "true"})
	r := e.op(http.MethodDelete, "/v1/namespaces/default/workers/"+id+"?terminate=false", nil)
	if r.status != http.StatusOK {
		t.Fatalf("kill: %d %q", r.status, r.body)
	}
	if k := decodeJS[operatorapi.KillResponse](t, r); k.Deleted != id || k.Terminated {
		t.Fatalf("kill response %+v", k)
	}
	if r := e.op(http.MethodGet, "/v1/namespaces/default/workers/"+id, nil); r.status != http.StatusNotFound {
		t.Fatalf("after kill: %d", r.status)
	}
	if r := e.op(http.MethodDelete, "/v1/namespaces/default/workers/"+id, nil); r.status != http.StatusNotFound {
		t.Fatalf("kill twice: %d", r.status)
	}
	// The daemon, still running, is told its row is gone.
	r = e.daemon("/v1/daemon/poll", &messages.PollRequest{WorkerID: id, Cursor: &cursor})
	if r.status != http.StatusNotFound {
		t.Fatalf("poll after kill: %d", r.status)
	}
	// Saying hello again makes a new row.
	again, _ := e.hello("m", "l")
	if again == id {
		t.Fatal("hello after kill reused the killed row")
	}
}

func TestKillWakesAParkedPoll(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.hello("m", "l")
	got := make(chan int, 1)
	go func() {
		r := e.daemon("/v1/daemon/poll", &messages.PollRequest{WorkerID: id, TimeoutS: 20, Cursor: &cursor})
		got <- r.status
	}()
	e.waitParked(workerKey(id))
	e.op(http.MethodDelete, "/v1/namespaces/default/workers/"+id, nil)
	select {
	case st := <-got:
		if st != http.StatusNotFound {
			t.Fatalf("parked poll after kill: %d", st)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the parked poll of a killed worker did not return")
	}
}

func TestHibernateDeadline(t *testing.T) {
	e := newEnv(t)
	id, _ := e.hello("m", "l")
	now := e.clock.Now().Unix()
	for _, until := range []int64{now - 1, now, 0, -5} {
		r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/hibernate", operatorapi.HibernateRequest{UntilEpochS: until})
		if r.status != http.StatusBadRequest || errField(t, r) != "untilEpochS" {
			t.Fatalf("until %d: %d %q", until, r.status, r.body)
		}
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/hibernate", map[string]any{"untilEpochS": "soon"}); r.status != http.StatusBadRequest || errField(t, r) != "untilEpochS" {
		t.Fatalf("string deadline: %d %q", r.status, r.body)
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/hibernate", operatorapi.HibernateRequest{UntilEpochS: now + 30}); r.status != http.StatusAccepted {
		t.Fatalf("future deadline: %d %q", r.status, r.body)
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/workers/nope/hibernate", operatorapi.HibernateRequest{UntilEpochS: now + 30}); r.status != http.StatusNotFound {
		t.Fatalf("unknown worker: %d", r.status)
	}
}

func TestCancelAndCommandList(t *testing.T) {
	e := newEnv(t)
	id, _ := e.hello("m", "l")
	other, _ := e.hello("m2", "l2")
	a := e.exec(id, operatorapi.ExecRequest{Command: "sleep 100"})
	base := "/v1/namespaces/default/workers/" + id
	if r := e.op(http.MethodPost, base+"/cancel", operatorapi.CancelRequest{}); r.status != http.StatusBadRequest || errField(t, r) != "execId" {
		t.Fatalf("empty cancel: %d %q", r.status, r.body)
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+other+"/cancel", operatorapi.CancelRequest{ExecID: a.ExecID}); r.status != http.StatusNotFound {
		t.Fatalf("cancel of another worker's exec: %d", r.status)
	}
	if r := e.op(http.MethodPost, base+"/cancel", operatorapi.CancelRequest{ExecID: a.ExecID}); r.status != http.StatusAccepted {
		t.Fatalf("cancel exec: %d %q", r.status, r.body)
	}
	if r := e.op(http.MethodPost, base+"/cancel", operatorapi.CancelRequest{InvocationID: "inv-1"}); r.status != http.StatusAccepted {
		t.Fatalf("cancel invocation: %d %q", r.status, r.body)
	}
	p := e.poll(id, nil, 0, "")
	if got := commandsOf(p); len(got) != 3 || got[1] != "cancel" || got[2] != "cancel" {
		t.Fatalf("commands %v", got)
	}
	c := messages.DecodeCommand(p.Commands[1]).(*messages.Cancel)
	if c.ExecID == nil || *c.ExecID != a.ExecID || c.InvocationID != nil {
		t.Fatalf("cancel body %+v", c)
	}
	cmds := decodeJS[[]operatorapi.CommandInfo](t, e.op(http.MethodGet, base+"/commands", nil))
	if len(cmds) != 3 || cmds[0].Kind != "exec" || cmds[0].State != "acked" || cmds[0].CreatedAt.IsZero() {
		t.Fatalf("command list %+v", cmds)
	}
}

func TestExecValidation(t *testing.T) {
	e := newEnv(t)
	id, _ := e.hello("m", "l")
	path := "/v1/namespaces/default/workers/" + id + "/exec"
	for _, tc := range []struct {
		body  string
		field string
	}{
		{`{}`, "command"},
		{`{"command":"  "}`, "command"},
		{`{"command":"x","timeoutS":-1}`, "timeoutS"},
		{`{"command":"x","env":{"A=B":"c"}}`, "env"},
		{`{"command":"x","env":{"":"c"}}`, "env"},
		{`{"command":"x","stdin":"not base64!"}`, "body"},
		{`{"command":5}`, "command"},
		{`[1,2]`, "body"},
		{`{"command":"x"} {"command":"y"}`, "body"},
	} {
		r := e.do(http.MethodPost, path, "application/json", testAdmin, []byte(tc.body))
		if r.status != http.StatusBadRequest || errField(t, r) != tc.field {
			t.Fatalf("%s: %d %q", tc.body, r.status, r.body)
		}
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/workers/nope/exec", operatorapi.ExecRequest{Command: "x"}); r.status != http.StatusNotFound {
		t.Fatalf("unknown worker: %d", r.status)
	}
}

func TestQueueRouting(t *testing.T) {
	e := newEnv(t)
	gpu, _ := e.hello("m1", "gpu", "gpu-a100")
	trainer, _ := e.hello("m2", "trainer")
	e.poll(trainer, nil, 0, "train*") // its poll queue is a prefix
	plain, _ := e.hello("m3", "plain")
	staleGPU, _ := e.hello("m4", "stale-gpu", "gpu-h100")

	route := func(queue string) (int, string) {
		r := e.op(http.MethodPost, "/v1/namespaces/default/exec", operatorapi.ExecRequest{Command: "true", Queue: queue})
		if r.status != http.StatusAccepted {
			return r.status, errField(t, r)
		}
		return r.status, decodeJS[operatorapi.ExecAccepted](t, r).WorkerID
	}
	// Make stale-gpu stale: everyone else polls after the clock moves.
	e.clock.Advance(operatorapi.StaleAfter + time.Second)
	for _, w := range []string{gpu, trainer, plain} {
		q := ""
		if w == trainer {
			q = "train*"
		}
		e.poll(w, nil, 0, q)
	}
	for _, tc := range []struct{ queue, want string }{
		{"gpu-a100", gpu},
		{"training", trainer},
		{"train-big", trainer},
		{"default", plain},
		{"gpu-*", gpu}, // stale-gpu matches too, but is stale
	} {
		st, got := route(tc.queue)
		if st != http.StatusAccepted || got != tc.want {
			t.Fatalf("queue %q went to %s (%d), want %s", tc.queue, got, st, tc.want)
		}
	}
	if st, field := route("gpu-h100"); st != http.StatusConflict || field != "queue" {
		t.Fatalf("only a stale member: %d %s", st, field)
	}
	if st, field := route("nothing"); st != http.StatusConflict || field != "queue" {
		t.Fatalf("no member: %d %s", st, field)
	}
	if st, field := route(""); st != http.StatusBadRequest || field != "queue" {
		t.Fatalf("no queue: %d %s", st, field)
	}
	r := e.op(http.MethodPost, "/v1/namespaces/default/exec", operatorapi.ExecRequest{Command: "true", Queue: "nothing"})
	if msg := decodeJS[operatorapi.Error](t, r).Error; !strings.Contains(msg, `"nothing"`) {
		t.Fatalf("409 message %q does not name the queue", msg)
	}
	_ = staleGPU

	// Least busy: two members of "pool" share the work.
	a, _ := e.hello("p1", "pool-a", "pool")
	b, _ := e.hello("p2", "pool-b", "pool")
	seen := map[string]int{}
	for i := 0; i < 4; i++ {
		_, w := route("pool")
		seen[w]++
	}
	if seen[a] != 2 || seen[b] != 2 {
		t.Fatalf("least-busy routing %v", seen)
	}
	// A setting_up or hibernating member is not eligible.
	e.op(http.MethodPost, "/v1/namespaces/default/workers/"+a+"/setup", operatorapi.SetupRequest{Script: "true"})
	e.op(http.MethodPost, "/v1/namespaces/default/workers/"+b+"/hibernate", operatorapi.HibernateRequest{UntilEpochS: e.clock.Now().Unix() + 600})
	if st, _ := route("pool"); st != http.StatusConflict {
		t.Fatalf("setting_up and hibernating members: %d", st)
	}
}

// An exec submitted with wait answers in one request: the accepted exec at
// once (flushed before the wait), then the exec as a long-polling read
// would see it.
func TestExecSubmitWithWait(t *testing.T) {
	e := newEnv(t)
	id, _ := e.hello("m", "rig")

	body := `{"command":"echo hi"}`
	req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/namespaces/default/workers/rig/exec?wait=15", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testAdmin)
	req.Header.Set("Content-Type", "application/json")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if r.StatusCode != http.StatusAccepted || r.Header.Get("Content-Type") != operatorapi.ContentTypeNDJSON {
		t.Fatalf("status %d, content type %q", r.StatusCode, r.Header.Get("Content-Type"))
	}
	dec := json.NewDecoder(r.Body)
	var acc operatorapi.ExecAccepted
	// The first document arrives while the exec has not even been polled.
	if err := dec.Decode(&acc); err != nil || acc.ExecID == "" || acc.WorkerID != id || acc.Label != "rig" {
		t.Fatalf("first document %+v: %v", acc, err)
	}
	e.waitParked(execKey(acc.ExecID))
	p := e.poll(id, nil, 0, "")
	if len(p.Commands) != 1 {
		t.Fatalf("poll: %v", commandsOf(p))
	}
	res := &messages.ExecResult{ExitCode: 0, Stdout: "hi\n", DurationMs: 3}
	if rr := e.do(http.MethodPost, "/v1/daemon/exec/"+acc.ExecID+"/result", messages.ContentType, testDaemon, mustMarshal(t, res)); rr.status != http.StatusOK {
		t.Fatalf("result: %d", rr.status)
	}
	var ex operatorapi.Exec
	if err := dec.Decode(&ex); err != nil {
		t.Fatal(err)
	}
	if ex.ExecID != acc.ExecID || ex.State != operatorapi.ExecFinished || ex.Result == nil || ex.Result.Stdout != "hi\n" {
		t.Fatalf("second document %+v", ex)
	}
	if err := dec.Decode(&ex); err != io.EOF {
		t.Fatalf("a third document: %v", err)
	}

	// A bad wait is refused before anything is queued.
	rr := e.op(http.MethodPost, "/v1/namespaces/default/workers/rig/exec?wait=soon", operatorapi.ExecRequest{Command: "true"})
	if rr.status != http.StatusBadRequest || errField(t, rr) != "wait" {
		t.Fatalf("bad wait: %d %q", rr.status, rr.body)
	}
	if p := e.poll(id, p.Cursor, 0, ""); len(p.Commands) != 0 {
		t.Fatalf("a refused exec was queued: %v", commandsOf(p))
	}
	// Without wait, one plain JSON document, as before.
	rr = e.op(http.MethodPost, "/v1/namespaces/default/exec", operatorapi.ExecRequest{Command: "true", Queue: "default"})
	if rr.status != http.StatusAccepted || !strings.HasPrefix(rr.header.Get("Content-Type"), "application/json") {
		t.Fatalf("queue exec without wait: %d %q", rr.status, rr.header.Get("Content-Type"))
	}
}

// A minted daemon token works until it is revoked; from then on every
// request made with it is refused, and the listing says so.
func TestTokenListAndRevoke(t *testing.T) {
	e := newEnv(t)
	r := e.op(http.MethodPost, "/v1/tokens", operatorapi.TokenRequest{Kind: operatorapi.TokenDaemon, Label: "rig-7"})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %q", r.status, r.body)
	}
	minted := decodeJS[operatorapi.TokenResponse](t, r)
	if minted.ID == "" || !strings.HasPrefix(minted.Token, "dlt_") {
		t.Fatalf("minted %+v", minted)
	}
	if r := e.daemonAs(minted.Token, "/v1/daemon/hello", helloReq("m", "rig-7")); r.status != http.StatusOK {
		t.Fatalf("hello with the new token: %d %q", r.status, r.body)
	}
	list := decodeJS[operatorapi.TokenList](t, e.op(http.MethodGet, "/v1/tokens", nil))
	if len(list.Tokens) != 1 || list.Tokens[0].ID != minted.ID || list.Tokens[0].State != operatorapi.TokenActive || list.Tokens[0].Label != "rig-7" {
		t.Fatalf("list %+v", list)
	}
	if strings.Contains(string(e.op(http.MethodGet, "/v1/tokens", nil).body), minted.Token) {
		t.Fatal("the listing shows a secret")
	}

	r = e.op(http.MethodDelete, "/v1/tokens/"+minted.ID, nil)
	info := decodeJS[operatorapi.TokenInfo](t, r)
	if r.status != http.StatusOK || info.State != operatorapi.TokenRevoked || info.RevokedAt == nil {
		t.Fatalf("revoke: %d %+v", r.status, info)
	}
	for _, path := range []string{"/v1/daemon/hello", "/v1/daemon/poll"} {
		var body any = helloReq("m", "rig-7")
		if path == "/v1/daemon/poll" {
			body = &messages.PollRequest{WorkerID: "w", TimeoutS: 0}
		}
		if r := e.daemonAs(minted.Token, path, body); r.status != http.StatusUnauthorized {
			t.Fatalf("%s with a revoked token: %d %q", path, r.status, r.body)
		}
	}
	list = decodeJS[operatorapi.TokenList](t, e.op(http.MethodGet, "/v1/tokens", nil))
	if len(list.Tokens) != 1 || list.Tokens[0].State != operatorapi.TokenRevoked {
		t.Fatalf("list after revoke %+v", list)
	}
	// Again: the same answer, the first revocation time kept.
	again := decodeJS[operatorapi.TokenInfo](t, e.op(http.MethodDelete, "/v1/tokens/"+minted.ID, nil))
	if again.RevokedAt == nil || !again.RevokedAt.Equal(*info.RevokedAt) {
		t.Fatalf("revoke again %+v", again)
	}
	if r := e.op(http.MethodDelete, "/v1/tokens/nope", nil); r.status != http.StatusNotFound || errField(t, r) != "token_id" {
		t.Fatalf("unknown token: %d %q", r.status, r.body)
	}
	if r := e.op(http.MethodDelete, "/v1/tokens/..%2f", nil); r.status != http.StatusNotFound {
		t.Fatalf("bad token id: %d %q", r.status, r.body)
	}
}
