package controlplane

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

const testTriple = "x86_64-unknown-linux-gnu"

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// publish uploads bin as version/triple through the operator route.
func (e *env) publish(version, triple string, bin []byte) operatorapi.Release {
	e.t.Helper()
	q := "?version=" + version
	if triple != "" {
		q += "&triple=" + triple
	}
	r := e.do(http.MethodPost, "/v1/releases"+q, "application/octet-stream", testAdmin, bin)
	if r.status != http.StatusCreated {
		e.t.Fatalf("publish %s/%s: %d %s", version, triple, r.status, r.body)
	}
	return decodeJS[operatorapi.Release](e.t, r)
}

func fakeBinary(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

func TestPublishListDownload(t *testing.T) {
	e := newEnv(t)
	bin := fakeBinary(1, 300_000)
	rel := e.publish("0.2.0", testTriple, bin)
	wantURL := e.url + "/v1/releases/0.2.0/" + testTriple
	if rel.SHA256 != sha(bin) || rel.Size != int64(len(bin)) || rel.URL != wantURL || rel.SidecarURL != wantURL+".sha256" {
		t.Fatalf("published %+v", rel)
	}

	list := decodeJS[operatorapi.ReleaseList](t, e.op(http.MethodGet, "/v1/releases", nil))
	if len(list.Releases) != 1 || list.Releases[0].SHA256 != sha(bin) || list.Releases[0].Version != "0.2.0" {
		t.Fatalf("list: %+v", list)
	}

	// Downloads need no token, like the spec's release bucket.
	got := e.do(http.MethodGet, "/v1/releases/0.2.0/"+testTriple, "", "", nil)
	if got.status != http.StatusOK || !bytes.Equal(got.body, bin) {
		t.Fatalf("download: %d, %d bytes", got.status, len(got.body))
	}
	side := e.do(http.MethodGet, "/v1/releases/0.2.0/"+testTriple+".sha256", "", "", nil)
	if side.status != http.StatusOK || string(side.body) != sha(bin)+"  nymph-"+testTriple+"\n" {
		t.Fatalf("sidecar: %d %q", side.status, side.body)
	}
	if h := e.do(http.MethodHead, "/v1/releases/0.2.0/"+testTriple, "", "", nil); h.status != http.StatusOK || h.header.Get("Content-Length") != "300000" {
		t.Fatalf("HEAD: %d %v", h.status, h.header)
	}
	if r := e.do(http.MethodGet, "/v1/releases/0.3.0/"+testTriple, "", "", nil); r.status != http.StatusNotFound {
		t.Fatalf("unpublished download: %d", r.status)
	}

	// The sidecar is what sha256sum -c accepts for the downloaded file.
	sum, err := exec.LookPath("sha256sum")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("sha256sum: %v", err)
		}
		t.Skip("sha256sum not installed")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nymph-"+testTriple), got.body, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nymph-"+testTriple+".sha256"), side.body, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sum, "-c", "nymph-"+testTriple+".sha256")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c: %v: %s", err, out)
	}
}

func TestPublishRefusals(t *testing.T) {
	e := newEnv(t)
	e.srv.rel.maxSize = 1000
	cases := []struct {
		name, query, token string
		body               []byte
		status             int
		field              string
	}{
		{"no token", "?version=1.0.0", "", []byte("x"), http.StatusUnauthorized, "authorization"},
		{"no version", "", testAdmin, []byte("x"), http.StatusBadRequest, "version"},
		{"bad version", "?version=../x", testAdmin, []byte("x"), http.StatusBadRequest, "version"},
		{"bad triple", "?version=1.0.0&triple=X86", testAdmin, []byte("x"), http.StatusBadRequest, "triple"},
		{"empty body", "?version=1.0.0&triple=" + testTriple, testAdmin, nil, http.StatusBadRequest, "body"},
		{"too large", "?version=1.0.0&triple=" + testTriple, testAdmin, make([]byte, 1001), http.StatusRequestEntityTooLarge, "body"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.do(http.MethodPost, "/v1/releases"+c.query, "application/octet-stream", c.token, c.body)
			if r.status != c.status || errField(t, r) != c.field {
				t.Fatalf("%d %s, want %d naming %s", r.status, r.body, c.status, c.field)
			}
		})
	}
	// A chunked upload over the cap is cut off while streaming.
	req, err := http.NewRequest(http.MethodPost, e.url+"/v1/releases?version=1.0.0&triple="+testTriple, struct{ *bytes.Reader }{bytes.NewReader(make([]byte, 5000))})
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testAdmin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked oversize: %d", resp.StatusCode)
	}
	if list := decodeJS[operatorapi.ReleaseList](t, e.op(http.MethodGet, "/v1/releases", nil)); len(list.Releases) != 0 {
		t.Fatalf("a refused upload was published: %+v", list)
	}
}

// pollRaw polls and returns the response as a generic map, to see which
// keys are on the wire.
func (e *env) pollRaw(worker string) map[string]any {
	e.t.Helper()
	r := e.daemon("/v1/daemon/poll", &messages.PollRequest{WorkerID: worker})
	if r.status != http.StatusOK {
		e.t.Fatalf("poll: %d %q", r.status, r.body)
	}
	var m map[string]any
	if err := messages.Unmarshal(r.body, &m); err != nil {
		e.t.Fatal(err)
	}
	return m
}

func TestTargetVersionOnEveryPoll(t *testing.T) {
	e := newEnv(t)
	worker, _ := e.hello("m1", "w1")
	if m := e.pollRaw(worker); m["target_nymph_version"] != nil {
		t.Fatalf("unset target: %v", m)
	} else if _, ok := m["target_nymph_version"]; !ok {
		t.Fatalf("target_nymph_version missing from the poll response: %v", m)
	}

	tv := decodeJS[operatorapi.TargetVersion](t, e.op(http.MethodGet, "/v1/namespaces/default/target-version", nil))
	if tv.Version != nil || tv.Namespace != "default" {
		t.Fatalf("get unset: %+v", tv)
	}
	if r := e.op(http.MethodPut, "/v1/namespaces/default/target-version", map[string]string{"version": "not a version"}); r.status != http.StatusBadRequest || errField(t, r) != "version" {
		t.Fatalf("bad version: %d %s", r.status, r.body)
	}
	e.publish("0.3.1", testTriple, []byte("binary"))
	r := e.op(http.MethodPut, "/v1/namespaces/default/target-version", operatorapi.SetTargetVersionRequest{Version: "0.3.1"})
	tv = decodeJS[operatorapi.TargetVersion](t, r)
	if r.status != http.StatusOK || tv.Version == nil || *tv.Version != "0.3.1" || !slices.Equal(tv.PublishedTriples, []string{testTriple}) {
		t.Fatalf("set: %d %s", r.status, r.body)
	}
	if m := e.pollRaw(worker); m["target_nymph_version"] != "0.3.1" {
		t.Fatalf("poll after set: %v", m)
	}
	// Another namespace has its own (no) target.
	if tv := decodeJS[operatorapi.TargetVersion](t, e.op(http.MethodGet, "/v1/namespaces/other/target-version", nil)); tv.Version != nil {
		t.Fatalf("other namespace: %+v", tv)
	}
	if r := e.op(http.MethodDelete, "/v1/namespaces/default/target-version", nil); r.status != http.StatusOK {
		t.Fatalf("clear: %d %s", r.status, r.body)
	}
	if m := e.pollRaw(worker); m["target_nymph_version"] != nil {
		t.Fatalf("poll after clear: %v", m)
	}
}

// takeOta polls once and decodes the single ota_update it must carry.
func (e *env) takeOta(worker string) *messages.OtaUpdate {
	e.t.Helper()
	p := e.poll(worker, nil, 0, "")
	if len(p.Commands) != 1 || p.Commands[0].Kind != messages.KindOtaUpdate {
		e.t.Fatalf("want one ota_update, got %v", commandsOf(p))
	}
	ota, ok := messages.DecodeCommand(p.Commands[0]).(*messages.OtaUpdate)
	if !ok {
		e.t.Fatalf("ota_update decodes to %#v", messages.DecodeCommand(p.Commands[0]))
	}
	return ota
}

func (e *env) update(worker string, req operatorapi.UpdateRequest) resp {
	e.t.Helper()
	return e.op(http.MethodPost, "/v1/namespaces/default/workers/"+worker+"/update", req)
}

func TestUpdateDerivesURLAndChecksum(t *testing.T) {
	e := newEnv(t)
	worker, _ := e.hello("m1", "w1")
	bin := fakeBinary(2, 4096)
	e.publish("0.4.0", testTriple, bin)

	// No version and no target: the field is named.
	if r := e.update(worker, operatorapi.UpdateRequest{}); r.status != http.StatusBadRequest || errField(t, r) != "version" {
		t.Fatalf("no version: %d %s", r.status, r.body)
	}
	e.op(http.MethodPut, "/v1/namespaces/default/target-version", operatorapi.SetTargetVersionRequest{Version: "0.4.0"})

	r := e.update(worker, operatorapi.UpdateRequest{})
	if r.status != http.StatusAccepted {
		t.Fatalf("update: %d %s", r.status, r.body)
	}
	q := decodeJS[operatorapi.UpdateQueued](t, r)
	wantURL := e.url + "/v1/releases/0.4.0/" + testTriple
	if q.Kind != "ota_update" || q.Version != "0.4.0" || q.URL != wantURL || q.SHA256 != sha(bin) || q.CurrentVersion == nil || *q.CurrentVersion != "0.0.1" {
		t.Fatalf("queued: %+v", q)
	}
	ota := e.takeOta(worker)
	if *ota != (messages.OtaUpdate{Version: "0.4.0", URL: wantURL, SHA256: sha(bin)}) {
		t.Fatalf("ota_update body: %+v", ota)
	}
	// What the command names is what the daemon will download.
	if d := e.do(http.MethodGet, strings.TrimPrefix(ota.URL, e.url), "", "", nil); d.status != http.StatusOK || sha(d.body) != ota.SHA256 {
		t.Fatalf("download of the command's URL: %d, sha %s", d.status, sha(d.body))
	}
}

func TestUpdateOverridesAndRefusals(t *testing.T) {
	e := newEnv(t)
	worker, _ := e.hello("m1", "w1")
	bin := fakeBinary(3, 2048)
	e.publish("0.5.0", testTriple, bin)

	other := strings.Repeat("ab", 32)
	if r := e.update(worker, operatorapi.UpdateRequest{Version: "0.5.0", SHA256: strings.ToUpper(other)}); r.status != http.StatusAccepted {
		t.Fatalf("sha override: %d %s", r.status, r.body)
	}
	if ota := e.takeOta(worker); ota.SHA256 != other || ota.URL != e.url+"/v1/releases/0.5.0/"+testTriple {
		t.Fatalf("sha override: %+v", ota)
	}

	// A URL elsewhere: the checksum comes from its .sha256 sidecar.
	ext := []byte("external build")
	mirror := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/bin/nymph":
			_, _ = w.Write(ext)
		case "/bin/nymph.sha256":
			_, _ = w.Write([]byte(sha(ext) + "  nymph\n"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer mirror.Close()
	if r := e.update(worker, operatorapi.UpdateRequest{Version: "0.6.0", URL: mirror.URL + "/bin/nymph?sig=secret"}); r.status != http.StatusAccepted {
		t.Fatalf("url override: %d %s", r.status, r.body)
	}
	if ota := e.takeOta(worker); *ota != (messages.OtaUpdate{Version: "0.6.0", URL: mirror.URL + "/bin/nymph?sig=secret", SHA256: sha(ext)}) {
		t.Fatalf("url override: %+v", ota)
	}
	// Our own release URL is answered from the store.
	own := e.url + "/v1/releases/0.5.0/" + testTriple
	if r := e.update(worker, operatorapi.UpdateRequest{Version: "0.5.0", URL: own}); r.status != http.StatusAccepted {
		t.Fatalf("own url: %d %s", r.status, r.body)
	}
	if ota := e.takeOta(worker); ota.SHA256 != sha(bin) {
		t.Fatalf("own url: %+v", ota)
	}

	odd, _ := e.hello("m2", "odd")
	oddHello := helloReq("m2", "odd")
	oddHello.Versions.Arch = str("pdp11")
	e.daemon("/v1/daemon/hello", oddHello)

	cases := []struct {
		name   string
		worker string
		req    operatorapi.UpdateRequest
		status int
		field  string
		says   string
	}{
		{"unpublished version", worker, operatorapi.UpdateRequest{Version: "9.9.9"}, http.StatusConflict, "version", "not published"},
		{"non-hex sha", worker, operatorapi.UpdateRequest{Version: "0.5.0", SHA256: strings.Repeat("zz", 32)}, http.StatusBadRequest, "sha256", "64 hex"},
		{"short sha", worker, operatorapi.UpdateRequest{Version: "0.5.0", SHA256: "abc"}, http.StatusBadRequest, "sha256", "64 hex"},
		{"bad version", worker, operatorapi.UpdateRequest{Version: "-1"}, http.StatusBadRequest, "version", ""},
		{"bad url", worker, operatorapi.UpdateRequest{Version: "0.5.0", URL: "ftp://x/y"}, http.StatusBadRequest, "url", "http"},
		{"no sidecar", worker, operatorapi.UpdateRequest{Version: "0.5.0", URL: mirror.URL + "/bin/missing"}, http.StatusConflict, "sha256", "sidecar"},
		{"own url unpublished", worker, operatorapi.UpdateRequest{Version: "0.5.0", URL: e.url + "/v1/releases/0.7.0/" + testTriple}, http.StatusConflict, "url", "not published"},
		{"unknown arch", odd, operatorapi.UpdateRequest{Version: "0.5.0"}, http.StatusConflict, "url", "pdp11"},
		{"unknown worker", "nope", operatorapi.UpdateRequest{Version: "0.5.0"}, http.StatusNotFound, "id", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.update(c.worker, c.req)
			if r.status != c.status || errField(t, r) != c.field || !strings.Contains(string(r.body), c.says) {
				t.Fatalf("%d %s, want %d naming %s saying %q", r.status, r.body, c.status, c.field, c.says)
			}
		})
	}
	if p := e.poll(worker, nil, 0, ""); len(p.Commands) != 0 {
		t.Fatalf("a refused update queued %v", commandsOf(p))
	}
}

func TestQueuesAndMembership(t *testing.T) {
	e := newEnv(t)
	worker, _ := e.hello("m1", "w1", "gpu")
	path := "/v1/namespaces/default/workers/" + worker + "/queues"

	if r := e.op(http.MethodPost, "/v1/namespaces/default/queues", operatorapi.CreateQueueRequest{Name: "batch"}); r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	r := e.op(http.MethodPost, "/v1/namespaces/default/queues", operatorapi.CreateQueueRequest{Name: "batch"})
	if c := decodeJS[operatorapi.QueueCreated](t, r); r.status != http.StatusOK || c.Created || c.Queue.CreatedAt == nil {
		t.Fatalf("create again: %d %s", r.status, r.body)
	}
	for _, bad := range []string{"", "-x", "a b", strings.Repeat("q", 200)} {
		if r := e.op(http.MethodPost, "/v1/namespaces/default/queues", operatorapi.CreateQueueRequest{Name: bad}); r.status != http.StatusBadRequest || errField(t, r) != "name" {
			t.Fatalf("create %q: %d %s", bad, r.status, r.body)
		}
	}

	r = e.op(http.MethodPost, path, operatorapi.QueueEditRequest{Add: []string{"batch", "nope"}})
	if r.status != http.StatusBadRequest || errField(t, r) != "add" || !strings.Contains(string(r.body), `\"nope\"`) {
		t.Fatalf("add missing queue: %d %s", r.status, r.body)
	}
	if got := e.worker(worker).Queues; !slices.Equal(got, []string{"gpu"}) {
		t.Fatalf("a refused edit changed membership: %v", got)
	}
	if r := e.op(http.MethodPost, path, operatorapi.QueueEditRequest{}); r.status != http.StatusBadRequest {
		t.Fatalf("empty edit: %d %s", r.status, r.body)
	}

	r = e.op(http.MethodPost, path, operatorapi.QueueEditRequest{Add: []string{"batch"}, Remove: []string{"gpu"}})
	wq := decodeJS[operatorapi.WorkerQueues](t, r)
	if r.status != http.StatusOK || !slices.Equal(wq.Queues, []string{"batch"}) || !slices.Equal(wq.Lanes, []string{"gpu"}) ||
		!slices.Equal(wq.Added, []string{"batch"}) || !slices.Equal(wq.Removed, []string{"gpu"}) {
		t.Fatalf("edit: %d %s", r.status, r.body)
	}

	// The daemon says hello again naming its lane: the operator's edits stand.
	if again, _ := e.hello("m1", "w1", "gpu", "cpu"); again != worker {
		t.Fatalf("re-hello gave %s", again)
	}
	if got := e.worker(worker).Queues; !slices.Equal(got, []string{"cpu", "batch"}) {
		t.Fatalf("after re-hello: %v", got)
	}

	// Routing follows the effective membership.
	e.poll(worker, nil, 0, "")
	if r := e.op(http.MethodPost, "/v1/namespaces/default/exec", operatorapi.ExecRequest{Command: "true", Queue: "batch"}); r.status != http.StatusAccepted {
		t.Fatalf("exec to an added queue: %d %s", r.status, r.body)
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/exec", operatorapi.ExecRequest{Command: "true", Queue: "gpu"}); r.status != http.StatusConflict {
		t.Fatalf("exec to a removed lane: %d %s", r.status, r.body)
	}

	// A queue only a daemon's poll joined exists, and can be removed too.
	e.poll(worker, nil, 0, "poll-q")
	list := decodeJS[operatorapi.QueueList](t, e.op(http.MethodGet, "/v1/namespaces/default/queues", nil))
	var names []string
	for _, q := range list.Queues {
		names = append(names, q.Name)
		if q.Name == "gpu" && (q.CreatedAt != nil || len(q.Members) != 0) {
			t.Fatalf("joined-only queue gpu: %+v", q)
		}
		if q.Name == "batch" && (q.CreatedAt == nil || !slices.Equal(q.Members, []string{worker})) {
			t.Fatalf("created queue batch: %+v", q)
		}
	}
	if !slices.Equal(names, []string{"batch", "cpu", "gpu", "poll-q"}) {
		t.Fatalf("queues: %v", names)
	}
	if r := e.op(http.MethodPost, path, operatorapi.QueueEditRequest{Remove: []string{"poll-q"}}); r.status != http.StatusOK {
		t.Fatalf("remove poll queue: %d %s", r.status, r.body)
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/exec", operatorapi.ExecRequest{Command: "true", Queue: "poll-q"}); r.status != http.StatusConflict {
		t.Fatalf("exec to a removed poll queue: %d %s", r.status, r.body)
	}
	// Adding back a removed lane cancels the removal.
	r = e.op(http.MethodPost, path, operatorapi.QueueEditRequest{Add: []string{"gpu"}})
	if wq := decodeJS[operatorapi.WorkerQueues](t, r); !slices.Equal(wq.Queues, []string{"gpu", "cpu", "batch"}) || !slices.Equal(wq.Removed, []string{"poll-q"}) {
		t.Fatalf("re-add: %s", r.body)
	}
}

// TestNewRoutesRandomInput: random, truncated and bit-flipped bodies on
// every route of this file never get a 5xx.
func TestNewRoutesRandomInput(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Logger = c.Logger.Level(zerolog.WarnLevel) })
	e.srv.rel.maxSize = 4096
	worker, _ := e.hello("m", "l", "gpu")
	e.publish("1.0.0", testTriple, []byte("bin"))
	e.op(http.MethodPost, "/v1/namespaces/default/queues", operatorapi.CreateQueueRequest{Name: "batch"})

	js := func(v any) []byte { b, _ := json.Marshal(v); return b }
	routes := []struct {
		method, path, token string
		valid               [][]byte
	}{
		{"POST", "/v1/releases?version=1.0.1&triple=" + testTriple, testAdmin, [][]byte{[]byte("binary")}},
		{"POST", "/v1/releases?version=%zz", testAdmin, [][]byte{[]byte("binary")}},
		{"GET", "/v1/releases", testAdmin, nil},
		{"GET", "/v1/releases/1.0.0/" + testTriple, "", nil},
		{"GET", "/v1/releases/1.0.0/" + testTriple + ".sha256", "", nil},
		{"GET", "/v1/releases/..%2f..%2fetc/passwd", "", nil},
		{"DELETE", "/v1/releases/9.9.9/" + testTriple, testAdmin, nil},
		{"DELETE", "/v1/releases/..%2f/" + testTriple, testAdmin, nil},
		{"GET", "/v1/namespaces/default/target-version", testAdmin, nil},
		{"PUT", "/v1/namespaces/default/target-version", testAdmin, [][]byte{js(operatorapi.SetTargetVersionRequest{Version: "1.0.0"})}},
		{"DELETE", "/v1/namespaces/default/target-version", testAdmin, nil},
		{"POST", "/v1/namespaces/default/workers/" + worker + "/update", testAdmin, [][]byte{
			js(operatorapi.UpdateRequest{Version: "1.0.0"}),
			js(operatorapi.UpdateRequest{Version: "1.0.0", URL: e.url + "/v1/releases/1.0.0/" + testTriple, SHA256: sha(nil)}),
		}},
		{"POST", "/v1/namespaces/default/queues", testAdmin, [][]byte{js(operatorapi.CreateQueueRequest{Name: "q1"})}},
		{"GET", "/v1/namespaces/default/queues", testAdmin, nil},
		{"POST", "/v1/namespaces/default/workers/" + worker + "/queues", testAdmin, [][]byte{
			js(operatorapi.QueueEditRequest{Add: []string{"batch"}, Remove: []string{"gpu"}}),
		}},
		{"POST", "/v1/namespaces/n%00s/workers/" + worker + "/queues", testAdmin, [][]byte{js(operatorapi.QueueEditRequest{Add: []string{"batch"}})}},
	}
	rng := rand.New(rand.NewPCG(7, 8))
	requests := 0
	for _, rt := range routes {
		var bodies [][]byte
		for i := 0; i < 10; i++ {
			bodies = append(bodies, fakeBinary(rng.Uint64(), rng.IntN(300)))
		}
		for _, v := range rt.valid {
			bodies = append(bodies, v)
			for i := 0; i < 6; i++ {
				bodies = append(bodies, v[:rng.IntN(len(v)+1)])
				flipped := bytes.Clone(v)
				flipped[rng.IntN(len(flipped))] ^= byte(1 << rng.UintN(8))
				bodies = append(bodies, flipped)
			}
		}
		for _, body := range bodies {
			token := rt.token
			if rng.IntN(6) == 0 {
				token = "wrong"
			}
			r := e.do(rt.method, rt.path, "application/json", token, body)
			requests++
			if r.status >= 500 {
				t.Fatalf("%s %s with %q: %d %s", rt.method, rt.path, truncate(body), r.status, r.body)
			}
		}
	}
	t.Logf("%d requests, none answered 5xx", requests)
}
