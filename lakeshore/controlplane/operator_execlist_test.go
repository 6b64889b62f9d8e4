package controlplane

import (
	"net/http"
	"testing"

	"nymph/lakeshore/operatorapi"
)

// The exec list: newest first, one worker's with ?worker=, bounded by
// ?limit=, each bad parameter a 400 naming it.
func TestListExecs(t *testing.T) {
	e := newEnv(t)
	a, _ := e.hello("m1", "a")
	b, _ := e.hello("m2", "b")
	var ids []string
	for _, w := range []string{a, b, a} {
		acc := decodeJS[operatorapi.ExecAccepted](t, e.op(http.MethodPost, "/v1/namespaces/default/workers/"+w+"/exec",
			operatorapi.ExecRequest{Command: "echo " + w}))
		ids = append(ids, acc.ExecID)
		e.clock.Advance(1e9)
	}
	list := func(q string) []string {
		t.Helper()
		var out []string
		for _, x := range decodeJS[operatorapi.ExecList](t, e.op(http.MethodGet, "/v1/namespaces/default/execs"+q, nil)).Execs {
			if x.State != operatorapi.ExecQueued || x.CreatedAt.IsZero() || x.ExitCode != nil {
				t.Fatalf("listed %+v", x)
			}
			out = append(out, x.ExecID)
		}
		return out
	}
	if got := list(""); len(got) != 3 || got[0] != ids[2] || got[2] != ids[0] {
		t.Fatalf("all: %v, want newest first of %v", got, ids)
	}
	if got := list("?worker=" + a); len(got) != 2 || got[0] != ids[2] || got[1] != ids[0] {
		t.Fatalf("worker a: %v", got)
	}
	if got := list("?limit=1"); len(got) != 1 || got[0] != ids[2] {
		t.Fatalf("limit 1: %v", got)
	}
	for _, tc := range []struct{ q, field string }{{"?limit=0", "limit"}, {"?limit=1001", "limit"}, {"?worker=a%20b", "worker"}} {
		r := e.do(http.MethodGet, "/v1/namespaces/default/execs"+tc.q, "", testAdmin, nil)
		if r.status != http.StatusBadRequest || errField(t, r) != tc.field {
			t.Errorf("%s: %d %s", tc.q, r.status, r.body)
		}
	}
	if r := e.do(http.MethodGet, "/v1/namespaces/default/execs", "", "", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("without the admin token: %d", r.status)
	}
}
