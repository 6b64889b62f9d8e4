package controlplane

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// serveDirEnv makes the test binary a control plane serving that data dir,
// so tests can SIGKILL a real server process.
const serveDirEnv = "CONTROLPLANE_TEST_SERVE_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(serveDirEnv); dir != "" {
		os.Exit(serveForTest(dir))
	}
	os.Exit(m.Run())
}

func serveForTest(dir string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv, err := newServer(ctx, Config{DataDir: dir, DaemonToken: testDaemon, Logger: zerolog.New(os.Stderr)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("ADDR %s\n", ln.Addr())
	if err := srv.Serve(ctx, ln); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := srv.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type child struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

func startChild(t *testing.T, dir string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveDirEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
				addr <- a
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() { c.kill() })
	select {
	case a := <-addr:
		c.url = "http://" + a
	case <-c.done:
		t.Fatal("control plane child exited before listening")
	case <-time.After(30 * time.Second):
		t.Fatal("control plane child did not start")
	}
	return c
}

func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

func TestSIGKILLLosesNothing(t *testing.T) {
	dir := t.TempDir()
	a := startChild(t, dir)
	adminBytes, err := os.ReadFile(filepath.Join(dir, adminTokenFile))
	if err != nil {
		t.Fatalf("admin token file: %v", err)
	}
	admin := strings.TrimSpace(string(adminBytes))
	if fi, _ := os.Stat(filepath.Join(dir, adminTokenFile)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin token file mode %v", fi.Mode().Perm())
	}
	ctx := context.Background()
	post := func(c *child, path string, body any) resp {
		return doCtx(t, ctx, http.MethodPost, c.url+path, messages.ContentType, testDaemon, mustMarshal(t, body))
	}
	opPost := func(c *child, path, body string) resp {
		return doCtx(t, ctx, http.MethodPost, c.url+path, "application/json", admin, []byte(body))
	}

	hr := decodeMP[messages.HelloResponse](t, post(a, "/v1/daemon/hello", helloReq("m", "l")))
	id := *hr.WorkerID
	base := "/v1/namespaces/default/workers/" + id
	done := decodeJS[operatorapi.ExecAccepted](t, opPost(a, base+"/exec", `{"command":"echo done"}`))
	zero := "0"
	p := decodeMP[messages.PollResponse](t, post(a, "/v1/daemon/poll", &messages.PollRequest{WorkerID: id, Cursor: &zero}))
	if len(p.Commands) != 1 {
		t.Fatalf("first poll %v", commandsOf(p))
	}
	doCtx(t, ctx, http.MethodPost, a.url+"/v1/daemon/exec/"+done.ExecID+"/chunk", "application/octet-stream", testDaemon, []byte("partial "))
	doCtx(t, ctx, http.MethodPost, a.url+"/v1/daemon/exec/"+done.ExecID+"/result", messages.ContentType, testDaemon,
		mustMarshal(t, &messages.ExecResult{ExitCode: 7, Stdout: "done\n"}))
	// Queued but never delivered, then delivered but never acknowledged.
	queued := decodeJS[operatorapi.ExecAccepted](t, opPost(a, base+"/exec", `{"command":"echo later"}`))
	opPost(a, base+"/setup", `{"script":"true"}`)
	p = decodeMP[messages.PollResponse](t, post(a, "/v1/daemon/poll", &messages.PollRequest{WorkerID: id, Cursor: p.Cursor}))
	if got := commandsOf(p); len(got) != 2 {
		t.Fatalf("second poll %v", got)
	}
	cursorBefore := p.Cursor

	a.kill()
	b := startChild(t, dir)

	// The admin token survived, and so did the worker, its queue and results.
	r := doCtx(t, ctx, http.MethodGet, b.url+"/v1/namespaces/default/execs/"+done.ExecID, "", admin, nil)
	if r.status != http.StatusOK {
		t.Fatalf("finished exec after restart: %d %q", r.status, r.body)
	}
	ex := decodeJS[operatorapi.Exec](t, r)
	if ex.State != operatorapi.ExecFinished || ex.Result == nil || ex.Result.ExitCode != 7 || string(ex.Output) != "partial " {
		t.Fatalf("exec after restart %+v", ex)
	}
	// The daemon re-polls with the cursor it had before the answer it never
	// acknowledged: both commands come again, nothing is lost.
	prev := "1"
	p = decodeMP[messages.PollResponse](t, post(b, "/v1/daemon/poll", &messages.PollRequest{WorkerID: id, Cursor: &prev}))
	if got := commandsOf(p); len(got) != 2 || got[0] != "exec" || got[1] != "setup" || *p.Cursor != *cursorBefore {
		t.Fatalf("after restart %v cursor %v", got, p.Cursor)
	}
	if e := messages.DecodeCommand(p.Commands[0]).(*messages.Exec); e.ExecID != queued.ExecID {
		t.Fatalf("redelivered exec %s, want %s", e.ExecID, queued.ExecID)
	}
	// A daemon that re-says hello resumes from the last acknowledged cursor.
	hr = decodeMP[messages.HelloResponse](t, post(b, "/v1/daemon/hello", helloReq("m", "l")))
	if *hr.WorkerID != id || *hr.Cursor != "1" {
		t.Fatalf("hello after restart: %s cursor %s", *hr.WorkerID, *hr.Cursor)
	}

	if rss, err := idleRSS(b.cmd.Process.Pid); err == nil {
		t.Logf("idle RSS of the restarted control plane (test binary%s): %.1f MiB", raceNote(), float64(rss)/(1<<20))
	}
	// SIGTERM is a clean stop.
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
		if code := b.cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("exit code after SIGTERM: %d", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
}

// idleRSS reads VmRSS of a process, in bytes.
func idleRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}

func TestServeShutsDownGracefully(t *testing.T) {
	dir := t.TempDir()
	srv, err := newServer(context.Background(), Config{DataDir: dir, AdminToken: testAdmin, DaemonToken: testDaemon, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	parked := make(chan string, 8)
	srv.parked = func(k string) { parked <- k }
	addr, cancel, served := serveLoopback(t, srv)
	url := "http://" + addr
	hr := decodeMP[messages.HelloResponse](t, doCtx(t, context.Background(), http.MethodPost, url+"/v1/daemon/hello", messages.ContentType, testDaemon, mustMarshal(t, helloReq("m", "l"))))
	polled := make(chan resp, 1)
	go func() {
		polled <- doCtx(t, context.Background(), http.MethodPost, url+"/v1/daemon/poll", messages.ContentType, testDaemon,
			mustMarshal(t, &messages.PollRequest{WorkerID: *hr.WorkerID, Cursor: hr.Cursor, TimeoutS: 20}))
	}()
	<-parked
	cancel()
	select {
	case r := <-polled:
		if r.status != http.StatusOK {
			t.Fatalf("parked poll at shutdown: %d", r.status)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("a parked poll held up shutdown")
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return")
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	// The public URL came from the listener, since none was configured.
	if got := srv.currentPublicURL(""); got != url {
		t.Fatalf("derived public URL %q, want %q", got, url)
	}
}

func TestAdminToken(t *testing.T) {
	dir := t.TempDir()
	log := zerolog.New(zerolog.NewTestWriter(t))
	first, err := newServer(context.Background(), Config{DataDir: dir, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if !first.AdminTokenCreated() || !strings.HasPrefix(first.AdminToken(), "lsa_") || len(first.AdminToken()) < 40 {
		t.Fatalf("generated token %q created=%v", first.AdminToken(), first.AdminTokenCreated())
	}
	first.Close()
	second, err := newServer(context.Background(), Config{DataDir: dir, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if second.AdminTokenCreated() || second.AdminToken() != first.AdminToken() {
		t.Fatalf("second start: %q created=%v", second.AdminToken(), second.AdminTokenCreated())
	}
	second.Close()

	other := t.TempDir()
	given, err := newServer(context.Background(), Config{DataDir: other, AdminToken: "from-env", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer given.Close()
	if given.AdminToken() != "from-env" || given.AdminTokenCreated() {
		t.Fatalf("given token: %q", given.AdminToken())
	}
	if _, err := os.Stat(filepath.Join(other, adminTokenFile)); !os.IsNotExist(err) {
		t.Fatalf("a given token must not be written: %v", err)
	}
	if _, err := newServer(context.Background(), Config{Logger: log}); err == nil {
		t.Fatal("New without a data dir must fail")
	}
}
