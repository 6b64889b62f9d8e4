package e2e

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/harness"
)

// The memory a hostile body costs a real `lakeshore serve`, read from
// /proc. Each case gets a control plane of its own, so what one request
// left in the heap cannot hide what the next one costs.

// hostileMiB is the size of the hostile bodies: a map whose one field is
// an array of that many million nils (one byte each), as in the report
// that a 30 MiB one grew the control plane by 551 MB.
const hostileMiB = 30

// rssAllowance is what the process may grow by beyond the ratio: the Go
// runtime maps heap and GC metadata for a new 30 MiB span, the HTTP
// server keeps per-connection buffers and goroutine stacks, SQLite its
// page cache, the logger its buffers. A small valid request is measured
// first in every case and logged beside it.
const rssAllowance = 16 << 20

// maxGrowthRatio is the target: no request grows RSS by more than 4x its
// size.
const maxGrowthRatio = 4

// procMem reads VmRSS and VmHWM (bytes) of pid.
func procMem(t *testing.T, pid int) (rss, hwm int64) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read /proc: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != "VmRSS" && name != "VmHWM" {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", name, val, err)
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	if rss == 0 {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	return rss, hwm
}

// growth measures what post costs the process pid in resident memory: the
// peak (VmHWM, reset to the current RSS first with clear_refs where the
// kernel lets us) or, failing that, the RSS after it, less the RSS before.
func growth(t *testing.T, pid int, post func()) (before, after int64, peak bool) {
	t.Helper()
	peak = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0) == nil
	before, _ = procMem(t, pid)
	post()
	rss, hwm := procMem(t, pid)
	if peak {
		return before, hwm, true
	}
	return before, rss, false
}

// daemonPost posts a msgpack body to a daemon route with the shared
// daemon token (when token is set) and returns the status, or the error
// of a post the server cut off before it read the body.
func daemonPost(client *http.Client, url, token string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", messages.ContentType)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, b, err
}

// rawMap is a msgpack map of the given keys and raw values, in order.
func rawMap(kv ...[]byte) []byte {
	b := []byte{0xdf, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(kv)/2))
	for _, x := range kv {
		b = append(b, x...)
	}
	return b
}

func rawStr(s string) []byte {
	b := []byte{0xdb, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(s)))
	return append(b, s...)
}

// nils is an array of n nils: n+5 bytes that declare n elements.
func nils(n int) []byte {
	b := []byte{0xdd, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(n))
	return append(b, bytes.Repeat([]byte{0xc0}, n)...)
}

// hostileWorld is a control plane with a worker (a hello with the shared
// daemon token) that holds a delivered exec (queued by the operator API,
// taken by a poll).
type hostileWorld struct {
	cp       *harness.ControlPlane
	client   *http.Client
	workerID string
	execID   string
}

func newHostileWorld(t *testing.T) *hostileWorld {
	t.Helper()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	w := &hostileWorld{cp: cp, client: &http.Client{Timeout: 2 * time.Minute}}
	v := func(s string) *string { return &s }
	hello, err := messages.Marshal(&messages.HelloRequest{MachineID: "m-" + strconv.Itoa(os.Getpid()), Label: "hostile",
		Tags: []string{}, Capabilities: messages.Capabilities{Runners: []string{"process"}},
		Versions: messages.Versions{Daemon: v("0.0.0"), Protocol: v(messages.ProtocolVersion)}})
	if err != nil {
		t.Fatal(err)
	}
	status, body, err := daemonPost(w.client, cp.URL+"/v1/daemon/hello", cp.DaemonToken, hello)
	if err != nil || status != http.StatusOK {
		t.Fatalf("hello: %d %v %q", status, err, body)
	}
	var hr messages.HelloResponse
	if err := messages.Unmarshal(body, &hr); err != nil || hr.WorkerID == nil {
		t.Fatalf("hello answer %q: %v", body, err)
	}
	w.workerID = *hr.WorkerID
	var acc operatorapi.ExecAccepted
	if err := cp.PostJSON("/v1/namespaces/default/workers/"+w.workerID+"/exec", operatorapi.ExecRequest{Command: "true"}, &acc); err != nil {
		t.Fatalf("queue an exec: %v", err)
	}
	w.execID = acc.ExecID
	poll, err := messages.Marshal(&messages.PollRequest{WorkerID: w.workerID, Cursor: hr.Cursor})
	if err != nil {
		t.Fatal(err)
	}
	status, body, err = daemonPost(w.client, cp.URL+"/v1/daemon/poll", cp.DaemonToken, poll)
	if err != nil || status != http.StatusOK {
		t.Fatalf("poll: %d %v %q", status, err, body)
	}
	var pr messages.PollResponse
	if err := messages.Unmarshal(body, &pr); err != nil {
		t.Fatal(err)
	}
	delivered := false
	for _, c := range pr.Commands {
		if e, ok := messages.DecodeCommand(c).(*messages.Exec); ok && e.ExecID == w.execID {
			delivered = true
		}
	}
	if !delivered {
		t.Fatalf("the poll did not deliver exec %s: %+v", w.execID, pr.Commands)
	}
	return w
}

// TestHostileBodiesGrowTheControlPlaneLittle posts the hostile shapes of
// issue 11 to a real `lakeshore serve`, with and without credentials, one
// control plane per case, and requires that none grows its resident
// memory by more than 4x the bytes posted (plus rssAllowance). The figures
// are logged: run it on another tree to compare.
func TestHostileBodiesGrowTheControlPlaneLittle(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc here")
	}
	n := hostileMiB << 20
	hostileResult := rawMap(rawStr("exit_code"), nils(n))
	resultOfCapSize := rawMap(rawStr("exit_code"), nils(2*messages.OutputCap+2*messages.InlineThreshold-64))
	type post struct {
		path, token string
		body        []byte
	}
	cases := []struct {
		name string
		// posts are made at once; each is refused (any 4xx, or a
		// connection the server closed rather than read a body over its
		// cap).
		posts func(w *hostileWorld) []post
	}{
		{"exec result, unknown exec, no credential", func(w *hostileWorld) []post {
			return []post{{"/v1/daemon/exec/" + strings.Repeat("0", 32) + "/result", "", hostileResult}}
		}},
		{"exec result, delivered exec, daemon bearer", func(w *hostileWorld) []post {
			return []post{{"/v1/daemon/exec/" + w.execID + "/result", w.cp.DaemonToken, hostileResult}}
		}},
		{"ack, result_blob of nils, daemon bearer", func(w *hostileWorld) []post {
			return []post{{"/v1/daemon/ack", w.cp.DaemonToken, rawMap(rawStr("invocation_id"), rawStr("i"), rawStr("state"), rawStr("failed"),
				rawStr("worker_id"), rawStr(w.workerID), rawStr("result_blob"), nils(n))}}
		}},
		{"ack, unknown key of nils, daemon bearer", func(w *hostileWorld) []post {
			return []post{{"/v1/daemon/ack", w.cp.DaemonToken, rawMap(rawStr("invocation_id"), rawStr("i"), rawStr("state"), rawStr("failed"),
				rawStr("worker_id"), rawStr(w.workerID), rawStr("exit_code"), nils(n))}}
		}},
		// Not hostile: a 30 MiB result as a daemon would post it, decoded
		// in full (the invocation is unknown, so nothing is stored).
		{"ack with a 30 MiB result blob, daemon bearer", func(w *hostileWorld) []post {
			blob := []byte{0xc6, 0, 0, 0, 0}
			binary.BigEndian.PutUint32(blob[1:], uint32(n))
			return []post{{"/v1/daemon/ack", w.cp.DaemonToken, rawMap(rawStr("invocation_id"), rawStr("i"), rawStr("state"), rawStr("succeeded"),
				rawStr("worker_id"), rawStr(w.workerID), rawStr("result_blob"), append(blob, bytes.Repeat([]byte("r"), n)...))}}
		}},
		{"event, daemon bearer", func(w *hostileWorld) []post {
			return []post{{"/v1/daemon/event", w.cp.DaemonToken, rawMap(rawStr("invocation_id"), rawStr("i"), rawStr("kind"), rawStr(messages.EventInvocationLog),
				rawStr("worker_id"), rawStr(w.workerID), rawStr("exit_code"), nils(n))}}
		}},
		{"event of 1 MiB, log data of nils, daemon bearer", func(w *hostileWorld) []post {
			return []post{{"/v1/daemon/event", w.cp.DaemonToken, rawMap(rawStr("invocation_id"), rawStr("i"), rawStr("kind"), rawStr(messages.EventInvocationLog),
				rawStr("worker_id"), rawStr(w.workerID),
				rawStr("data"), rawMap(rawStr("stream"), rawStr("stdout"), rawStr("seq"), []byte{1}, rawStr("data"), nils(messages.MaxLogPiece)))}}
		}},
		{"hello, daemon bearer", func(w *hostileWorld) []post {
			return []post{{"/v1/daemon/hello", w.cp.DaemonToken, rawMap(rawStr("machine_id"), rawStr("m"), rawStr("label"), rawStr("l"), rawStr("tags"), nils(n))}}
		}},
		{"hello of 240 KiB, tags of empty strings, daemon bearer", func(w *hostileWorld) []post {
			tags := nils(240 << 10)
			for i := 5; i < len(tags); i++ {
				tags[i] = 0xa0
			}
			return []post{{"/v1/daemon/hello", w.cp.DaemonToken, rawMap(rawStr("machine_id"), rawStr("m"), rawStr("label"), rawStr("l"), rawStr("tags"), tags,
				rawStr("capabilities"), rawMap(rawStr("runners"), nils(0)),
				rawStr("versions"), rawMap(rawStr("daemon"), rawStr("1"), rawStr("protocol"), rawStr("1")))}}
		}},
		// What an exec result may legitimately weigh (two capped outputs,
		// an inline result), so the body is read and scanned.
		{"exec result of 2.5 MiB, delivered exec, daemon bearer", func(w *hostileWorld) []post {
			return []post{{"/v1/daemon/exec/" + w.execID + "/result", w.cp.DaemonToken, resultOfCapSize}}
		}},
		{"four exec results at once, delivered exec, daemon bearer", func(w *hostileWorld) []post {
			p := post{"/v1/daemon/exec/" + w.execID + "/result", w.cp.DaemonToken, hostileResult}
			return []post{p, p, p, p}
		}},
		{"four exec results of 2.5 MiB at once, delivered exec, daemon bearer", func(w *hostileWorld) []post {
			p := post{"/v1/daemon/exec/" + w.execID + "/result", w.cp.DaemonToken, resultOfCapSize}
			return []post{p, p, p, p}
		}},
		{"four acks at once, daemon bearer", func(w *hostileWorld) []post {
			p := post{"/v1/daemon/ack", w.cp.DaemonToken, rawMap(rawStr("invocation_id"), rawStr("i"), rawStr("state"), rawStr("failed"),
				rawStr("worker_id"), rawStr(w.workerID), rawStr("result_blob"), nils(n))}
			return []post{p, p, p, p}
		}},
	}
	type figure struct {
		name          string
		bytes         int64
		small, before int64
		after         int64
		peak          bool
	}
	var figures []figure
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newHostileWorld(t)
			pid := w.cp.PID()
			// A valid, small request first: what any request costs.
			poll, err := messages.Marshal(&messages.PollRequest{WorkerID: w.workerID})
			if err != nil {
				t.Fatal(err)
			}
			sb, sa, _ := growth(t, pid, func() {
				if status, body, err := daemonPost(w.client, w.cp.URL+"/v1/daemon/poll", w.cp.DaemonToken, poll); err != nil || status != http.StatusOK {
					t.Fatalf("small poll: %d %v %q", status, err, body)
				}
			})
			posts := tc.posts(w)
			var total int64
			for _, p := range posts {
				total += int64(len(p.body))
			}
			before, after, peak := growth(t, pid, func() {
				var wg sync.WaitGroup
				for _, p := range posts {
					wg.Go(func() {
						status, body, err := daemonPost(w.client, w.cp.URL+p.path, p.token, p.body)
						switch {
						case err != nil && refusedUnread(err):
							t.Logf("%s: the server closed the connection rather than read the body: %v", p.path, err)
						case err != nil:
							t.Errorf("%s: %v", p.path, err)
						case status < 400 || status >= 500:
							t.Errorf("%s: %d %q", p.path, status, body)
						default:
							t.Logf("%s: %d %.200s", p.path, status, refusal(body))
						}
					})
				}
				wg.Wait()
			})
			f := figure{tc.name, total, sa - sb, before, after, peak}
			figures = append(figures, f)
			grew := after - before
			t.Logf("%d bytes posted: RSS %d MiB before, %s %d MiB after: grew %.1f MiB (%.2fx the body); a small poll grew it %.1f MiB",
				total, before>>20, map[bool]string{true: "peak", false: "RSS"}[peak], after>>20, float64(grew)/(1<<20),
				float64(grew)/float64(total), float64(f.small)/(1<<20))
			if limit := maxGrowthRatio*total + rssAllowance; grew > limit {
				t.Errorf("RSS grew by %d bytes for %d posted, over %d (%dx + %d MiB)", grew, total, limit, maxGrowthRatio, rssAllowance>>20)
			}
		})
	}
	t.Log("figures (RSS growth per case):")
	for _, f := range figures {
		t.Logf("  %-60s %7.1f MiB posted  %8.1f MiB grown  %6.2fx", f.name, float64(f.bytes)/(1<<20),
			float64(f.after-f.before)/(1<<20), float64(f.after-f.before)/float64(f.bytes))
	}
}

// refusedUnread reports whether a post failed because the server answered
// and closed the connection before it had written the body (a body over
// the route's cap is refused by its Content-Length, unread).
func refusedUnread(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || strings.Contains(err.Error(), "connection reset") ||
		strings.Contains(err.Error(), "broken pipe")
}

// refusal is the text of a daemon route's refusal, for the log.
func refusal(body []byte) string {
	var ve messages.ValidationError
	if messages.Unmarshal(body, &ve) == nil && ve.Error != "" {
		return ve.Field + ": " + ve.Error
	}
	return string(body)
}
