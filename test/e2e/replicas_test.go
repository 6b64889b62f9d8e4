package e2e

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
	"nymph/test/realparts"
	"nymph/test/wait"
)

// startReplica starts a second `lakeshore serve` on the same PostgreSQL as
// primary, with primary's admin and daemon tokens, and returns it as a
// ControlPlane whose CLI and HTTP helpers talk to it. The harness gives
// every control plane it starts fresh tokens, so the replica is started
// here, with the primary's environment.
func startReplica(t testing.TB, primary *harness.ControlPlane, dsn string) (*harness.ControlPlane, func()) {
	t.Helper()
	addr := harness.FreeAddr(t)
	rep := &harness.ControlPlane{
		Bins: primary.Bins, Addr: addr, URL: "http://" + addr, DataDir: t.TempDir(),
		AdminToken: primary.AdminToken, DaemonToken: primary.DaemonToken, HTTP: http.DefaultClient,
	}
	rep.Env = append(append([]string{}, primary.Env...),
		"LAKESHORE_URL="+rep.URL,
		"LAKESHORE_CREDENTIALS="+filepath.Join(t.TempDir(), "credentials.json"))
	cmd := exec.Command(rep.Bins.Lakeshore, "serve", "--addr", addr, "--data", rep.DataDir, "--public-url", rep.URL, "--store", dsn)
	cmd.Env = rep.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logPath := filepath.Join(t.TempDir(), "replica.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the replica: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	kill := func() { harness.KillGroup(cmd.Process.Pid, done) }
	t.Cleanup(kill)
	wait.For(t, 30*time.Second, "the replica to answer", func() bool {
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("the replica exited early:\n%s", b)
		default:
		}
		var list operatorapi.WorkerList
		return rep.GetJSON("/v1/namespaces/default/workers", &list) == nil
	})
	return rep, kill
}

// switchProxy stands in for the load balancer in front of the replicas:
// it forwards to one of them, and a test can move it to another.
type switchProxy struct {
	URL     string
	target  atomic.Pointer[url.URL]
	inPoll  atomic.Int64 // polls forwarded and not answered yet
	pollErr atomic.Int64 // polls that found no replica behind the proxy
}

func startSwitchProxy(t *testing.T, target string) *switchProxy {
	t.Helper()
	p := &switchProxy{}
	p.switchTo(t, target)
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(p.target.Load()) },
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, _ error) {
			if r.URL.Path == "/v1/daemon/poll" {
				p.pollErr.Add(1)
			}
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/daemon/poll" {
			p.inPoll.Add(1)
			defer p.inPoll.Add(-1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *switchProxy) switchTo(t *testing.T, target string) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p.target.Store(u)
}

// execThrough runs `daemon exec LABEL true` through cp and returns how long
// it took.
func execThrough(t *testing.T, cp *harness.ControlPlane, label string) time.Duration {
	t.Helper()
	start := time.Now()
	r := cp.CLI(t, "daemon", "exec", label, "echo", "via", cp.Addr)
	took := time.Since(start)
	expectCode(t, r, 0)
	if r.Stdout != "via "+cp.Addr+"\n" {
		t.Fatalf("exec through %s printed %q", cp.Addr, r.Stdout)
	}
	return took
}

// TestReplicasShareOnePostgres runs two control planes on one PostgreSQL: a
// daemon long-polls replica A while operators work through replica B, and
// when A dies the daemon fails over to B.
//
// The time bounds here are proofs of the cross-replica wake-up, not
// performance assertions. The daemon's poll parked on A returns early only
// when something wakes it; without the LISTEN/NOTIFY between replicas, an
// exec queued through B would sit until that poll's 20 s timeout
// (wait_max_s), and the CLI's wait for the result at B would run to its own
// 20 s cap, since the result is posted to A. An exec normally takes about a
// tenth of a second end to end, so the 10 s bound leaves a slow machine
// plenty of room while a missing wake-up cannot pass it; and each exec is
// issued while the daemon's poll is in flight at A.
func TestReplicasShareOnePostgres(t *testing.T) {
	t.Parallel()
	pg := realparts.StartPostgres(t)
	a := harness.StartControlPlane(t, harness.CPOptions{Args: []string{"--store", pg.DSN}})
	b, _ := startReplica(t, a, pg.DSN)
	proxy := startSwitchProxy(t, a.URL)
	d := a.StartDaemon(t, harness.DaemonOptions{Label: "shared", ServerURL: proxy.URL})
	if ws := b.Workers(t); len(ws) != 1 || ws[0].Label != "shared" {
		t.Fatalf("replica B does not see the daemon registered on A: %+v", ws)
	}

	const bound = 10 * time.Second
	for i := range 3 {
		wait.For(t, 30*time.Second, "the daemon's poll to be in flight at A", func() bool { return proxy.inPoll.Load() > 0 })
		if took := execThrough(t, b, "shared"); took > bound {
			t.Fatalf("exec %d through B took %v: the poll parked on A was not woken", i, took)
		} else {
			t.Logf("exec %d through B while the daemon polls A: %v", i, took)
		}
	}

	// An invocation submitted through B is claimed by the daemon polling A,
	// and its result reaches the `run` waiting on B.
	wait.For(t, 30*time.Second, "the daemon's poll to be in flight at A", func() bool { return proxy.inPoll.Load() > 0 })
	start := time.Now()
	r := b.CLI(t, "run", "--runner", "echo", "--args-json", `["through", "b"]`, "m:f")
	expectCode(t, r, 0)
	if took := time.Since(start); took > bound || !strings.Contains(r.Stdout, "through") {
		t.Fatalf("run through B took %v and printed %q", took, r.Stdout)
	}

	// A dies: the daemon's polls fail, and keep failing, while the proxy
	// still points at A.
	failed := proxy.pollErr.Load()
	a.Kill()
	wait.For(t, 30*time.Second, "the daemon's polls to fail with A gone", func() bool { return proxy.pollErr.Load() >= failed+2 })

	// The proxy fails over to B; the daemon's next poll reaches it, and B
	// serves it from the shared state without a new registration.
	proxy.switchTo(t, b.URL)
	if took := execThrough(t, b, "shared"); took > bound {
		t.Fatalf("exec through B after the failover took %v", took)
	}
	if ws := b.Workers(t); len(ws) != 1 || ws[0].Label != "shared" || ws[0].State != operatorapi.StateActive {
		t.Fatalf("after the failover: %+v", ws)
	}
	select {
	case <-d.Done():
		t.Fatalf("the daemon exited during the failover:\n%s", d.Log())
	default:
	}
}

// TestReplicaStoreFlagRefusesUnknownStores: a --store that is neither
// sqlite nor a postgres:// URL is a usage error naming the flag, and the
// URL's password never reaches the message.
func TestReplicaStoreFlagRefusesUnknownStores(t *testing.T) {
	t.Parallel()
	bins := harness.Binaries(t)
	for _, tc := range []struct {
		store string
		code  int
		want  string
	}{
		{"mysql://root:hunter2@db/x", 2, `--store "mysql://root:xxxxx@db/x": want sqlite or a postgres:// URL`},
		{"postgres://root:hunter2@127.0.0.1:1/x", 1, "--store: open PostgreSQL at postgres://root:xxxxx@127.0.0.1:1/x"},
	} {
		cmd := exec.Command(bins.Lakeshore, "serve", "--addr", "127.0.0.1:0", "--data", t.TempDir(), "--no-credentials", "--store", tc.store)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "LAKESHORE_ADMIN_TOKEN=x")
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != tc.code || !strings.Contains(string(out), tc.want) || strings.Contains(string(out), "hunter2") {
			t.Fatalf("--store %s: exit %d, want %d with %q:\n%s", tc.store, code, tc.code, tc.want, out)
		}
	}
}

// BenchmarkReplicaExecRoundTrip is one exec's round trip through the
// operator API — queue, the parked poll woken, `true` run, the result
// posted, the waiting GET woken — on the embedded SQLite store, on
// PostgreSQL through the replica the daemon polls, and on PostgreSQL
// through the other replica (both wake-ups cross over LISTEN/NOTIFY).
func BenchmarkReplicaExecRoundTrip(b *testing.B) {
	run := func(b *testing.B, via *harness.ControlPlane, workerID string) {
		for b.Loop() {
			var acc operatorapi.ExecAccepted
			if err := via.PostJSON("/v1/namespaces/default/workers/"+workerID+"/exec", operatorapi.ExecRequest{Command: "true"}, &acc); err != nil {
				b.Fatal(err)
			}
			for {
				var ex operatorapi.Exec
				if err := via.GetJSON("/v1/namespaces/default/execs/"+acc.ExecID+"?wait=20", &ex); err != nil {
					b.Fatal(err)
				}
				if ex.State == operatorapi.ExecFinished {
					break
				}
			}
		}
	}
	b.Run("sqlite", func(b *testing.B) {
		cp := harness.StartControlPlane(b, harness.CPOptions{})
		cp.StartDaemon(b, harness.DaemonOptions{Label: "bench"})
		run(b, cp, cp.WaitForWorker(b, "bench").ID)
	})
	pg := realparts.StartPostgres(b)
	a := harness.StartControlPlane(b, harness.CPOptions{Args: []string{"--store", pg.DSN}})
	a.StartDaemon(b, harness.DaemonOptions{Label: "bench"})
	id := a.WaitForWorker(b, "bench").ID
	b.Run("postgres-same-replica", func(b *testing.B) { run(b, a, id) })
	other, _ := startReplica(b, a, pg.DSN)
	b.Run("postgres-other-replica", func(b *testing.B) { run(b, other, id) })
}
