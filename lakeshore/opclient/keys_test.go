package opclient_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

// TestKeysOverTLSWithPrivateCA drives RotateKey and RevokeKey against an
// HTTPS server whose certificate only the CA file vouches for.
func TestKeysOverTLSWithPrivateCA(t *testing.T) {
	var seen []string
	mux := http.NewServeMux()
	mux.HandleFunc(operatorapi.RouteRotateKey, func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.URL.Path)
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(operatorapi.Queued{CommandID: "c1", WorkerID: r.PathValue("id"), Kind: "rotate_key"})
	})
	mux.HandleFunc(operatorapi.RouteRevokeKey, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req operatorapi.RevokeKeyRequest
		if err := json.Unmarshal(b, &req); err != nil {
			t.Errorf("revoke body %q: %v", b, err)
		}
		seen = append(seen, r.URL.Path+" "+req.KeyID)
		now := time.Now().UTC()
		_ = json.NewEncoder(w).Encode(operatorapi.RevokeKeyResponse{WorkerID: r.PathValue("id"), Key: operatorapi.KeyInfo{KeyID: "k_1", RevokedAt: &now}})
	})
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	plain, err := opclient.New(srv.URL, token, opclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.RotateKey(ctx, "w1"); !opclient.IsTransport(err) {
		t.Fatalf("without the CA: %v", err)
	}

	hc, err := opclient.HTTPClientWithCA(caFile)
	if err != nil {
		t.Fatal(err)
	}
	c, err := opclient.New(srv.URL, token, opclient.Options{Namespace: "lab", HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	q, err := c.RotateKey(ctx, "w1")
	if err != nil || q.Kind != "rotate_key" || q.WorkerID != "w1" {
		t.Fatalf("rotate: %+v %v", q, err)
	}
	rv, err := c.RevokeKey(ctx, "w1", "k_1")
	if err != nil || rv.Key.KeyID != "k_1" || rv.Key.RevokedAt == nil {
		t.Fatalf("revoke: %+v %v", rv, err)
	}
	if _, err := c.RevokeKey(ctx, "", ""); err == nil {
		t.Fatal("empty worker id accepted")
	}
	want := []string{"/v1/namespaces/lab/workers/w1/rotate-key", "/v1/namespaces/lab/workers/w1/revoke-key k_1"}
	if len(seen) != 2 || seen[0] != want[0] || seen[1] != want[1] {
		t.Fatalf("requests %q", seen)
	}

	for name, content := range map[string]string{"empty.pem": "", "junk.pem": "not a certificate"} {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := opclient.HTTPClientWithCA(p); err == nil {
			t.Errorf("%s accepted as a CA file", name)
		}
	}
	if _, err := opclient.HTTPClientWithCA(filepath.Join(t.TempDir(), "missing.pem")); err == nil {
		t.Error("a missing CA file accepted")
	}
}
