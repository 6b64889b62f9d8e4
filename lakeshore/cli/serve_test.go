package cli_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/servecli"
	"nymph/messages"
)

// lineSignal closes ch the first time a write contains needle.
type lineSignal struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	needle string
	ch     chan struct{}
	once   sync.Once
}

func (l *lineSignal) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if strings.Contains(l.buf.String(), l.needle) {
		l.once.Do(func() { close(l.ch) })
	}
	return len(p), nil
}

// miniDaemon speaks just enough of the daemon protocol to register and
// answer one streamed exec: two chunks, then exit code 3.
type miniDaemon struct {
	t        *testing.T
	url      string
	token    string
	workerID string
}

func (l *lineSignal) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (d *miniDaemon) post(path string, body any, out any) {
	d.t.Helper()
	b, err := messages.Marshal(body)
	if err != nil {
		d.t.Fatal(err)
	}
	d.postRaw(path, messages.ContentType, b, out)
}

func (d *miniDaemon) postRaw(url, ctype string, b []byte, out any) {
	d.t.Helper()
	if !strings.HasPrefix(url, "http") {
		url = d.url + url
	}
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		d.t.Fatalf("POST %s: %s %q", url, resp.Status, raw)
	}
	if out != nil {
		if err := messages.Unmarshal(raw, out); err != nil {
			d.t.Fatalf("POST %s: %v", url, err)
		}
	}
}

func (d *miniDaemon) hello(label string) {
	v, proto := "0.0.0-test", messages.ProtocolVersion
	var resp messages.HelloResponse
	d.post("/v1/daemon/hello", messages.HelloRequest{
		MachineID: "host-" + label, Label: label, Tags: []string{"env=test"},
		Capabilities: messages.Capabilities{Runners: []string{"process"}},
		Versions:     messages.Versions{Daemon: &v, Protocol: &proto},
	}, &resp)
	if resp.Reject != nil || resp.WorkerID == nil {
		d.t.Fatalf("hello refused: %+v", resp)
	}
	d.workerID = *resp.WorkerID
}

// serveOneExec long-polls until an exec arrives and answers it.
func (d *miniDaemon) serveOneExec(done chan<- error) {
	var cursor *string
	for {
		var resp messages.PollResponse
		d.post("/v1/daemon/poll", messages.PollRequest{WorkerID: d.workerID, TimeoutS: 20, Cursor: cursor}, &resp)
		cursor = resp.Cursor
		for _, c := range resp.Commands {
			ex, ok := messages.DecodeCommand(c).(*messages.Exec)
			if !ok {
				continue
			}
			if ex.Log == nil {
				done <- fmt.Errorf("exec %s asked for no stream", ex.ExecID)
				return
			}
			d.postRaw(ex.Log.StdoutURL, "application/octet-stream", []byte("tick 1\n"), nil)
			d.postRaw(ex.Log.StdoutURL, "application/octet-stream", []byte("tick 2\n"), nil)
			d.post("/v1/daemon/exec/"+ex.ExecID+"/result", messages.ExecResult{ExitCode: 3, DurationMs: 5}, nil)
			done <- nil
			return
		}
	}
}

func TestServeEndToEnd(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "credentials.json")
	env := map[string]string{
		cli.EnvCredentials: creds,
		cli.EnvDaemonToken: "shared-daemon-token",
		"HOME":             dir,
	}
	ready, stop := startServe(t, env, "--data", filepath.Join(dir, "data"), "--log-format", "json")

	st, err := os.Stat(creds)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v %v", st, err)
	}
	c, err := cli.ReadCredentials(creds)
	if err != nil || c.AdminToken == "" || !strings.HasPrefix(c.URL, "http://127.0.0.1:") {
		t.Fatalf("credentials = %+v, %v", c, err)
	}
	if !strings.Contains(ready.text(), c.AdminToken) {
		t.Fatal("the generated token printed is not the one saved")
	}

	// No URL, no token: the credentials file is enough.
	r := runCLI(t, runOpts{}, env, "daemon", "list", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"workers": []`) {
		t.Fatalf("list: %+v", r)
	}

	d := &miniDaemon{t: t, url: c.URL, token: "shared-daemon-token"}
	d.hello("mini")
	execDone := make(chan error, 1)
	go d.serveOneExec(execDone)

	r = runCLI(t, runOpts{}, env, "daemon", "exec", "mini", "echo", "hi")
	if r.code != 3 || r.stdout != "tick 1\ntick 2\n" {
		t.Fatalf("exec: %+v", r)
	}
	if err := <-execDone; err != nil {
		t.Fatal(err)
	}

	r = runCLI(t, runOpts{}, env, "daemon", "show", "mini", "--json")
	var w operatorapi.Worker
	if err := json.Unmarshal([]byte(r.stdout), &w); err != nil || w.ID != d.workerID || w.Label != "mini" {
		t.Fatalf("show: %v %+v", err, r)
	}

	r = runCLI(t, runOpts{}, env, "daemon", "hibernate", "mini", "--until", "2020-01-01T00:00:00Z")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "HTTP 400") {
		t.Fatalf("past hibernate: %+v", r)
	}
	r = runCLI(t, runOpts{}, env, "daemon", "cleanup", "--older-than", "0", "--yes")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "HTTP 400") {
		t.Fatalf("cleanup 0: %+v", r)
	}

	stop()
}

// A --lost-after that is not a duration, not positive, or shorter than the
// stale window is a usage error that names the flag, before anything
// starts.
func TestServeRefusesABadLostAfter(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{cli.EnvCredentials: filepath.Join(dir, "c.json"), "HOME": dir}
	for _, tc := range []struct{ args, want []string }{
		{[]string{"--lost-after", "soon"}, []string{`--lost-after "soon": want a duration`}},
		{[]string{"--lost-after", "0s"}, []string{"--lost-after 0s: must be a positive duration"}},
		{[]string{"--lost-after", "-5m"}, []string{"--lost-after -5m0s: must be a positive duration"}},
		{[]string{"--lost-after", "30s"}, []string{"--lost-after 30s: must be at least 1m0s", "reads back stale"}},
		{[]string{"--stale-after", "2m", "--lost-after", "90s"}, []string{"--lost-after 1m30s: must be at least 2m0s"}},
	} {
		expectServeUsageError(t, dir, env, tc.args, tc.want)
	}
}

// A --procs that is neither auto nor a positive count is a usage error
// naming the flag, before anything starts.
func TestServeRefusesABadProcs(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{cli.EnvCredentials: filepath.Join(dir, "c.json"), "HOME": dir}
	for _, v := range []string{"0", "-2", "many"} {
		expectServeUsageError(t, dir, env, []string{"--procs", v}, []string{`--procs "` + v + `": want auto or a number of processors`})
	}
}

// The slow-client limits and the connection cap are checked before
// anything starts, and a bad one is a usage error naming its flag.
func TestServeRefusesBadEdgeLimits(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{cli.EnvCredentials: filepath.Join(dir, "c.json"), "HOME": dir}
	for _, tc := range []struct{ args, want []string }{
		{[]string{"--header-timeout", "0s"}, []string{"--header-timeout 0s: must be a positive duration"}},
		{[]string{"--body-grace", "-1s"}, []string{"--body-grace -1s: must be a positive duration"}},
		{[]string{"--upload-timeout", "0s"}, []string{"--upload-timeout 0s: must be a positive duration"}},
		{[]string{"--write-timeout", "0s"}, []string{"--write-timeout 0s"}},
		{[]string{"--body-min-rate", "0"}, []string{"--body-min-rate 0: must be a positive number of bytes per second"}},
		{[]string{"--max-conns-per-ip", "-1"}, []string{"--max-conns-per-ip -1: must be 0 (no cap) or more"}},
		{[]string{"--body-timeout", "soon"}, []string{`--body-timeout "soon": want a duration`}},
	} {
		expectServeUsageError(t, dir, env, tc.args, tc.want)
	}
}

// A serve on an address something already listens on (a second make run)
// says so and how to get past it, and stops before it opens a store or
// writes the credentials file the running one wrote.
func TestServeRefusesABusyAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	creds := filepath.Join(dir, "c.json")
	env := map[string]string{cli.EnvCredentials: creds, "HOME": dir}
	r := runCLI(t, runOpts{}, env, "serve", "--addr", ln.Addr().String(), "--data", filepath.Join(dir, "data"))
	if r.code == 0 {
		t.Fatalf("serve on a busy address: %+v", r)
	}
	for _, w := range []string{"listen on " + ln.Addr().String(), "something is already listening there", "another --addr"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr %q does not say %q", r.stderr, w)
		}
	}
	for _, f := range []string{filepath.Join(dir, "data", "lakeshore.db"), creds} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was written before the refusal (%v)", f, err)
		}
	}
}

// A --metrics-addr that cannot be bound stops serve, naming the flag,
// before it opens a store.
func TestServeRefusesABadMetricsAddr(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, addr := range []string{ln.Addr().String(), "not-a-host-port"} {
		dir := t.TempDir()
		env := map[string]string{cli.EnvCredentials: filepath.Join(dir, "c.json"), "HOME": dir}
		r := runCLI(t, runOpts{}, env, "serve", "--addr", "127.0.0.1:0", "--metrics-addr", addr, "--data", filepath.Join(dir, "data"))
		if r.code == 0 || !strings.Contains(r.stderr, "--metrics-addr "+addr+": cannot listen there") {
			t.Errorf("serve --metrics-addr %s: %+v", addr, r)
		}
		if _, err := os.Stat(filepath.Join(dir, "data", "lakeshore.db")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the store was opened before the refusal (%v)", err)
		}
	}
}

// $LAKESHORE_METRICS_TOKEN serves /metrics on the main listener to that
// bearer alone (the admin token too).
func TestServeMetricsToken(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "credentials.json")
	env := map[string]string{cli.EnvCredentials: creds, servecli.EnvMetricsToken: "scrape-me", "HOME": dir}
	_, stop := startServe(t, env, "--data", filepath.Join(dir, "data"))
	defer stop()
	c, err := cli.ReadCredentials(creds)
	if err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]int{"scrape-me": http.StatusOK, c.AdminToken: http.StatusOK, "": http.StatusUnauthorized, "nope": http.StatusUnauthorized} {
		req, _ := http.NewRequest(http.MethodGet, c.URL+"/metrics", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || want == http.StatusOK && !strings.Contains(string(body), "lakeshore_build_info{") {
			t.Errorf("bearer %q: %d %.200q, want %d", tok, resp.StatusCode, body, want)
		}
	}
}

// expectServeUsageError runs serve with args and wants a usage error
// saying each of want, with no store opened before it.
func expectServeUsageError(t *testing.T, dir string, env map[string]string, args, want []string) {
	t.Helper()
	r := runCLI(t, runOpts{}, env, append([]string{"serve", "--addr", "127.0.0.1:0", "--data", filepath.Join(dir, "data")}, args...)...)
	if r.code != cli.ExitUsage {
		t.Fatalf("%v: %+v", args, r)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Fatalf("%v: stderr %q does not say %q", args, r.stderr, w)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "lakeshore.db")); err == nil {
		t.Fatalf("%v: a store was opened before the refusal", args)
	}
}
