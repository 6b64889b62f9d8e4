package cli_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/controlplane"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/servecli"
	"nymph/messages"
)

const (
	realAdmin  = "real-admin"
	realDaemon = "real-daemon"
	x86Triple  = "x86_64-unknown-linux-gnu"
)

// realCP is a real control plane (SQLite in a temp dir, real HTTP) that
// tests drive with the CLI on one side and msgpack daemon calls on the
// other.
type realCP struct {
	t   *testing.T
	url string
	env map[string]string
}

// newRealCP starts a control plane; opts adjust its configuration.
func newRealCP(t *testing.T, opts ...func(*controlplane.Config)) *realCP {
	t.Helper()
	dir := t.TempDir()
	hs := httptest.NewUnstartedServer(nil)
	cfg := controlplane.Config{
		DataDir: filepath.Join(dir, "data"), PublicURL: "http://" + hs.Listener.Addr().String(),
		AdminToken: realAdmin, DaemonToken: realDaemon,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
	}
	for _, o := range opts {
		o(&cfg)
	}
	if err := servecli.OpenStores(context.Background(), &cfg, ""); err != nil {
		t.Fatal(err)
	}
	srv, err := controlplane.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs.Config.Handler = srv.Handler()
	hs.Start()
	t.Cleanup(func() {
		hs.Close()
		if err := srv.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return &realCP{t: t, url: hs.URL, env: map[string]string{
		cli.EnvURL: hs.URL, cli.EnvAdminToken: realAdmin, cli.EnvCredentials: filepath.Join(dir, "credentials.json"),
	}}
}

func (c *realCP) run(o runOpts, args ...string) result {
	c.t.Helper()
	return runCLI(c.t, o, c.env, args...)
}

func (c *realCP) daemonCall(path string, body, out any) {
	c.t.Helper()
	req, _ := daemonRequest(c.t, c.url+path, realDaemon, body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("POST %s: %s %q", path, resp.Status, raw)
	}
	if err := messages.Unmarshal(raw, out); err != nil {
		c.t.Fatal(err)
	}
}

// hello registers a daemon of the given arch with lanes and returns its id.
func (c *realCP) hello(label, arch string, lanes ...string) string {
	c.t.Helper()
	v, proto := "0.1.0", messages.ProtocolVersion
	var resp messages.HelloResponse
	c.daemonCall("/v1/daemon/hello", messages.HelloRequest{
		MachineID: "host-" + label, Label: label, Tags: []string{}, Lanes: lanes,
		Capabilities: messages.Capabilities{Runners: []string{"process"}},
		Versions:     messages.Versions{Daemon: &v, Protocol: &proto, Arch: &arch},
	}, &resp)
	if resp.WorkerID == nil {
		c.t.Fatalf("hello refused: %+v", resp)
	}
	return *resp.WorkerID
}

// otaUpdates polls once (legacy, no cursor) and returns the ota_updates.
func (c *realCP) otaUpdates(worker string) []messages.OtaUpdate {
	c.t.Helper()
	var resp messages.PollResponse
	c.daemonCall("/v1/daemon/poll", messages.PollRequest{WorkerID: worker}, &resp)
	var out []messages.OtaUpdate
	for _, cmd := range resp.Commands {
		if o, ok := messages.DecodeCommand(cmd).(*messages.OtaUpdate); ok {
			out = append(out, *o)
		}
	}
	return out
}

func TestReleaseTargetAndUpdate(t *testing.T) {
	cp := newRealCP(t)
	bin := bytes.Repeat([]byte("nymph binary "), 1000)
	sum := sha256.Sum256(bin)
	hexSum := hex.EncodeToString(sum[:])
	path := filepath.Join(t.TempDir(), "nymph")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}

	if r := cp.run(runOpts{}, "release", "publish", path); r.code != cli.ExitUsage || !strings.Contains(r.stderr, "--version") {
		t.Fatalf("publish without --version: %+v", r)
	}
	r := cp.run(runOpts{}, "release", "publish", path, "--version", "0.2.0", "--triple", x86Triple)
	if r.code != 0 || !strings.Contains(r.stdout, "published nymph 0.2.0 for "+x86Triple) || !strings.Contains(r.stdout, hexSum) {
		t.Fatalf("publish: %+v", r)
	}
	r = cp.run(runOpts{}, "release", "list", "--json")
	var rl operatorapi.ReleaseList
	if err := json.Unmarshal([]byte(r.stdout), &rl); err != nil || len(rl.Releases) != 1 || rl.Releases[0].SHA256 != hexSum {
		t.Fatalf("release list: %v %+v", err, r)
	}
	if r := cp.run(runOpts{}, "release", "list"); !strings.Contains(r.stdout, "0.2.0") || !strings.Contains(r.stdout, "12.7 KiB") {
		t.Fatalf("release list table: %+v", r)
	}

	if r := cp.run(runOpts{}, "daemon", "target-version"); r.code != 0 || !strings.Contains(r.stdout, "no target version") {
		t.Fatalf("target-version unset: %+v", r)
	}
	if r := cp.run(runOpts{}, "daemon", "set-target-version", "0.3.0"); r.code != 0 || !strings.Contains(r.stderr, "not published") {
		t.Fatalf("set unpublished target: %+v", r)
	}
	if r := cp.run(runOpts{}, "daemon", "set-target-version", "--clear"); r.code != 0 || !strings.Contains(r.stdout, "cleared") {
		t.Fatalf("clear: %+v", r)
	}
	if r := cp.run(runOpts{}, "daemon", "set-target-version", "0.2.0", "--clear"); r.code != cli.ExitUsage {
		t.Fatalf("version and --clear: %+v", r)
	}

	a := cp.hello("fleet-a", "x86_64")
	b := cp.hello("fleet-b", "amd64")
	odd := cp.hello("odd", "pdp11")

	// No version and no target: a clear error naming the way out.
	if r := cp.run(runOpts{}, "daemon", "update", "fleet-a"); r.code != cli.ExitError || !strings.Contains(r.stderr, "version") {
		t.Fatalf("update without any version: %+v", r)
	}
	if r := cp.run(runOpts{}, "daemon", "set-target-version", "0.2.0"); r.code != 0 || r.stderr != "" {
		t.Fatalf("set target: %+v", r)
	}
	if r := cp.run(runOpts{}, "daemon", "target-version"); !strings.Contains(r.stdout, "0.2.0 (published for "+x86Triple+")") {
		t.Fatalf("target-version: %+v", r)
	}

	r = cp.run(runOpts{}, "daemon", "update", "fleet-a")
	if r.code != 0 || !strings.Contains(r.stdout, "queued ota_update to 0.2.0 from 0.1.0") {
		t.Fatalf("update one: %+v", r)
	}
	want := messages.OtaUpdate{Version: "0.2.0", URL: cp.url + "/v1/releases/0.2.0/" + x86Triple, SHA256: hexSum}
	if got := cp.otaUpdates(a); len(got) != 1 || got[0] != want {
		t.Fatalf("queued for fleet-a: %+v", got)
	}

	// Fan-out without a terminal and without --yes is cancelled, exit 0.
	r = cp.run(runOpts{}, "daemon", "update", "--prefix", "fleet")
	if r.code != 0 || !strings.Contains(r.stderr, "cancelled") || len(cp.otaUpdates(a))+len(cp.otaUpdates(b)) != 0 {
		t.Fatalf("non-TTY fan-out: %+v", r)
	}
	// On a terminal, a "no" cancels and a "y" goes ahead.
	if r := cp.run(runOpts{stdinTTY: true, stdin: "n\n"}, "daemon", "update", "--prefix", "fleet"); r.code != 0 || len(cp.otaUpdates(a)) != 0 {
		t.Fatalf("declined: %+v", r)
	}
	r = cp.run(runOpts{stdinTTY: true, stdin: "y\n"}, "daemon", "update", "--prefix", "fleet")
	if r.code != 0 || !strings.Contains(r.stderr, "Update 2 daemons to nymph 0.2.0?") || strings.Count(r.stdout, "queued ota_update") != 2 ||
		!strings.Contains(r.stdout, "2 of 2 daemons queued, 0 failed") {
		t.Fatalf("confirmed fan-out: %+v", r)
	}
	if len(cp.otaUpdates(a)) != 1 || len(cp.otaUpdates(b)) != 1 {
		t.Fatal("fan-out did not reach both daemons")
	}

	// One daemon of three cannot be served: the others still are, exit 1.
	r = cp.run(runOpts{}, "daemon", "update", "--all", "--yes", "--json")
	var s cli.UpdateSummary
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil || r.code != cli.ExitError || s.Count != 3 || s.Failed != 1 {
		t.Fatalf("--all with a failure: %v %+v", err, r)
	}
	for _, o := range s.Results {
		if (o.WorkerID == odd) == o.OK || (o.WorkerID == odd && !strings.Contains(o.Error, "pdp11")) {
			t.Fatalf("outcome: %+v", o)
		}
	}
	r = cp.run(runOpts{}, "daemon", "update", "--all", "--yes", "--version", "9.9.9")
	if r.code != cli.ExitError || strings.Count(r.stdout, "error:") != 3 || !strings.Contains(r.stdout, "0 of 3 daemons queued, 3 failed") {
		t.Fatalf("--all, nothing published: %+v", r)
	}

	for _, args := range [][]string{
		{"daemon", "update", "fleet-a", "--all"},
		{"daemon", "update", "--all", "--prefix", "x"},
		{"daemon", "update"},
	} {
		if r := cp.run(runOpts{}, args...); r.code != cli.ExitUsage {
			t.Fatalf("%v: %+v", args, r)
		}
	}
	if r := cp.run(runOpts{}, "daemon", "update", "fleet-a", "--sha256", "xyz"); r.code != cli.ExitError || !strings.Contains(r.stderr, `field "sha256"`) {
		t.Fatalf("non-hex sha: %+v", r)
	}
	cp.otaUpdates(a)
	cp.otaUpdates(b)
	cp.otaUpdates(odd)
}

func TestQueueVerbsAndMembershipEdits(t *testing.T) {
	cp := newRealCP(t)
	w := cp.hello("gpu-rig", "x86_64", "gpu")

	if r := cp.run(runOpts{}, "queue", "create", "training"); r.code != 0 || !strings.Contains(r.stdout, "created queue training") {
		t.Fatalf("create: %+v", r)
	}
	if r := cp.run(runOpts{}, "queue", "create", "training"); r.code != 0 || !strings.Contains(r.stdout, "already exists") {
		t.Fatalf("create again: %+v", r)
	}
	r := cp.run(runOpts{}, "daemon", "update", "gpu-rig", "--add-queue", "nope")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, `"nope" does not exist`) {
		t.Fatalf("add a missing queue: %+v", r)
	}
	// A queue-only edit needs no version and queues no update.
	r = cp.run(runOpts{}, "daemon", "update", "gpu-rig", "--add-queue", "training", "--remove-queue", "gpu")
	if r.code != 0 || !strings.Contains(r.stdout, "queues now training") || strings.Contains(r.stdout, "ota_update") {
		t.Fatalf("queue edit: %+v", r)
	}
	if got := cp.otaUpdates(w); len(got) != 0 {
		t.Fatalf("a queue edit queued %+v", got)
	}
	// The daemon's next hello names its lane again; the edit stands.
	cp.hello("gpu-rig", "x86_64", "gpu")
	r = cp.run(runOpts{}, "queue", "list", "--json")
	var ql operatorapi.QueueList
	if err := json.Unmarshal([]byte(r.stdout), &ql); err != nil || len(ql.Queues) != 2 {
		t.Fatalf("queue list: %v %+v", err, r)
	}
	for _, q := range ql.Queues {
		switch q.Name {
		case "training":
			if q.CreatedAt == nil || !slices.Equal(q.Members, []string{w}) {
				t.Fatalf("training: %+v", q)
			}
		case "gpu":
			if q.CreatedAt != nil || len(q.Members) != 0 {
				t.Fatalf("gpu: %+v", q)
			}
		default:
			t.Fatalf("unexpected queue %+v", q)
		}
	}
	if r := cp.run(runOpts{}, "queue", "list"); !strings.Contains(r.stdout, "joined by a daemon") || !strings.Contains(r.stdout, "training") {
		t.Fatalf("queue list table: %+v", r)
	}
	r = cp.run(runOpts{}, "daemon", "update", "--all", "--yes", "--remove-queue", "training", "--json")
	var s cli.UpdateSummary
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil || r.code != 0 || s.Count != 1 || s.Results[0].Queues == nil || s.Results[0].Update != nil {
		t.Fatalf("fanned-out queue edit: %v %+v", err, r)
	}
}

// release delete: every triple of a version, or one; never the target.
func TestReleaseDelete(t *testing.T) {
	cp := newRealCP(t)
	path := filepath.Join(t.TempDir(), "nymph")
	if err := os.WriteFile(path, bytes.Repeat([]byte("nymph binary "), 100), 0o755); err != nil {
		t.Fatal(err)
	}
	const arm = "aarch64-unknown-linux-gnu"
	for _, p := range [][]string{{"0.1.0", x86Triple}, {"0.1.0", arm}, {"0.2.0", x86Triple}} {
		if r := cp.run(runOpts{}, "release", "publish", path, "--version", p[0], "--triple", p[1]); r.code != 0 {
			t.Fatalf("publish %v: %+v", p, r)
		}
	}
	if r := cp.run(runOpts{}, "daemon", "set-target-version", "0.2.0"); r.code != 0 {
		t.Fatalf("set target: %+v", r)
	}
	if r := cp.run(runOpts{}, "release", "delete", "0.2.0"); r.code != cli.ExitError || !strings.Contains(r.stderr, "target version of namespace default") {
		t.Fatalf("delete the target: %+v", r)
	}
	if r := cp.run(runOpts{}, "release", "delete", "0.1.0", "--triple", arm); r.code != 0 || r.stdout != "deleted 0.1.0 for "+arm+"\n" {
		t.Fatalf("delete one triple: %+v", r)
	}
	r := cp.run(runOpts{}, "release", "delete", "0.1.0", "--json")
	var rl operatorapi.ReleaseList
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rl) != nil || len(rl.Releases) != 1 || rl.Releases[0].Triple != x86Triple {
		t.Fatalf("delete the rest of the version: %+v", r)
	}
	if r := cp.run(runOpts{}, "release", "delete", "0.1.0"); r.code != cli.ExitError || !strings.Contains(r.stderr, "no release 0.1.0") {
		t.Fatalf("delete again: %+v", r)
	}
	if r := cp.run(runOpts{}, "release", "delete", "0.2.0", "--triple", arm); r.code != cli.ExitError {
		t.Fatalf("delete the target for another triple: %+v", r)
	}
	r = cp.run(runOpts{}, "release", "list", "--json")
	if json.Unmarshal([]byte(r.stdout), &rl) != nil || len(rl.Releases) != 1 || rl.Releases[0].Version != "0.2.0" {
		t.Fatalf("left: %+v", r)
	}
	// The deleted binary is no longer served.
	resp, err := http.Get(cp.url + "/v1/releases/0.1.0/" + x86Triple)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("download of a deleted release: %s", resp.Status)
	}
}
