package opclient_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/controlplane"
	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store/sqlite"
	"nymph/messages"
)

// realControlPlane runs a real control plane (SQLite in a temp dir) and
// returns a client for it; daemonPost speaks msgpack to it as a daemon.
func realControlPlane(t *testing.T) (*opclient.Client, func(path string, body, out any)) {
	t.Helper()
	hs := httptest.NewUnstartedServer(nil)
	dir := t.TempDir()
	db, err := sqlite.Open(context.Background(), filepath.Join(dir, "lakeshore.db"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := controlplane.New(context.Background(), controlplane.Config{
		DataDir: filepath.Join(dir, "data"), PublicURL: "http://" + hs.Listener.Addr().String(),
		AdminToken: token, DaemonToken: "daemon", Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
		Store: db, Payloads: controlplane.NewPayloadStore(filepath.Join(dir, "payloads")),
	})
	if err != nil {
		t.Fatal(err)
	}
	hs.Config.Handler = srv.Handler()
	hs.Start()
	t.Cleanup(func() {
		hs.Close()
		srv.Close()
	})
	c, err := opclient.New(hs.URL, token, opclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	post := func(path string, body, out any) {
		t.Helper()
		b, err := messages.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, hs.URL+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", messages.ContentType)
		req.Header.Set("Authorization", "Bearer daemon")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var raw bytes.Buffer
		raw.ReadFrom(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %s %q", path, resp.Status, raw.Bytes())
		}
		if out != nil {
			if err := messages.Unmarshal(raw.Bytes(), out); err != nil {
				t.Fatal(err)
			}
		}
	}
	return c, post
}

func TestInvocationCalls(t *testing.T) {
	c, post := realControlPlane(t)
	ctx := context.Background()

	data := bytes.Repeat([]byte{7}, 300<<10)
	ref, err := c.UploadPayload(ctx, data, "args")
	sum := sha256.Sum256(data)
	if err != nil || ref.Size != uint64(len(data)) || ref.SHA256 == nil || *ref.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("upload: %+v %v", ref, err)
	}
	back, err := c.DownloadPayload(ctx, ref.Key)
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("download: %d bytes, %v", len(back), err)
	}

	echo := "echo"
	sub, err := c.SubmitInvocation(ctx, operatorapi.InvocationRequest{Queue: "q", Function: "m:f",
		RunConfig: operatorapi.RunConfig{Runner: &echo}, ArgsKey: ref.Key})
	if err != nil || sub.Invocation.State != operatorapi.InvocationQueued || sub.Invocation.ArgsSize != int64(len(data)) {
		t.Fatalf("submit: %+v %v", sub, err)
	}
	if _, err := c.SubmitInvocation(ctx, operatorapi.InvocationRequest{Function: "m:f", ArgsKey: "nope"}); opclient.StatusOf(err) != http.StatusBadRequest {
		t.Fatalf("unknown args key: %v", err)
	}

	// A daemon takes it while WaitInvocation follows it.
	var seen atomic.Int32
	done := make(chan operatorapi.Invocation, 1)
	go func() {
		inv, err := c.WaitInvocation(ctx, sub.Invocation.ID, func(operatorapi.Invocation, error) { seen.Add(1) })
		if err != nil {
			t.Errorf("wait: %v", err)
		}
		done <- inv
	}()
	v, proto := "1", messages.ProtocolVersion
	var hr messages.HelloResponse
	post("/v1/daemon/hello", &messages.HelloRequest{MachineID: "m", Label: "l", Tags: []string{},
		Capabilities: messages.Capabilities{Runners: []string{"echo"}}, Versions: messages.Versions{Daemon: &v, Protocol: &proto}}, &hr)
	var pr messages.PollResponse
	post("/v1/daemon/poll", &messages.PollRequest{WorkerID: *hr.WorkerID, Queue: "q", Cursor: hr.Cursor, Invocations: []messages.InvocationStatus{}}, &pr)
	if len(pr.Commands) != 1 || pr.Commands[0].Kind != messages.KindRun {
		t.Fatalf("poll: %+v", pr)
	}
	post("/v1/daemon/ack", &messages.Ack{InvocationID: sub.Invocation.ID, State: messages.StateSucceeded, ResultBlob: messages.Bytes("ok")}, nil)
	select {
	case inv := <-done:
		if inv.State != operatorapi.InvocationSucceeded || string(inv.Result) != "ok" || seen.Load() < 1 {
			t.Fatalf("waited for %+v (%d reads)", inv, seen.Load())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("WaitInvocation did not return")
	}

	list, err := c.ListInvocations(ctx, opclient.InvocationFilter{State: operatorapi.InvocationSucceeded, Queue: "q", Limit: 5})
	if err != nil || len(list) != 1 || list[0].ID != sub.Invocation.ID {
		t.Fatalf("list: %+v %v", list, err)
	}
	queued, _ := c.SubmitInvocation(ctx, operatorapi.InvocationRequest{Queue: "idle", Function: "m:f"})
	res, err := c.CancelInvocation(ctx, queued.Invocation.ID)
	if err != nil || !res.Cancelled || res.Invocation.State != operatorapi.InvocationCancelled {
		t.Fatalf("cancel: %+v %v", res, err)
	}
	if _, err := c.CancelInvocation(ctx, queued.Invocation.ID); opclient.StatusOf(err) != http.StatusConflict {
		t.Fatalf("cancel twice: %v", err)
	}
	if _, err := c.GetInvocation(ctx, "nope", time.Second); !opclient.IsNotFound(err) {
		t.Fatalf("get unknown: %v", err)
	}
}
