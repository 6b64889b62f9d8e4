package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"nymph/identity"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/harness"
	"nymph/test/wait"
)

// authRchar is how many bytes process pid has read through read(2) and its
// kin, sockets included (/proc/<pid>/io).
func authRchar(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no rchar in /proc/%d/io", pid)
	return 0
}

// authHostileBody is what every refused request below carries: 100 MB.
const authHostileBody = 100 << 20

// authPostUnread posts an authHostileBody-byte body of zeros to path on cp with the
// given header lines, over a connection written by hand: the body is
// written by a goroutine while the answer is read, so an early answer is
// seen however much of the body is still to go, and with expect the body
// is sent only if the server asks for it (100 Continue). It returns the
// status and how many body bytes the client had written into its socket
// when the answer came.
func authPostUnread(t *testing.T, cp *harness.ControlPlane, path string, expect bool, header map[string]string) (int, int64) {
	t.Helper()
	u, err := url.Parse(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var head bytes.Buffer
	fmt.Fprintf(&head, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n", path, u.Host, authHostileBody)
	if expect {
		head.WriteString("Expect: 100-continue\r\n")
	}
	for k, v := range header {
		fmt.Fprintf(&head, "%s: %s\r\n", k, v)
	}
	head.WriteString("\r\n")
	if _, err := conn.Write(head.Bytes()); err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int64
	done := make(chan struct{})
	send := func() {
		go func() {
			defer close(done)
			buf := make([]byte, 64<<10)
			for left := int64(authHostileBody); left > 0; {
				n, err := conn.Write(buf[:min(int64(len(buf)), left)])
				sent.Add(int64(n))
				left -= int64(n)
				if err != nil {
					return // refused: the server closed the connection
				}
			}
		}()
	}
	if !expect {
		send()
	}
	br := bufio.NewReader(conn)
	r, err := http.ReadResponse(br, nil)
	if err == nil && r.StatusCode == http.StatusContinue {
		t.Errorf("%s: the server asked for the body of a request it refuses", path)
		send()
		r, err = http.ReadResponse(br, nil)
	}
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	taken := sent.Load()
	_, _ = io.Copy(io.Discard, r.Body)
	r.Body.Close()
	conn.Close()
	if !expect || taken > 0 {
		<-done
	}
	return r.StatusCode, taken
}

// Hole 2 of the internet review: any X-LS-* header made the server read the
// whole body (up to 128 MiB on /ack) before it refused the request. Now
// every credential is checked from the headers, and a refusal reads no body.
// The server's reads are measured from /proc (rchar of `lakeshore serve`),
// what the client got into its socket from the client's side.
func TestInternetAuthRefusesBeforeReading(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	key, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := http.NewRequest(http.MethodPost, cp.URL+"/v1/daemon/ack", nil)
	if err := key.SignRequest(sig, []byte("not this body"), time.Now()); err != nil {
		t.Fatal(err)
	}
	unknownKey := map[string]string{"Content-Type": messages.ContentType}
	for _, h := range []string{identity.HeaderKeyID, identity.HeaderTimestamp, identity.HeaderNonce, identity.HeaderSignature} {
		unknownKey[h] = sig.Header.Get(h)
	}
	cases := []struct {
		name   string
		path   string
		header map[string]string
		status int
	}{
		{"/ack with X-LS-Nonce: x", "/v1/daemon/ack", map[string]string{identity.HeaderNonce: "x"}, http.StatusUnauthorized},
		{"/ack signed by an unknown key", "/v1/daemon/ack", unknownKey, http.StatusUnauthorized},
		{"/event with X-LS-Nonce: x", "/v1/daemon/event", map[string]string{identity.HeaderNonce: "x"}, http.StatusUnauthorized},
		{"an exec result without credential", "/v1/daemon/exec/" + strings.Repeat("0", 32) + "/result", nil, http.StatusUnauthorized},
	}
	for _, tc := range cases {
		for _, expect := range []bool{false, true} {
			before := authRchar(t, cp.PID())
			status, taken := authPostUnread(t, cp, tc.path, expect, tc.header)
			read := authRchar(t, cp.PID()) - before
			t.Logf("%s, Expect: 100-continue %v: %d after the client wrote %d of %d body bytes into its socket; the server read %d bytes meanwhile",
				tc.name, expect, status, taken, authHostileBody, read)
			if status != tc.status {
				t.Fatalf("%s: %d, want %d", tc.name, status, tc.status)
			}
			// What the server reads besides: the request's head, its store.
			if read > 1<<20 {
				t.Fatalf("%s: the server read %d bytes for a request it refused", tc.name, read)
			}
			if expect && taken != 0 {
				t.Fatalf("%s: the client was asked for %d body bytes", tc.name, taken)
			}
		}
	}
}

// authDaemonPost posts a msgpack body to a daemon route with token.
func authDaemonPost(t *testing.T, cp *harness.ControlPlane, path, token string, body any) (int, []byte) {
	t.Helper()
	b, err := messages.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return authRawPost(t, cp, path, messages.ContentType, token, b)
}

func authRawPost(t *testing.T, cp *harness.ControlPlane, path, contentType, token string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, cp.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := cp.HTTP.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// authMintToken mints a daemon token with the CLI.
func authMintToken(t *testing.T, cp *harness.ControlPlane, args ...string) operatorapi.TokenResponse {
	t.Helper()
	r := cp.CLI(t, append([]string{"token", "create", "--json"}, args...)...)
	expectCode(t, r, 0)
	return mustJSON[operatorapi.TokenResponse](t, r)
}

// authGate is a FIFO a job blocks on until the test opens it.
func authGate(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gate")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// authOpenGate lets the job waiting on gate p go on.
func authOpenGate(t *testing.T, p string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("go\n")
	f.Close()
}

func authGetExec(t *testing.T, cp *harness.ControlPlane, id string) execEnvelope {
	t.Helper()
	var ex execEnvelope
	if err := cp.GetJSON("/v1/namespaces/default/execs/"+id, &ex); err != nil {
		t.Fatal(err)
	}
	return ex
}

// Holes 3, 4 and 5: results and output only from the worker an exec was
// delivered to, while it runs; a token is its own daemon's. Two real
// daemons, each with a token of its own; B's token is the attacker's.
func TestInternetAuthWorkersCannotActForEachOther(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	ta, tb := authMintToken(t, cp, "--label", "a"), authMintToken(t, cp, "--label", "b")
	cp.StartDaemon(t, harness.DaemonOptions{Label: "a", Token: ta.Token, Runners: []string{"process"}, Queue: "qa", WaitMaxS: 1})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "b", Token: tb.Token, Runners: []string{"process"}, Queue: "qb", WaitMaxS: 1})
	a := cp.WaitForWorker(t, "a")
	b := cp.WaitForWorker(t, "b")

	list := mustJSON[operatorapi.TokenList](t, cp.CLI(t, "token", "list", "--json"))
	for _, tok := range list.Tokens {
		if want := map[string]string{"a": a.ID, "b": b.ID}[tok.Label]; tok.WorkerID != want || tok.Fleet {
			t.Fatalf("token %s bound to %q, want %q", tok.Label, tok.WorkerID, want)
		}
	}
	if r := cp.CLI(t, "token", "list"); !strings.Contains(r.Stdout, "WORKER") || !strings.Contains(r.Stdout, a.ID) {
		t.Fatalf("token list:\n%s", r.Stdout)
	}

	// An exec on A, held running until the test opens its gate.
	execGate := authGate(t)
	var acc operatorapi.ExecAccepted
	if err := cp.PostJSON("/v1/namespaces/default/workers/"+a.ID+"/exec", operatorapi.ExecRequest{
		Command: "read x < " + execGate + "; echo real", Stream: true}, &acc); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "a's exec to run", func() bool { return authGetExec(t, cp, acc.ExecID).State == operatorapi.ExecRunning })

	forged := &messages.ExecResult{ExitCode: 0, Stdout: "forged"}
	resultPath := "/v1/daemon/exec/" + acc.ExecID + "/result"
	for _, tc := range []struct {
		who    string
		token  string
		status int
	}{{"no credential", "", http.StatusUnauthorized}, {"b's token", tb.Token, http.StatusNotFound}} {
		if st, body := authDaemonPost(t, cp, resultPath, tc.token, forged); st != tc.status {
			t.Fatalf("forged result, %s: %d %q", tc.who, st, body)
		}
		if st, body := authRawPost(t, cp, "/v1/daemon/exec/"+acc.ExecID+"/chunk", "application/octet-stream", tc.token, []byte("forged")); st != tc.status {
			t.Fatalf("forged chunk, %s: %d %q", tc.who, st, body)
		}
	}
	if ex := authGetExec(t, cp, acc.ExecID); ex.State != operatorapi.ExecRunning || ex.Result != nil {
		t.Fatalf("a's exec after forged results: %+v", ex)
	}
	authOpenGate(t, execGate)
	var done execEnvelope
	wait.For(t, 30*time.Second, "a's real result", func() bool {
		done = authGetExec(t, cp, acc.ExecID)
		return done.State == operatorapi.ExecFinished
	})
	if done.Result == nil || done.Result.ExitCode != 0 || strings.Contains(done.Result.Stdout, "forged") {
		t.Fatalf("a's exec result: %+v", done.Result)
	}
	var out operatorapi.Exec
	if err := cp.GetJSON("/v1/namespaces/default/execs/"+acc.ExecID, &out); err != nil || string(out.Output) != "real\n" {
		t.Fatalf("a's streamed output %q, %v", out.Output, err)
	}
	// A late chunk, with A's own token: refused, the output as it was.
	if st, body := authRawPost(t, cp, "/v1/daemon/exec/"+acc.ExecID+"/chunk", "application/octet-stream", ta.Token, []byte("late")); st != http.StatusConflict {
		t.Fatalf("late chunk: %d %q", st, body)
	}
	if st, _ := authDaemonPost(t, cp, resultPath, ta.Token, forged); st != http.StatusConflict {
		t.Fatalf("second result: %d", st)
	}
	if err := cp.GetJSON("/v1/namespaces/default/execs/"+acc.ExecID, &out); err != nil || string(out.Output) != "real\n" || out.Result.Stdout != "" {
		t.Fatalf("a's exec after the late posts: output %q result %+v, %v", out.Output, out.Result, err)
	}

	// B's token, saying hello as A: refused, A's row untouched.
	before := cp.Workers(t)
	hello := &messages.HelloRequest{MachineID: "host-a", Label: "a", Tags: []string{}, Incarnation: "evil",
		Capabilities: messages.Capabilities{Runners: []string{"process"}},
		Versions:     messages.Versions{Daemon: authStr("0"), Protocol: authStr(messages.ProtocolVersion)}}
	st, body := authDaemonPost(t, cp, "/v1/daemon/hello", tb.Token, hello)
	var hr messages.HelloResponse
	if st != http.StatusOK || messages.Unmarshal(body, &hr) != nil || hr.Reject == nil || hr.Reject.Code != messages.RejectWorkerBound || hr.WorkerID != nil {
		t.Fatalf("b's hello as a: %d %+v", st, hr.Reject)
	}
	t.Logf("b's hello as a: %s: %s", hr.Reject.Code, hr.Reject.Message)
	if after := cp.Workers(t); len(after) != len(before) {
		t.Fatalf("workers %d, were %d", len(after), len(before))
	}

	// B polls as A: refused.
	zero := "0"
	if st, body := authDaemonPost(t, cp, "/v1/daemon/poll", tb.Token, &messages.PollRequest{WorkerID: a.ID, Queue: "qa", Cursor: &zero, Invocations: []messages.InvocationStatus{}}); st != http.StatusForbidden {
		t.Fatalf("b polling as a: %d %q", st, body)
	}

	// A run on A, held running; B acks it as A and as itself: refused.
	runGate := authGate(t)
	var sub operatorapi.InvocationSubmitted
	if err := cp.PostJSON("/v1/namespaces/default/invocations", operatorapi.InvocationRequest{Queue: "qa",
		Script: "read x < " + runGate + "; printf real > \"$NYMPH_RESULT_PATH\"", RunConfig: operatorapi.RunConfig{Runner: authStr("process")}}, &sub); err != nil {
		t.Fatal(err)
	}
	inv := func() operatorapi.Invocation {
		var v operatorapi.Invocation
		if err := cp.GetJSON("/v1/namespaces/default/invocations/"+sub.Invocation.ID, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	wait.For(t, 30*time.Second, "a's run to be running on a", func() bool {
		v := inv()
		return v.State == operatorapi.InvocationRunning && v.WorkerID == a.ID
	})
	for _, as := range []string{a.ID, b.ID, ""} {
		ack := &messages.Ack{InvocationID: sub.Invocation.ID, State: messages.StateSucceeded, ResultBlob: messages.Bytes("forged"), WorkerID: as}
		if st, body := authDaemonPost(t, cp, "/v1/daemon/ack", tb.Token, ack); st != http.StatusNotFound {
			t.Fatalf("b's ack of a's run (worker_id %q): %d %q", as, st, body)
		}
	}
	if v := inv(); v.State != operatorapi.InvocationRunning {
		t.Fatalf("a's run after b's acks: %+v", v)
	}
	authOpenGate(t, runGate)
	var final operatorapi.Invocation
	wait.For(t, 30*time.Second, "a's run to succeed", func() bool {
		final = inv()
		return final.State != operatorapi.InvocationRunning
	})
	if final.State != operatorapi.InvocationSucceeded || string(final.Result) != "real" {
		t.Fatalf("a's run: %+v", final)
	}
	// A is unaffected: still active, still taking work.
	r := cp.CLI(t, "daemon", "exec", "a", "echo", "still a")
	expectCode(t, r, 0)
	if r.Stdout != "still a\n" {
		t.Fatalf("exec on a: %q", r.Stdout)
	}
}

func authStr(s string) *string { return &s }

// A fleet token is shared: two daemons say hello with it and both work;
// `token create --help` says what sharing means.
func TestInternetAuthFleetTokenIsShared(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	help := cp.CLI(t, "token", "create", "--help")
	if !strings.Contains(help.Stdout, "--fleet") || !strings.Contains(help.Stdout, "can act for each other") ||
		!strings.Contains(help.Stdout, "unless daemon identity is on") {
		t.Fatalf("token create --help:\n%s", help.Stdout)
	}
	fleet := authMintToken(t, cp, "--fleet", "--label", "image")
	if !fleet.Fleet {
		t.Fatalf("minted %+v", fleet)
	}
	for _, label := range []string{"f1", "f2"} {
		cp.StartDaemon(t, harness.DaemonOptions{Label: label, Token: fleet.Token})
	}
	for _, label := range []string{"f1", "f2"} {
		r := cp.CLI(t, "daemon", "exec", label, "echo", label)
		expectCode(t, r, 0)
		if r.Stdout != label+"\n" {
			t.Fatalf("exec on %s: %q", label, r.Stdout)
		}
	}
	r := cp.CLI(t, "token", "list")
	if !strings.Contains(r.Stdout, "fleet") {
		t.Fatalf("token list does not show the fleet token:\n%s", r.Stdout)
	}
	list := mustJSON[operatorapi.TokenList](t, cp.CLI(t, "token", "list", "--json"))
	if len(list.Tokens) != 1 || !list.Tokens[0].Fleet || list.Tokens[0].WorkerID != "" {
		t.Fatalf("token list --json: %+v", list.Tokens)
	}
}
