package controlplane

import (
	"net/http"
	"net/url"
	"slices"
	"testing"

	"nymph/lakeshore/operatorapi"
)

// The worker list filters (derived state, queue membership, label
// prefix) and pages on the server, and counts every worker by state
// whatever the filter.
func TestListWorkersFiltersAndPages(t *testing.T) {
	e := newEnv(t)
	gpuA, _ := e.hello("m1", "gpu-a", "gpu")
	e.hello("m2", "gpu-b", "gpu")
	e.hello("m3", "cpu-a")
	e.clock.Advance(operatorapi.StaleAfter + 1e9)
	e.poll(gpuA, nil, 0, "")

	list := func(q url.Values) operatorapi.WorkerList {
		t.Helper()
		return decodeJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers?"+q.Encode(), nil))
	}
	labels := func(l operatorapi.WorkerList) []string {
		var out []string
		for _, w := range l.Workers {
			out = append(out, w.Label)
		}
		return out
	}
	wantCounts := []operatorapi.StateCount{{State: "active", Count: 1}, {State: "stale", Count: 2}, {State: "joining"},
		{State: "setting_up"}, {State: "pending"}, {State: "gone"}}
	for _, tc := range []struct {
		q     url.Values
		want  []string
		total int
	}{
		{url.Values{}, []string{"cpu-a", "gpu-a", "gpu-b"}, 3},
		{url.Values{"state": {"stale"}}, []string{"cpu-a", "gpu-b"}, 2},
		{url.Values{"state": {"active"}}, []string{"gpu-a"}, 1},
		{url.Values{"queue": {"gpu"}}, []string{"gpu-a", "gpu-b"}, 2},
		{url.Values{"labelPrefix": {"gpu-"}, "state": {"stale"}}, []string{"gpu-b"}, 1},
		{url.Values{"labelPrefix": {"gpu"}, "limit": {"1"}, "offset": {"1"}}, []string{"gpu-b"}, 2},
		{url.Values{"limit": {"2"}}, []string{"cpu-a", "gpu-a"}, 3},
		{url.Values{"offset": {"5"}}, nil, 3},
		// Odd characters are no error: they match nothing.
		{url.Values{"labelPrefix": {`<script>'"%00`}, "queue": {"*"}}, nil, 0},
	} {
		got := list(tc.q)
		if !slices.Equal(labels(got), tc.want) || got.Total != tc.total || !slices.Equal(got.Counts, wantCounts) {
			t.Errorf("?%s: %v total %d counts %v; want %v total %d counts %v", tc.q.Encode(), labels(got), got.Total, got.Counts,
				tc.want, tc.total, wantCounts)
		}
	}

	for _, tc := range []struct{ q, field string }{
		{"state=asleep", "state"},
		{"limit=-1", "limit"},
		{"limit=1001", "limit"},
		{"limit=ten", "limit"},
		{"offset=-3", "offset"},
		{"labelPrefix=a%0Ab", "labelPrefix"},
		{"queue=" + url.QueryEscape(string(make([]byte, 300))), "queue"},
		{"labelPrefix=%FF", "labelPrefix"},
	} {
		r := e.do(http.MethodGet, "/v1/namespaces/default/workers?"+tc.q, "", testAdmin, nil)
		if r.status != http.StatusBadRequest || errField(t, r) != tc.field {
			t.Errorf("?%s: %d %s, want 400 naming %s", tc.q, r.status, r.body, tc.field)
		}
	}
}
