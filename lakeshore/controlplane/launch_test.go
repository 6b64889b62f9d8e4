package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"nymph/dist"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/providers"
	"nymph/messages"
)

// The script provider is the real part here: the control plane runs a
// launcher executable (providers/testdata/script/*.sh, a fake cloud whose
// machines are files) through the same code as any operator's script.

// withProviders lets the env open real launchers.
func withProviders(cfg *Config) {
	cfg.OpenProvider = func(ctx context.Context, spec providers.Spec, dir string) (providers.Launcher, error) {
		return providers.Open(ctx, spec, dir, zerolog.Nop())
	}
}

// launcherScript is the absolute path of a test launcher.
func launcherScript(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "providers", "testdata", "script", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// cloudState points the test launchers at a fresh state directory; they
// inherit the control plane's environment, as an operator's script does.
func cloudState(t *testing.T, hold int) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("LAUNCHER_STATE", dir)
	if hold > 0 {
		t.Setenv("LAUNCHER_HOLD", strconv.Itoa(hold))
	}
	return dir
}

// publishRelease publishes a stand-in nymph for the launch triple.
func (e *env) publishRelease(version string) {
	e.t.Helper()
	if _, err := e.srv.rel.store.Publish(context.Background(), strings.NewReader("#!/bin/sh\necho stand-in nymph\n"), version, launchTriple); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) addScriptProvider(name, script string) {
	e.t.Helper()
	expectJS[operatorapi.Provider](e.t, e.op(http.MethodPost, "/v1/providers", operatorapi.ProviderRequest{
		Name: name, Kind: "script", Config: json.RawMessage(`{"command":"` + script + `"}`),
	}), http.StatusCreated, "add provider")
}

func (e *env) launch(req operatorapi.LaunchRequest) resp {
	e.t.Helper()
	return e.op(http.MethodPost, "/v1/namespaces/default/workers/launch", req)
}

var tokenInScript = regexp.MustCompile(`dl[te]_[A-Za-z0-9_-]{43}`)

// machineRequest reads what the fake cloud was asked for instance id.
func machineRequest(t *testing.T, state, id string) (req struct {
	WorkerID  string          `json:"worker_id"`
	Name      string          `json:"name"`
	Bootstrap string          `json:"bootstrap"`
	Capacity  json.RawMessage `json:"capacity"`
}) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "instances", id))
	if err != nil {
		t.Fatalf("machine %s: %v", id, err)
	}
	if err := json.Unmarshal(b, &req); err != nil {
		t.Fatalf("machine %s: %v", id, err)
	}
	return req
}

func TestLaunchThroughScriptProvider(t *testing.T) {
	state := cloudState(t, 2)
	e := newEnv(t, withProviders)
	e.publishRelease("1.2.3")
	e.addScriptProvider("cloud", launcherScript(t, "cloud.sh"))

	keep := 300
	out := expectJS[operatorapi.LaunchResponse](t, e.launch(operatorapi.LaunchRequest{
		Provider: "cloud", Name: "fleet", Count: 6, Concurrency: 2,
		Capacity: json.RawMessage(`{"instance_type":"g5.2xlarge"}`), Tags: []string{"gpu=h100"}, Queues: []string{"training"},
		KeepAliveS: &keep, SetupScripts: []string{"echo first\n", "echo second\n"},
	}), http.StatusCreated, "launch")
	if len(out.Launched) != 6 || len(out.Failed) != 0 {
		t.Fatalf("launched %d, failed %+v", len(out.Launched), out.Failed)
	}
	peak, err := os.ReadFile(filepath.Join(state, "peak"))
	if err != nil || strings.TrimSpace(string(peak)) != "2" {
		t.Fatalf("launches in flight at once: %q (%v), want 2 (--concurrency 2, and the launcher holds until two overlap)", peak, err)
	}
	releaseURL := dist.URLFor(e.srv.currentPublicURL(""), dist.DefaultPrefix, "1.2.3", launchTriple)
	tokens := map[string]bool{}
	for i, w := range out.Launched {
		wantName := "fleet-0" + string(rune('0'+i))
		if w.Label != wantName || w.State != operatorapi.StatePending || w.Provider != "cloud" || w.InstanceID != "inst-"+w.ID {
			t.Fatalf("launched[%d] = %+v", i, w)
		}
		req := machineRequest(t, state, w.InstanceID)
		if req.WorkerID != w.ID || req.Name != wantName || !bytes.Equal(bytes.TrimSpace(req.Capacity), []byte(`{"instance_type":"g5.2xlarge"}`)) {
			t.Fatalf("machine %s was asked for %+v", w.InstanceID, req)
		}
		found := tokenInScript.FindAllString(req.Bootstrap, -1)
		if len(found) != 1 || !strings.Contains(req.Bootstrap, releaseURL) {
			t.Fatalf("bootstrap of %s: tokens %q; want one, and the release at %s", w.ID, found, releaseURL)
		}
		tokens[found[0]] = true
	}
	if len(tokens) != 6 {
		t.Fatalf("%d distinct tokens for 6 daemons", len(tokens))
	}
	// Still pending long after: a booting machine is not stale.
	e.clock.Advance(10 * operatorapi.StaleAfter)
	if got := e.worker(out.Launched[0].ID).State; got != operatorapi.StatePending {
		t.Fatalf("a launched daemon not heard from yet reads %q, want pending", got)
	}

	// The first daemon's hello, with the token its bootstrap carries,
	// becomes its row: setting_up, with the two setups queued in order.
	first := out.Launched[0]
	token := tokenInScript.FindString(machineRequest(t, state, first.InstanceID).Bootstrap)
	hr := e.helloWith(token, "machine-a", "fleet-00", "inc-a")
	if hr.Reject != nil || hr.WorkerID == nil || *hr.WorkerID != first.ID {
		t.Fatalf("hello of the launched daemon: %+v, want worker %s", hr, first.ID)
	}
	if w := e.worker(first.ID); w.State != operatorapi.StateSettingUp || w.MachineID != "machine-a" || w.InstanceID != first.InstanceID {
		t.Fatalf("after hello: %+v", w)
	}
	pr := e.daemonAs(token, "/v1/daemon/poll", &messages.PollRequest{WorkerID: first.ID, Cursor: hr.Cursor})
	if pr.status != http.StatusOK {
		t.Fatalf("poll: %d %s", pr.status, pr.body)
	}
	resp := decodeMP[messages.PollResponse](t, pr)
	if kinds := commandsOf(resp); !slices.Equal(kinds, []string{messages.KindSetup, messages.KindSetup}) {
		t.Fatalf("first poll: %v, want the two setups", kinds)
	}
	// Another launched daemon's token does not open this row.
	other := tokenInScript.FindString(machineRequest(t, state, out.Launched[1].InstanceID).Bootstrap)
	if hr := e.helloWith(other, "machine-a", "fleet-00", "inc-x"); hr.Reject == nil {
		t.Fatalf("hello as fleet-00 with fleet-01's token: %+v, want a refusal", hr)
	}

	// launch-log is the provider's console-log.
	ll := expectJS[operatorapi.LaunchLog](t, e.op(http.MethodGet, "/v1/namespaces/default/workers/"+first.ID+"/launch-log", nil), http.StatusOK, "launch-log")
	if !strings.Contains(ll.Output, "console of "+first.InstanceID) {
		t.Fatalf("launch-log = %+v", ll)
	}

	// kill terminates the machine, then removes the row.
	kr := expectJS[operatorapi.KillResponse](t, e.op(http.MethodDelete, "/v1/namespaces/default/workers/"+first.ID, nil), http.StatusOK, "kill")
	if !kr.Terminated || kr.InstanceID != first.InstanceID {
		t.Fatalf("kill = %+v", kr)
	}
	if _, err := os.Stat(filepath.Join(state, "instances", first.InstanceID)); !os.IsNotExist(err) {
		t.Fatalf("machine %s after kill: %v, want terminated", first.InstanceID, err)
	}
	// --no-terminate leaves the machine running.
	second := out.Launched[1]
	kr = expectJS[operatorapi.KillResponse](t, e.op(http.MethodDelete, "/v1/namespaces/default/workers/"+second.ID+"?terminate=false", nil), http.StatusOK, "kill --no-terminate")
	if kr.Terminated {
		t.Fatalf("kill --no-terminate = %+v", kr)
	}
	if _, err := os.Stat(filepath.Join(state, "instances", second.InstanceID)); err != nil {
		t.Fatalf("machine %s after kill --no-terminate: %v, want still running", second.InstanceID, err)
	}
	calls, _ := os.ReadFile(filepath.Join(state, "calls"))
	if strings.Count(string(calls), "terminate ") != 1 {
		t.Fatalf("terminate calls:\n%s", calls)
	}

	// A daemon no provider launched says so.
	plain, _ := e.hello("machine-p", "plain")
	kr = expectJS[operatorapi.KillResponse](t, e.op(http.MethodDelete, "/v1/namespaces/default/workers/"+plain, nil), http.StatusOK, "kill plain")
	if kr.Terminated || !strings.Contains(kr.Note, "not launched by a provider") {
		t.Fatalf("kill of a plain daemon = %+v", kr)
	}
	plain, _ = e.hello("machine-p", "plain")
	if r := e.op(http.MethodGet, "/v1/namespaces/default/workers/"+plain+"/launch-log", nil); r.status != http.StatusConflict ||
		!strings.Contains(string(r.body), "not launched by a provider") {
		t.Fatalf("launch-log of a plain daemon: %d %s", r.status, r.body)
	}

	// The provider cannot go while its daemons have rows.
	if r := e.op(http.MethodDelete, "/v1/providers/cloud", nil); r.status != http.StatusConflict {
		t.Fatalf("remove a provider with daemons: %d %s", r.status, r.body)
	}
	list := expectJS[operatorapi.ProviderList](t, e.op(http.MethodGet, "/v1/providers", nil), http.StatusOK, "list providers")
	if len(list.Providers) != 1 || list.Providers[0].Workers != 4 {
		t.Fatalf("providers = %+v, want cloud with 4 daemons", list.Providers)
	}
}

func TestLaunchRetriesAThrottledLauncher(t *testing.T) {
	state := cloudState(t, 0)
	e := newEnv(t, withProviders)
	e.publishRelease("1.0.0")
	e.addScriptProvider("slow", launcherScript(t, "throttle-twice.sh"))
	out := expectJS[operatorapi.LaunchResponse](t, e.launch(operatorapi.LaunchRequest{Provider: "slow", Name: "one"}), http.StatusCreated, "launch")
	if len(out.Launched) != 1 {
		t.Fatalf("launch = %+v", out)
	}
	if n, _ := os.ReadFile(filepath.Join(state, "throttled")); strings.TrimSpace(string(n)) != "2" {
		t.Fatalf("throttled %q times, want 2 then a success", n)
	}
}

func TestLaunchFailuresLeaveNothingBehind(t *testing.T) {
	cloudState(t, 0)
	e := newEnv(t, withProviders)

	// Before anything is published there is nothing to install.
	e.addScriptProvider("broken", launcherScript(t, "fail.sh"))
	if r := e.launch(operatorapi.LaunchRequest{Provider: "broken"}); r.status != http.StatusConflict || errField(t, r) != "provider" ||
		!strings.Contains(string(r.body), "release publish") {
		t.Fatalf("launch with no release: %d %s", r.status, r.body)
	}
	e.publishRelease("1.0.0")

	r := e.launch(operatorapi.LaunchRequest{Provider: "broken", Name: "doomed", Count: 3})
	if r.status != http.StatusBadGateway || errField(t, r) != "provider" {
		t.Fatalf("launch through a failing launcher: %d %s", r.status, r.body)
	}
	body := string(r.body)
	if !strings.Contains(body, "doomed-00") || !strings.Contains(body, "doomed-02") {
		t.Fatalf("the failure does not name each launch: %s", body)
	}
	ws := expectJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil), http.StatusOK, "list")
	if len(ws.Workers) != 0 {
		t.Fatalf("failed launches left rows: %+v", ws.Workers)
	}
	toks := expectJS[operatorapi.TokenList](t, e.op(http.MethodGet, "/v1/tokens", nil), http.StatusOK, "tokens")
	for _, tok := range toks.Tokens {
		if tok.RevokedAt == nil {
			t.Fatalf("a failed launch left a live token: %+v", tok)
		}
	}

	badKeep := -5
	for _, tc := range []struct {
		name   string
		req    operatorapi.LaunchRequest
		status int
		field  string
	}{
		{"unknown provider", operatorapi.LaunchRequest{Provider: "nope"}, http.StatusNotFound, "provider"},
		{"no provider", operatorapi.LaunchRequest{}, http.StatusBadRequest, "provider"},
		{"capacity not an object", operatorapi.LaunchRequest{Provider: "broken", Capacity: json.RawMessage(`[1]`)}, http.StatusBadRequest, "capacity"},
		{"count too big", operatorapi.LaunchRequest{Provider: "broken", Count: 101}, http.StatusBadRequest, "count"},
		{"unknown runner", operatorapi.LaunchRequest{Provider: "broken", Runners: []string{"vm"}}, http.StatusBadRequest, "runners"},
		{"keep-alive", operatorapi.LaunchRequest{Provider: "broken", KeepAliveS: &badKeep}, http.StatusBadRequest, "keepAliveS"},
	} {
		r := e.launch(tc.req)
		if r.status != tc.status || errField(t, r) != tc.field {
			t.Errorf("%s: %d %s, want %d naming %s", tc.name, r.status, r.body, tc.status, tc.field)
		}
	}
	if r := e.do(http.MethodPost, "/v1/namespaces/default/workers/launch", "application/json", testAdmin,
		[]byte(`{"provider":"broken","capacity":{"a":`)); r.status != http.StatusBadRequest {
		t.Errorf("malformed JSON: %d %s", r.status, r.body)
	}
}

func TestProviderRegistration(t *testing.T) {
	e := newEnv(t, withProviders)
	for _, tc := range []struct {
		name   string
		req    operatorapi.ProviderRequest
		status int
		field  string
	}{
		{"unknown kind", operatorapi.ProviderRequest{Name: "x", Kind: "gce"}, http.StatusBadRequest, "kind"},
		{"bad name", operatorapi.ProviderRequest{Name: "a b", Kind: "script"}, http.StatusBadRequest, "name"},
		{"misspelt setting", operatorapi.ProviderRequest{Name: "x", Kind: "script", Config: json.RawMessage(`{"comand":"/bin/true"}`)}, http.StatusBadRequest, "config"},
		{"missing command", operatorapi.ProviderRequest{Name: "x", Kind: "script", Config: json.RawMessage(`{"command":"/nonexistent/launcher"}`)}, http.StatusUnprocessableEntity, "config"},
	} {
		r := e.op(http.MethodPost, "/v1/providers", tc.req)
		if r.status != tc.status || errField(t, r) != tc.field {
			t.Errorf("%s: %d %s, want %d naming %s", tc.name, r.status, r.body, tc.status, tc.field)
		}
	}
	e.addScriptProvider("cloud", launcherScript(t, "cloud.sh"))
	if r := e.op(http.MethodPost, "/v1/providers", operatorapi.ProviderRequest{Name: "cloud", Kind: "script",
		Config: json.RawMessage(`{"command":"/bin/true"}`)}); r.status != http.StatusConflict {
		t.Errorf("second cloud: %d %s", r.status, r.body)
	}
	p := expectJS[operatorapi.Provider](t, e.op(http.MethodGet, "/v1/providers/cloud", nil), http.StatusOK, "show")
	if p.Kind != "script" || !strings.Contains(string(p.Config), "cloud.sh") {
		t.Errorf("show = %+v", p)
	}
	expectJS[operatorapi.Provider](t, e.op(http.MethodDelete, "/v1/providers/cloud", nil), http.StatusOK, "remove")
	if r := e.op(http.MethodGet, "/v1/providers/cloud", nil); r.status != http.StatusNotFound {
		t.Errorf("show after remove: %d", r.status)
	}
}

// TestLaunchedDaemonEnrolls: where signatures are required a launch mints
// an enrollment token, and the daemon's enrolling hello takes over the
// pending row.
func TestLaunchedDaemonEnrolls(t *testing.T) {
	state := cloudState(t, 0)
	e := newTLSEnv(t, withProviders, func(c *Config) { c.RequireSignatures = true })
	if _, err := e.srv.rel.store.Publish(context.Background(), strings.NewReader("#!/bin/sh\n"), "1.0.0", launchTriple); err != nil {
		t.Fatal(err)
	}
	expectJS[operatorapi.Provider](t, e.op(http.MethodPost, "/v1/providers", operatorapi.ProviderRequest{
		Name: "cloud", Kind: "script", Config: json.RawMessage(`{"command":"` + launcherScript(t, "cloud.sh") + `"}`),
	}), http.StatusCreated, "add provider")
	out := expectJS[operatorapi.LaunchResponse](t, e.op(http.MethodPost, "/v1/namespaces/default/workers/launch",
		operatorapi.LaunchRequest{Provider: "cloud", Name: "signed"}), http.StatusCreated, "launch")
	w := out.Launched[0]
	token := tokenInScript.FindString(machineRequest(t, state, w.InstanceID).Bootstrap)
	if !strings.HasPrefix(token, enrollTokenPrefix) {
		t.Fatalf("the bootstrap carries %q, want an enrollment token", token)
	}
	h := e.newHost("machine-s", "signed")
	hr := h.hello(token)
	if hr.Reject != nil || hr.WorkerID == nil || *hr.WorkerID != w.ID || hr.KeyID == nil {
		t.Fatalf("enrolling hello: %+v reject %+v, want worker %s enrolled", hr, hr.Reject, w.ID)
	}
	if got := e.getWorker(w.ID); got.State != operatorapi.StateActive || got.MachineID != "machine-s" || len(got.Keys) != 1 {
		t.Fatalf("after enrolling: %+v", got)
	}
	h.mustPoll()
}
