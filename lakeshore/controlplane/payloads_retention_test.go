package controlplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// Retention deletes a payload once it outlived the job that holds it by
// the retention — args of a queued invocation are kept however old — and
// an upload no job holds once it is that old itself.
func TestPayloadRetentionDeletesWhatNoJobHolds(t *testing.T) {
	retention := 48 * time.Hour
	e := newEnv(t, func(c *Config) { c.PayloadRetention = retention })
	args := bytes.Repeat([]byte{7}, messages.InlineThreshold+1)
	sub := e.submit(operatorapi.InvocationRequest{Queue: "q", Function: "m:f", Args: args})
	argsKey := sub.Invocation.ArgsKey
	if argsKey == "" {
		t.Fatalf("large args not stored: %+v", sub.Invocation)
	}
	e.putPayload("loose", "text/plain", []byte("nobody holds me"))
	blob := func(key string) string { return filepath.Join(e.dir, "payloads", "default", key) }
	sweep := func(want int) {
		t.Helper()
		n, err := e.srv.sweepPayloads(context.Background())
		if err != nil || n != want {
			t.Fatalf("sweep deleted %d (%v), want %d", n, err, want)
		}
	}
	exists := func(key string) bool { _, err := os.Stat(blob(key)); return err == nil }

	sweep(0)
	e.clock.Advance(retention + time.Minute)
	sweep(1)
	if exists("loose") || !exists(argsKey) {
		t.Fatalf("after the retention: loose there %v, queued args there %v", exists("loose"), exists(argsKey))
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "get", "key": "loose"}); r.status != http.StatusNotFound {
		t.Fatalf("presign get of a deleted payload: %d %q", r.status, r.body)
	}
	// Cancelled now: its args outlive it by the retention, no less.
	if r := e.op(http.MethodPost, "/v1/namespaces/default/invocations/"+sub.Invocation.ID+"/cancel", nil); r.status != http.StatusOK {
		t.Fatalf("cancel: %d %q", r.status, r.body)
	}
	e.clock.Advance(retention - time.Minute)
	sweep(0)
	e.clock.Advance(2 * time.Minute)
	sweep(1)
	if exists(argsKey) {
		t.Fatal("the args of an invocation finished longer ago than the retention are still there")
	}
	sweep(0)
}

// A negative retention keeps every payload.
func TestPayloadRetentionOff(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.PayloadRetention = -1 })
	e.putPayload("kept", "", []byte("x"))
	e.clock.Advance(10 * 365 * 24 * time.Hour)
	if n, err := e.srv.sweepPayloads(context.Background()); err != nil || n != 0 {
		t.Fatalf("sweep with retention off: %d %v", n, err)
	}
	e.expectPayload("kept", "application/octet-stream", []byte("x"))
}

// A put presigned with a sha256 takes only the bytes that hash to it, and
// presigning a put of a key that exists is a conflict: a payload never
// changes under its key.
func TestPresignPutDeclaredChecksumAndExistingKey(t *testing.T) {
	e := newEnv(t)
	data := []byte("the declared bytes")
	sum := sha256.Sum256(data)
	r := e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{
		"op": "put", "key": "pinned", "size": len(data), "sha256": hex.EncodeToString(sum[:])})
	if r.status != http.StatusOK {
		t.Fatalf("presign put: %d %q", r.status, r.body)
	}
	ps := decodeJS[messages.PresignResponse](t, r)
	other := bytes.Repeat([]byte("x"), len(data))
	if r := doCtx(t, context.Background(), http.MethodPut, ps.URL, "", "", other); r.status != http.StatusBadRequest || errField(t, r) != "sha256" {
		t.Fatalf("PUT of other bytes: %d %q", r.status, r.body)
	}
	if r := doCtx(t, context.Background(), http.MethodPut, ps.URL, "", "", data); r.status != http.StatusOK {
		t.Fatalf("PUT of the declared bytes: %d %q", r.status, r.body)
	}
	e.expectPayload("pinned", "application/octet-stream", data)
	if r := e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "put", "key": "pinned", "size": 1}); r.status != http.StatusConflict || errField(t, r) != "key" {
		t.Fatalf("presign put of an existing key: %d %q", r.status, r.body)
	}
	for _, bad := range []map[string]any{
		{"op": "put", "sha256": "abc"},
		{"op": "put", "sha256": 7},
	} {
		if r := e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", bad); r.status != http.StatusBadRequest {
			t.Fatalf("presign %v: %d %q", bad, r.status, r.body)
		}
	}
}
