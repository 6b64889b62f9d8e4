package controlplane

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

func TestHelloRegistersAndIsIdempotent(t *testing.T) {
	e := newEnv(t)
	r := e.daemon("/v1/daemon/hello", helloReq("host-a", "gpu-a"))
	if r.status != http.StatusOK {
		t.Fatalf("hello: %d %q", r.status, r.body)
	}
	hr := decodeMP[messages.HelloResponse](t, r)
	if hr.WorkerID == nil || !regexp.MustCompile(`^[0-9a-f]{24}$`).MatchString(*hr.WorkerID) {
		t.Fatalf("worker_id %v is not 24 hex", hr.WorkerID)
	}
	if hr.SessionToken == nil {
		t.Fatal("no session token")
	}
	if _, err := ulid.ParseStrict(*hr.SessionToken); err != nil {
		t.Fatalf("session token %q is not a ULID: %v", *hr.SessionToken, err)
	}
	if hr.SessionTTLS != 86400 || hr.Config == nil || len(hr.Config) != 0 || hr.Reject != nil {
		t.Fatalf("hello response %+v", hr)
	}
	if hr.ServerTimeEpochS == nil || int64(*hr.ServerTimeEpochS) != e.clock.Now().Unix() {
		t.Fatalf("server time %v", hr.ServerTimeEpochS)
	}
	if hr.Cursor == nil || *hr.Cursor != "0" {
		t.Fatalf("cursor %v", hr.Cursor)
	}
	// The raw map must carry config as an empty map, not nil.
	var raw map[string]any
	if err := messages.Unmarshal(r.body, &raw); err != nil {
		t.Fatal(err)
	}
	if m, ok := raw["config"].(map[string]any); !ok || len(m) != 0 {
		t.Fatalf("config on the wire: %#v", raw["config"])
	}

	again, _ := e.hello("host-a", "gpu-a")
	if again != *hr.WorkerID {
		t.Fatalf("second hello gave %s, want %s", again, *hr.WorkerID)
	}
	other, _ := e.hello("host-a", "gpu-b")
	if other == again {
		t.Fatal("a different label must be a different worker")
	}
	w := e.worker(again)
	if w.Label != "gpu-a" || w.MachineID != "host-a" || w.State != operatorapi.StateActive ||
		len(w.Runners) != 1 || w.Runners[0] != "process" || !strings.Contains(string(w.Versions), `"arch":"x86_64"`) {
		t.Fatalf("worker row %+v versions %s", w, w.Versions)
	}
}

func TestHelloValidation(t *testing.T) {
	e := newEnv(t)
	good := func() map[string]any {
		return map[string]any{
			"machine_id": "m", "label": "l", "tags": []string{},
			"capabilities": map[string]any{"runners": []string{"process"}, "max_invocations": 0, "workdir": "/w"},
			"versions":     map[string]any{"daemon": "1", "protocol": "1"},
		}
	}
	for _, tc := range []struct {
		name  string
		edit  func(m map[string]any)
		field string
	}{
		{"no machine_id", func(m map[string]any) { delete(m, "machine_id") }, "machine_id"},
		{"nil machine_id", func(m map[string]any) { m["machine_id"] = nil }, "machine_id"},
		{"no label", func(m map[string]any) { delete(m, "label") }, "label"},
		{"no tags", func(m map[string]any) { delete(m, "tags") }, "tags"},
		{"tags not strings", func(m map[string]any) { m["tags"] = []any{1, 2} }, "tags"},
		{"no capabilities", func(m map[string]any) { delete(m, "capabilities") }, "capabilities"},
		{"no runners", func(m map[string]any) { delete(m["capabilities"].(map[string]any), "runners") }, "capabilities.runners"},
		{"negative max_invocations", func(m map[string]any) { m["capabilities"].(map[string]any)["max_invocations"] = -1 }, "capabilities.max_invocations"},
		{"capabilities not a map", func(m map[string]any) { m["capabilities"] = "x" }, "capabilities"},
		{"no versions", func(m map[string]any) { delete(m, "versions") }, "versions"},
		{"no versions.daemon", func(m map[string]any) { delete(m["versions"].(map[string]any), "daemon") }, "versions.daemon"},
		{"no versions.protocol", func(m map[string]any) { delete(m["versions"].(map[string]any), "protocol") }, "versions.protocol"},
		{"protocol a number", func(m map[string]any) { m["versions"].(map[string]any)["protocol"] = 1 }, "versions.protocol"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := good()
			tc.edit(m)
			r := e.daemon("/v1/daemon/hello", m)
			if r.status != http.StatusUnprocessableEntity {
				t.Fatalf("status %d %q", r.status, r.body)
			}
			if f := errField(t, r); f != tc.field {
				t.Fatalf("field %q, want %q", f, tc.field)
			}
		})
	}
	for _, body := range [][]byte{nil, {0xc1}, {0x93, 1, 2, 3}, []byte(`{"machine_id":"m"}`), {0x81, 0x01, 0x02}} {
		r := e.do(http.MethodPost, "/v1/daemon/hello", messages.ContentType, testDaemon, body)
		if r.status != http.StatusBadRequest || errField(t, r) != "body" {
			t.Fatalf("body %x: %d %q", body, r.status, r.body)
		}
	}

	bad := helloReq("m", "l")
	bad.Versions.Protocol = str("2")
	r := e.daemon("/v1/daemon/hello", bad)
	if r.status != http.StatusOK {
		t.Fatalf("reject must be HTTP 200, got %d", r.status)
	}
	hr := decodeMP[messages.HelloResponse](t, r)
	if hr.Reject == nil || hr.Reject.Code != messages.RejectProtocolMismatch || hr.WorkerID != nil {
		t.Fatalf("protocol mismatch: %+v", hr)
	}
	list := decodeJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil))
	if len(list.Workers) != 0 {
		t.Fatalf("a rejected or malformed hello registered %d workers", len(list.Workers))
	}
}

func TestDaemonAuth(t *testing.T) {
	e := newEnv(t)
	for _, tok := range []string{"", "wrong", testAdmin} {
		if r := e.daemonAs(tok, "/v1/daemon/hello", helloReq("m", "l")); r.status != http.StatusUnauthorized {
			t.Fatalf("token %q: %d", tok, r.status)
		}
	}
	for _, path := range []string{"/v1/daemon/poll", "/v1/daemon/ack", "/v1/daemon/event", "/v1/daemon/result-chunk"} {
		if r := e.daemonAs("nope", path, map[string]any{}); r.status != http.StatusUnauthorized || errField(t, r) != "authorization" {
			t.Fatalf("%s: %d %q", path, r.status, r.body)
		}
	}

	mint := func(req operatorapi.TokenRequest) operatorapi.TokenResponse {
		return expectJS[operatorapi.TokenResponse](t, e.op(http.MethodPost, "/v1/tokens", req), http.StatusCreated, "create token")
	}
	daemonTok := mint(operatorapi.TokenRequest{Kind: operatorapi.TokenDaemon, Label: "rig"})
	if !strings.HasPrefix(daemonTok.Token, "dlt_") || daemonTok.ExpiresAt != nil {
		t.Fatalf("daemon token %+v", daemonTok)
	}
	if r := e.daemonAs(daemonTok.Token, "/v1/daemon/hello", helloReq("m", "l")); r.status != http.StatusOK {
		t.Fatalf("minted token refused: %d %q", r.status, r.body)
	}
	enroll := mint(operatorapi.TokenRequest{Kind: operatorapi.TokenEnroll})
	if !strings.HasPrefix(enroll.Token, "dle_") || enroll.ExpiresAt == nil || !enroll.ExpiresAt.Equal(e.clock.Now().Add(time.Hour)) {
		t.Fatalf("enroll token %+v", enroll)
	}
	if r := e.daemonAs(enroll.Token, "/v1/daemon/poll", map[string]any{"worker_id": "x"}); r.status != http.StatusUnauthorized {
		t.Fatalf("an enrollment token is not a bearer: %d", r.status)
	}
	short := mint(operatorapi.TokenRequest{Kind: operatorapi.TokenDaemon, TTLS: 60})
	if r := e.daemonAs(short.Token, "/v1/daemon/hello", helloReq("m2", "l")); r.status != http.StatusOK || decodeMP[messages.HelloResponse](t, r).Reject != nil {
		t.Fatalf("fresh token: %d %q", r.status, r.body)
	}
	e.clock.Advance(61 * time.Second)
	if r := e.daemonAs(short.Token, "/v1/daemon/hello", helloReq("m2", "l")); r.status != http.StatusUnauthorized {
		t.Fatalf("expired token: %d", r.status)
	}
	for _, bad := range []operatorapi.TokenRequest{{Kind: "root"}, {Kind: "daemon", TTLS: -1}} {
		if r := e.op(http.MethodPost, "/v1/tokens", bad); r.status != http.StatusBadRequest {
			t.Fatalf("token %+v: %d", bad, r.status)
		}
	}
}

func TestPollWakesWhenACommandIsQueued(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.hello("m", "l")
	got := make(chan messages.PollResponse, 1)
	go func() {
		r := doCtx(t, context.Background(), http.MethodPost, e.url+"/v1/daemon/poll", messages.ContentType, testDaemon,
			mustMarshal(t, &messages.PollRequest{WorkerID: id, TimeoutS: 20, Cursor: &cursor}))
		var p messages.PollResponse
		_ = messages.Unmarshal(r.body, &p)
		got <- p
	}()
	e.waitParked(workerKey(id))
	acc := e.exec(id, operatorapi.ExecRequest{Command: "true"})
	select {
	case p := <-got:
		// Had the poll run out its timeout instead of being woken, it would
		// have answered without the command: the timer path does not look again.
		if len(p.Commands) != 1 || p.Commands[0].Kind != messages.KindExec {
			t.Fatalf("woken poll returned %v", commandsOf(p))
		}
		ex, ok := messages.DecodeCommand(p.Commands[0]).(*messages.Exec)
		if !ok || ex.ExecID != acc.ExecID || ex.Command != "true" || ex.Env == nil || ex.Log != nil {
			t.Fatalf("exec body %#v", messages.DecodeCommand(p.Commands[0]))
		}
		if p.Cursor == nil || *p.Cursor != "1" {
			t.Fatalf("cursor %v", p.Cursor)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the long-poll was not woken by the queued command")
	}
	if ex := e.getExec(acc.ExecID, ""); ex.State != operatorapi.ExecRunning {
		t.Fatalf("a delivered exec is %s", ex.State)
	}
}

func TestPollTimeoutIsCappedAndUnknownWorker(t *testing.T) {
	e := newEnv(t)
	e.srv.pollCap = 50 * time.Millisecond
	id, cursor := e.hello("m", "l")
	// A daemon asking for an hour gets the cap.
	p := e.poll(id, &cursor, 3600, "")
	if len(p.Commands) != 0 || p.Cursor == nil || *p.Cursor != "0" {
		t.Fatalf("idle poll %+v", p)
	}
	r := e.daemon("/v1/daemon/poll", &messages.PollRequest{WorkerID: "000000000000000000000000", TimeoutS: 0})
	if r.status != http.StatusNotFound || errField(t, r) != "worker_id" {
		t.Fatalf("unknown worker: %d %q", r.status, r.body)
	}
	for _, m := range []map[string]any{
		{"worker_id": id, "timeout_s": -1},
		{"worker_id": id, "cursor": "abc"},
		{"worker_id": id, "cursor": "-3"},
		{"worker_id": ""},
		{"timeout_s": 1},
		{"worker_id": id, "invocations": []any{map[string]any{"state": 5}}},
	} {
		if r := e.daemon("/v1/daemon/poll", m); r.status != http.StatusUnprocessableEntity {
			t.Fatalf("%v: %d %q", m, r.status, r.body)
		}
	}
	// An integer cursor is accepted as well as the string form.
	if r := e.daemon("/v1/daemon/poll", map[string]any{"worker_id": id, "cursor": 0, "timeout_s": 0}); r.status != http.StatusOK {
		t.Fatalf("integer cursor: %d %q", r.status, r.body)
	}
}

func TestCursorAcknowledgesAndRedelivers(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.hello("m", "l")
	e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/reset", nil)
	acc := e.exec(id, operatorapi.ExecRequest{Command: "echo hi"})

	first := e.poll(id, &cursor, 0, "")
	if got := commandsOf(first); len(got) != 2 || got[0] != "reset_backoff" || got[1] != "exec" || *first.Cursor != "2" {
		t.Fatalf("first poll %v cursor %v", got, *first.Cursor)
	}
	// That answer was lost on the way: the daemon polls again with the
	// cursor it had. Everything comes again, in order.
	again := e.poll(id, &cursor, 0, "")
	if got := commandsOf(again); len(got) != 2 || again.Commands[0].ID != first.Commands[0].ID || *again.Cursor != "2" {
		t.Fatalf("redelivery %v", got)
	}
	cmds := decodeJS[[]operatorapi.CommandInfo](t, e.op(http.MethodGet, "/v1/namespaces/default/workers/"+id+"/commands", nil))
	if len(cmds) != 2 || cmds[0].State != "delivered" || cmds[1].State != "delivered" {
		t.Fatalf("commands before ack %+v", cmds)
	}
	// A daemon restarting says hello again and is told where to resume.
	if _, c := e.hello("m", "l"); c != "0" {
		t.Fatalf("hello cursor before ack %s", c)
	}
	// Acknowledging the batch.
	done := e.poll(id, again.Cursor, 0, "")
	if len(done.Commands) != 0 || *done.Cursor != "2" {
		t.Fatalf("after ack %v %v", commandsOf(done), *done.Cursor)
	}
	cmds = decodeJS[[]operatorapi.CommandInfo](t, e.op(http.MethodGet, "/v1/namespaces/default/workers/"+id+"/commands", nil))
	for _, c := range cmds {
		if c.State != "acked" {
			t.Fatalf("command %s is %s", c.ID, c.State)
		}
	}
	if _, c := e.hello("m", "l"); c != "2" {
		t.Fatalf("hello cursor after ack %s", c)
	}
	// A cursor from the future cannot acknowledge what was never sent.
	e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/reset", nil)
	p := e.poll(id, str("999"), 0, "")
	if got := commandsOf(p); len(got) != 1 || got[0] != "reset_backoff" || *p.Cursor != "3" {
		t.Fatalf("bogus cursor: %v %v", got, *p.Cursor)
	}
	_ = acc
}

func TestAbandonedPollLosesNothing(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.hello("m", "l")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/daemon/poll",
			strings.NewReader(string(mustMarshal(t, &messages.PollRequest{WorkerID: id, TimeoutS: 20, Cursor: &cursor}))))
		req.Header.Set("Authorization", "Bearer "+testDaemon)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	e.waitParked(workerKey(id))
	cancel()
	<-done
	acc := e.exec(id, operatorapi.ExecRequest{Command: "true"})
	p := e.poll(id, &cursor, 0, "")
	if len(p.Commands) != 1 {
		t.Fatalf("after an abandoned poll: %v", commandsOf(p))
	}
	if ex := messages.DecodeCommand(p.Commands[0]).(*messages.Exec); ex.ExecID != acc.ExecID {
		t.Fatalf("exec id %s", ex.ExecID)
	}
}

func TestLegacyNullCursorDeletesOnDelivery(t *testing.T) {
	e := newEnv(t)
	id, _ := e.hello("m", "l")
	e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/reset", nil)
	e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/reset", nil)
	p := e.poll(id, nil, 0, "")
	if len(p.Commands) != 2 {
		t.Fatalf("legacy poll %v", commandsOf(p))
	}
	if p := e.poll(id, nil, 0, ""); len(p.Commands) != 0 {
		t.Fatalf("legacy delivery repeated %v", commandsOf(p))
	}
	// The wire still says cursor: nil, the key kept.
	raw := e.do(http.MethodPost, "/v1/daemon/poll", messages.ContentType, testDaemon,
		mustMarshal(t, &messages.PollRequest{WorkerID: id}))
	var m map[string]any
	if err := messages.Unmarshal(raw.body, &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["commands"].([]any); !ok {
		t.Fatalf("commands must be a list on the wire: %#v", m)
	}
	if _, ok := m["target_nymph_version"]; !ok {
		t.Fatalf("target_nymph_version key missing: %#v", m)
	}
}

func TestHibernateEndsTheBatch(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.hello("m", "l")
	until := e.clock.Now().Add(time.Hour).Unix()
	if r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/hibernate", operatorapi.HibernateRequest{UntilEpochS: until}); r.status != http.StatusAccepted {
		t.Fatalf("hibernate: %d %q", r.status, r.body)
	}
	e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/reset", nil)
	p := e.poll(id, &cursor, 0, "")
	if got := commandsOf(p); len(got) != 1 || got[0] != "hibernate" {
		t.Fatalf("batch %v", got)
	}
	h, ok := messages.DecodeCommand(p.Commands[0]).(*messages.Hibernate)
	if !ok || int64(h.UntilEpochS) != until {
		t.Fatalf("hibernate body %#v", messages.DecodeCommand(p.Commands[0]))
	}
	if w := e.worker(id); w.Hibernating == nil || w.Hibernating.Unix() != until {
		t.Fatalf("hibernatingUntil %v", w.Hibernating)
	}
	p = e.poll(id, p.Cursor, 0, "")
	if got := commandsOf(p); len(got) != 1 || got[0] != "reset_backoff" {
		t.Fatalf("after hibernate %v", got)
	}
}

func TestSetupStateAndCapabilities(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.hello("m", "l")
	r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/setup",
		operatorapi.SetupRequest{Script: "apt-get install -y docker", Sudo: true, RefreshCapabilities: true, Name: "docker"})
	if r.status != http.StatusAccepted {
		t.Fatalf("setup: %d %q", r.status, r.body)
	}
	q := decodeJS[operatorapi.Queued](t, r)
	if q.Kind != "setup" || q.WorkerID != id || q.CommandID == "" {
		t.Fatalf("queued %+v", q)
	}
	if w := e.worker(id); w.State != operatorapi.StateSettingUp || w.SetupPending != 1 {
		t.Fatalf("after setup: %s pending %d", w.State, w.SetupPending)
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/setup", operatorapi.SetupRequest{}); r.status != http.StatusBadRequest || errField(t, r) != "script" {
		t.Fatalf("empty script: %d %q", r.status, r.body)
	}
	p := e.poll(id, &cursor, 0, "")
	s, ok := messages.DecodeCommand(p.Commands[0]).(*messages.Setup)
	if !ok || !s.Sudo || !s.RefreshCapabilities || s.Name == nil || *s.Name != "docker" {
		t.Fatalf("setup body %#v", messages.DecodeCommand(p.Commands[0]))
	}
	if w := e.worker(id); w.State != operatorapi.StateSettingUp {
		t.Fatalf("delivered, unacknowledged setup: %s", w.State)
	}
	r = e.daemon("/v1/daemon/poll", &messages.PollRequest{
		WorkerID: id, Cursor: p.Cursor, Queue: "gpu",
		UpdatedCapabilities: &messages.Capabilities{Runners: []string{"process", "docker"}, MaxInvocations: 8},
		Invocations:         []messages.InvocationStatus{{InvocationID: "inv1", State: "running", StartedAt: messages.Epoch(e.clock.Now().Unix())}},
	})
	if r.status != http.StatusOK {
		t.Fatalf("poll: %d %q", r.status, r.body)
	}
	w := e.worker(id)
	if w.State != operatorapi.StateActive || w.SetupPending != 0 || len(w.Runners) != 2 || w.Capabilities.MaxInvocations != 8 {
		t.Fatalf("after the setup queue drained: %+v", w)
	}
	if w.PollQueue != "gpu" || len(w.Running) != 1 || w.Running[0].InvocationID != "inv1" {
		t.Fatalf("poll bookkeeping: queue %q running %+v", w.PollQueue, w.Running)
	}
}

func TestExecResultMsgpackAndJSON(t *testing.T) {
	e := newEnv(t)
	id, _ := e.hello("m", "l")
	a := e.exec(id, operatorapi.ExecRequest{Command: "echo hi", Env: map[string]string{"A": "1"}, Workdir: "/tmp", TimeoutS: 5, Stdin: []byte("in")})
	p := e.poll(id, nil, 0, "")
	ex := messages.DecodeCommand(p.Commands[0]).(*messages.Exec)
	if ex.Env["A"] != "1" || ex.Workdir == nil || *ex.Workdir != "/tmp" || ex.TimeoutS == nil || *ex.TimeoutS != 5 || ex.Stdin != "in" {
		t.Fatalf("exec body %+v", ex)
	}

	errText := "stdout truncated"
	res := &messages.ExecResult{ExitCode: 3, Stdout: "hi\n", Stderr: "oops", DurationMs: 12, Error: &errText}
	path := "/v1/daemon/exec/" + a.ExecID + "/result"
	if r := e.do(http.MethodPost, path, messages.ContentType, testDaemon, mustMarshal(t, res)); r.status != http.StatusOK {
		t.Fatalf("result: %d %q", r.status, r.body)
	}
	got := e.getExec(a.ExecID, "")
	if got.State != operatorapi.ExecFinished || got.Result == nil || got.Result.ExitCode != 3 || got.Result.Stdout != "hi\n" ||
		got.Result.Error == nil || *got.Result.Error != errText || got.WorkerID != id || got.Command != "echo hi" {
		t.Fatalf("exec %+v result %+v", got, got.Result)
	}
	// A repeat (a daemon retrying a post it could not confirm) is a 409,
	// which the daemon takes as final, and changes nothing.
	other := &messages.ExecResult{ExitCode: 99}
	if r := e.do(http.MethodPost, path, messages.ContentType, testDaemon, mustMarshal(t, other)); r.status != http.StatusConflict || errField(t, r) != "exec_id" {
		t.Fatalf("repeat: %d %q", r.status, r.body)
	}
	if got := e.getExec(a.ExecID, ""); got.Result.ExitCode != 3 {
		t.Fatalf("a repeated result overwrote the first: %d", got.Result.ExitCode)
	}

	b := e.exec(id, operatorapi.ExecRequest{Command: "false"})
	c := e.exec(id, operatorapi.ExecRequest{Command: "x"})
	e.poll(id, nil, 0, "")
	jpath := "/v1/daemon/exec/" + b.ExecID + "/result"
	if r := e.do(http.MethodPost, jpath, "application/json", testDaemon, []byte(`{"exit_code":1,"stdout":"","stderr":"no","duration_ms":4,"error":null}`)); r.status != http.StatusOK {
		t.Fatalf("JSON result: %d %q", r.status, r.body)
	}
	if got := e.getExec(b.ExecID, "?wait=5"); got.Result == nil || got.Result.ExitCode != 1 || got.Result.Stderr != "no" {
		t.Fatalf("JSON result read back %+v", got.Result)
	}

	cpath := "/v1/daemon/exec/" + c.ExecID + "/result"
	for _, tc := range []struct {
		ct    string
		body  string
		field string
	}{
		{"application/json", `{"stdout":"x"}`, "exit_code"},
		{"application/json", `{"exit_code":"x"}`, "exit_code"},
		{"application/json", `{"exit_code":1`, "body"},
		{messages.ContentType, string(mustMarshal(t, map[string]any{"stdout": "x"})), "exit_code"},
		{messages.ContentType, string(mustMarshal(t, map[string]any{"exit_code": int64(1) << 40})), "exit_code"},
		{messages.ContentType, "\xc1", "body"},
	} {
		r := e.do(http.MethodPost, cpath, tc.ct, testDaemon, []byte(tc.body))
		if r.status < 400 || r.status >= 500 || errField(t, r) != tc.field {
			t.Fatalf("%s %q: %d %q", tc.ct, tc.body, r.status, r.body)
		}
	}
	if r := e.do(http.MethodPost, "/v1/daemon/exec/"+strings.Repeat("0", 32)+"/result", messages.ContentType, testDaemon, mustMarshal(t, res)); r.status != http.StatusNotFound {
		t.Fatalf("unknown exec: %d", r.status)
	}
	if r := e.op(http.MethodGet, "/v1/namespaces/default/execs/"+strings.Repeat("0", 32), nil); r.status != http.StatusNotFound {
		t.Fatalf("get unknown exec: %d", r.status)
	}
	if r := e.op(http.MethodGet, "/v1/namespaces/other/execs/"+a.ExecID, nil); r.status != http.StatusNotFound {
		t.Fatalf("exec from another namespace: %d", r.status)
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(a.ExecID) {
		t.Fatalf("exec id %q is not 128 random bits in hex", a.ExecID)
	}
}

func TestStreamedOutputInOrderAndLongPoll(t *testing.T) {
	e := newEnv(t)
	id, _ := e.hello("m", "l")
	a := e.exec(id, operatorapi.ExecRequest{Command: "seq 3", Stream: true})
	p := e.poll(id, nil, 0, "")
	ex := messages.DecodeCommand(p.Commands[0]).(*messages.Exec)
	if ex.Log == nil || ex.Log.FlushMs == 0 || ex.Log.FlushBytes == 0 {
		t.Fatalf("streamed exec without a usable log sink: %+v", ex.Log)
	}
	u, err := url.Parse(ex.Log.StdoutURL)
	if err != nil || ex.Log.StdoutURL != e.url+"/v1/daemon/exec/"+a.ExecID+"/chunk" {
		t.Fatalf("stdout_url %q", ex.Log.StdoutURL)
	}
	post := func(s string) {
		t.Helper()
		r := doCtx(t, context.Background(), http.MethodPost, u.String(), "application/octet-stream", testDaemon, []byte(s))
		if r.status != http.StatusOK {
			t.Fatalf("chunk: %d %q", r.status, r.body)
		}
	}
	for _, s := range []string{"1\n", "2\n", "", "3\n"} {
		post(s)
	}
	got := e.getExec(a.ExecID, "")
	if string(got.Output) != "1\n2\n3\n" || got.NextOffset != 6 || got.Offset != 0 {
		t.Fatalf("output %q next %d", got.Output, got.NextOffset)
	}
	if got := e.getExec(a.ExecID, "?offset=2"); string(got.Output) != "2\n3\n" || got.Offset != 2 || got.NextOffset != 6 {
		t.Fatalf("from offset 2: %q %d", got.Output, got.NextOffset)
	}

	// A reader caught up with the output waits, and is woken by the next chunk.
	out := make(chan operatorapi.Exec, 1)
	go func() {
		r := doCtx(t, context.Background(), http.MethodGet, e.url+"/v1/namespaces/default/execs/"+a.ExecID+"?wait=20&offset=6", "", testAdmin, nil)
		out <- decodeJS[operatorapi.Exec](t, r)
	}()
	e.waitParked(execStateKey(a.ExecID))
	post("4\n")
	select {
	case g := <-out:
		if string(g.Output) != "4\n" || g.NextOffset != 8 {
			t.Fatalf("woken read %q %d", g.Output, g.NextOffset)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the exec long-poll was not woken by a chunk")
	}

	// And by the result.
	go func() {
		r := doCtx(t, context.Background(), http.MethodGet, e.url+"/v1/namespaces/default/execs/"+a.ExecID+"?wait=20&offset=8", "", testAdmin, nil)
		out <- decodeJS[operatorapi.Exec](t, r)
	}()
	e.waitParked(execStateKey(a.ExecID))
	e.do(http.MethodPost, "/v1/daemon/exec/"+a.ExecID+"/result", messages.ContentType, testDaemon, mustMarshal(t, &messages.ExecResult{ExitCode: 0}))
	select {
	case g := <-out:
		if g.State != operatorapi.ExecFinished || g.Result == nil || len(g.Output) != 0 {
			t.Fatalf("woken by result: %+v", g)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the exec long-poll was not woken by the result")
	}
	if r := e.do(http.MethodPost, "/v1/daemon/exec/"+strings.Repeat("a", 32)+"/chunk", "application/octet-stream", testDaemon, []byte("x")); r.status != http.StatusNotFound {
		t.Fatalf("chunk for an unknown exec: %d", r.status)
	}
	for _, q := range []string{"?wait=abc", "?wait=-1", "?offset=-1", "?offset=x"} {
		if r := e.op(http.MethodGet, "/v1/namespaces/default/execs/"+a.ExecID+q, nil); r.status != http.StatusBadRequest {
			t.Fatalf("%s: %d", q, r.status)
		}
	}
}

func TestAckEventAndResultChunkAreStored(t *testing.T) {
	e := newEnv(t)
	inv, d := e.runningInvocation("m")
	ack := &messages.Ack{InvocationID: inv, State: messages.StateFailed, Error: &messages.AckError{Type: "ValueError", Message: "bad"}, WorkerID: "w"}
	for i := 0; i < 2; i++ {
		r := e.daemon("/v1/daemon/ack", ack)
		if r.status != http.StatusOK {
			t.Fatalf("ack %d: %d %q", i, r.status, r.body)
		}
		if dup := decodeMP[map[string]any](t, r)["duplicate"]; dup != (i == 1) {
			t.Fatalf("ack %d duplicate=%v", i, dup)
		}
	}
	for _, m := range []map[string]any{
		{"state": "succeeded"},
		{"invocation_id": "i", "state": "running"},
		{"invocation_id": "i", "state": "failed", "error": "a bare string"},
	} {
		if r := e.daemon("/v1/daemon/ack", m); r.status != http.StatusUnprocessableEntity {
			t.Fatalf("ack %v: %d", m, r.status)
		}
	}
	if r := e.daemon("/v1/daemon/event", map[string]any{"invocation_id": inv, "kind": "invocation.progress", "data": map[string]any{"pct": 50},
		"ts": 1, "worker_id": d.id}); r.status != http.StatusOK {
		t.Fatalf("event: %d %q", r.status, r.body)
	}
	if r := e.daemon("/v1/daemon/event", map[string]any{"kind": "x"}); r.status != http.StatusUnprocessableEntity || errField(t, r) != "invocation_id" {
		t.Fatalf("event without invocation: %d", r.status)
	}
	rc := &messages.ResultChunk{InvocationID: "inv1", Seq: 0, Data: messages.Bytes("abc"), Last: true}
	if r := e.daemon("/v1/daemon/result-chunk", rc); r.status != http.StatusOK {
		t.Fatalf("result chunk: %d %q", r.status, r.body)
	}
	if r := e.daemon("/v1/daemon/result-chunk", map[string]any{"invocation_id": "x", "seq": -1}); r.status != http.StatusUnprocessableEntity || errField(t, r) != "seq" {
		t.Fatalf("negative seq: %d", r.status)
	}
}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := messages.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
