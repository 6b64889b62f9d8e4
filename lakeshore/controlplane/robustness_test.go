package controlplane

import (
	"bytes"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// TestRandomInputNeverFails throws random, truncated and bit-flipped bodies
// with random content types at every route, with and without credentials,
// and requires that none is answered with a 5xx.
func TestRandomInputNeverFails(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Logger = c.Logger.Level(zerolog.WarnLevel) })
	e.srv.pollCap = 20 * time.Millisecond
	e.srv.waitCap = 20 * time.Millisecond
	worker, cursor := e.hello("m", "l")
	acc := e.exec(worker, operatorapi.ExecRequest{Command: "true"})
	open := e.exec(worker, operatorapi.ExecRequest{Command: "true", Stream: true})
	e.poll(worker, nil, 0, "")
	e.do(http.MethodPost, "/v1/daemon/exec/"+acc.ExecID+"/result", messages.ContentType, testDaemon, mustMarshal(t, &messages.ExecResult{}))

	mp := func(v any) []byte { return mustMarshal(t, v) }
	js := func(v any) []byte { return mustJSON(t, v) }
	type route struct {
		method, path, token string
		valid               [][]byte
	}
	hello := helloReq("m", "l")
	routes := []route{
		{"POST", "/v1/daemon/hello", testDaemon, [][]byte{mp(hello)}},
		{"POST", "/v1/daemon/poll", testDaemon, [][]byte{
			mp(&messages.PollRequest{WorkerID: worker, Cursor: &cursor, Invocations: []messages.InvocationStatus{{InvocationID: "i", State: "running", StartedAt: 5}},
				UpdatedCapabilities: &messages.Capabilities{Runners: []string{"process"}}}),
		}},
		{"POST", "/v1/daemon/ack", testDaemon, [][]byte{mp(&messages.Ack{InvocationID: "i", State: "failed", Error: &messages.AckError{Type: "T", Message: "m"}})}},
		{"POST", "/v1/daemon/event", testDaemon, [][]byte{mp(map[string]any{"invocation_id": "i", "kind": "log", "data": "x", "ts": 5})}},
		{"POST", "/v1/daemon/result-chunk", testDaemon, [][]byte{mp(&messages.ResultChunk{InvocationID: "i", Seq: 3, Data: messages.Bytes("abc")})}},
		{"POST", "/v1/daemon/exec/" + open.ExecID + "/chunk", testDaemon, [][]byte{[]byte("hello\n")}},
		{"POST", "/v1/daemon/exec/" + open.ExecID + "/result", testDaemon, [][]byte{
			mp(&messages.ExecResult{ExitCode: 1, Stdout: "o"}), []byte(`{"exit_code":0,"stdout":"x","result_inline":"AAE="}`),
		}},
		{"POST", "/v1/daemon/exec/zz%00/result", testDaemon, [][]byte{mp(&messages.ExecResult{})}},
	}
	for _, r := range []string{
		operatorapi.RouteListWorkers, operatorapi.RouteGetWorker, operatorapi.RouteCleanup, operatorapi.RouteWorkerExec,
		operatorapi.RouteQueueExec, operatorapi.RouteGetExec, operatorapi.RouteSetup, operatorapi.RouteHibernate,
		operatorapi.RouteReset, operatorapi.RouteCancel, operatorapi.RouteCreateToken, operatorapi.RouteListTokens, operatorapi.RouteRevokeToken, operatorapi.RouteListCommands,
		operatorapi.RouteKillWorker, // last: it removes the worker the others use
	} {
		method, path := routeURL(r, worker, acc.ExecID)
		routes = append(routes, route{method, path, testAdmin, [][]byte{
			js(operatorapi.ExecRequest{Command: "true", Queue: "default", Env: map[string]string{"A": "b"}, Stdin: []byte{0, 1}}),
			js(operatorapi.CleanupRequest{OlderThanHours: 1, DryRun: true}),
			js(operatorapi.SetupRequest{Script: "true", Name: "n"}),
			js(operatorapi.HibernateRequest{UntilEpochS: e.clock.Now().Unix() + 60}),
			js(operatorapi.CancelRequest{ExecID: open.ExecID}),
			js(operatorapi.TokenRequest{Kind: "enroll", TTLS: 60}),
		}})
	}

	contentTypes := []string{"", messages.ContentType, "application/json", "application/json; charset=utf-8",
		"application/octet-stream", "text/plain", "multipart/form-data; boundary=x", ";;;=", "application/x-msgpack; x=\""}
	queries := []string{"", "?wait=0.01", "?wait=1e309", "?wait=NaN", "?offset=99999999999", "?offset=3&wait=-0", "?wait=%zz", "?terminate=maybe"}
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return b
	}
	tokens := []string{"", "wrong"}

	requests := 0
	for _, rt := range routes {
		var bodies [][]byte
		for i := 0; i < 12; i++ {
			bodies = append(bodies, random(rng.IntN(200)))
		}
		for _, v := range rt.valid {
			bodies = append(bodies, v)
			for i := 0; i < 6; i++ {
				bodies = append(bodies, v[:rng.IntN(len(v)+1)])
				flipped := bytes.Clone(v)
				for j := 0; j < 1+rng.IntN(3); j++ {
					flipped[rng.IntN(len(flipped))] ^= byte(1 << rng.UintN(8))
				}
				bodies = append(bodies, flipped)
			}
		}
		for _, body := range bodies {
			path := rt.path
			if rt.method == http.MethodGet || rng.IntN(4) == 0 {
				path += queries[rng.IntN(len(queries))]
			}
			token := rt.token
			if token != "" && rng.IntN(6) == 0 {
				token = tokens[rng.IntN(len(tokens))]
			}
			r := e.do(rt.method, path, contentTypes[rng.IntN(len(contentTypes))], token, body)
			requests++
			if r.status >= 500 {
				t.Fatalf("%s %s with %d-byte body %q: %d %s", rt.method, path, len(body), truncate(body), r.status, r.body)
			}
		}
	}
	t.Logf("%d requests, none answered 5xx", requests)
	if n := e.srv.wake.size(); n != 0 {
		t.Fatalf("%d wake-up keys still held after every request returned", n)
	}
}

func truncate(b []byte) string {
	s := string(b)
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}

// TestHostileSizes sends bodies whose headers declare huge containers, and
// a body over the size limit.
func TestHostileSizes(t *testing.T) {
	e := newEnv(t)
	for _, body := range [][]byte{
		{0xdf, 0xff, 0xff, 0xff, 0xff},                                 // map of 4G entries
		{0x81, 0xa4, 't', 'a', 'g', 's', 0xdd, 0x7f, 0xff, 0xff, 0xff}, // array of 2G entries
		{0x81, 0xa1, 'a', 0xc6, 0x7f, 0xff, 0xff, 0xff},                // 2 GiB bin
		bytes.Repeat([]byte{0x91}, 100000),                             // deeply nested arrays
	} {
		for _, path := range []string{"/v1/daemon/hello", "/v1/daemon/poll", "/v1/daemon/ack"} {
			r := e.do(http.MethodPost, path, messages.ContentType, testDaemon, body)
			if r.status < 400 || r.status >= 500 {
				t.Fatalf("%s with %x…: %d %q", path, body[:min(len(body), 8)], r.status, r.body)
			}
		}
	}
	big := bytes.Repeat([]byte("x"), limitHello+1)
	if r := e.do(http.MethodPost, "/v1/daemon/hello", messages.ContentType, testDaemon, big); r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized hello: %d", r.status)
	}
}
