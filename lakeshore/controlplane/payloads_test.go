package controlplane

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"nymph/messages"
)

// putPayload stores data under key through a presigned put.
func (e *env) putPayload(key, ctype string, data []byte) {
	e.t.Helper()
	r := doCtx(e.t, context.Background(), http.MethodPut, e.url+e.presignPut(key, len(data)), ctype, "", data)
	if r.status != http.StatusOK {
		e.t.Fatalf("put %s: %d %q", key, r.status, r.body)
	}
}

// getPayload downloads key through a presigned get.
func (e *env) getPayload(key string) resp {
	e.t.Helper()
	r := e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "get", "key": key})
	if r.status != http.StatusOK {
		e.t.Fatalf("presign get %s: %d %q", key, r.status, r.body)
	}
	ps := decodeJS[messages.PresignResponse](e.t, r)
	return doCtx(e.t, context.Background(), http.MethodGet, ps.URL, "", "", nil)
}

// expectPayload checks that key reads back as data, with its checksum and
// content type.
func (e *env) expectPayload(key, ctype string, data []byte) {
	e.t.Helper()
	r := e.getPayload(key)
	if r.status != http.StatusOK || string(r.body) != string(data) {
		e.t.Fatalf("payload %s: %d %q, want %q", key, r.status, r.body, data)
	}
	if got := r.header.Get("X-Checksum-Sha256"); got != sha(data) {
		e.t.Fatalf("payload %s: checksum %s, want %s", key, got, sha(data))
	}
	if got := r.header.Get("Content-Type"); got != ctype {
		e.t.Fatalf("payload %s: content type %q, want %q", key, got, ctype)
	}
}

// Key "victim.meta.json" was the sidecar file of key "victim": storing it
// overwrote victim's metadata. Now it is a key like any other, even with
// content that is victim's metadata to the byte, and stays one across a
// restart (which looks for metadata of the old layout).
func TestPayloadKeyCannotNameAnotherKeysMetadata(t *testing.T) {
	dir := t.TempDir()
	e := newEnvIn(t, dir)
	victim := []byte("the real args")
	e.putPayload("victim", "application/x-victim", victim)
	forged, _ := json.Marshal(payloadMeta{Size: int64(len(victim)), SHA256: sha(victim), ContentType: "text/forged", CreatedAt: time.Now()})
	e.putPayload("victim.meta.json", "application/json", forged)
	evil, _ := json.Marshal(payloadMeta{Size: 1, SHA256: strings.Repeat("0", 64), ContentType: "text/evil"})
	e.putPayload("victim.meta.json.meta.json", "application/json", evil)

	check := func(e *env) {
		t.Helper()
		e.expectPayload("victim", "application/x-victim", victim)
		e.expectPayload("victim.meta.json", "application/json", forged)
		e.expectPayload("victim.meta.json.meta.json", "application/json", evil)
	}
	check(e)
	e.srv.Close()
	check(newEnvIn(t, dir))
}

// A data dir of the old layout is moved to the new one on start: legacy
// sidecars that describe their blob become its metadata, a blob whose
// sidecar the key clash overwrote gets metadata made from its bytes, a
// clashing key that was a blob stays one, and a second start changes
// nothing.
func TestLegacyPayloadDirIsMigrated(t *testing.T) {
	dir := t.TempDir()
	ns := filepath.Join(dir, "payloads", "default")
	writeLegacy := func(name string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(ns, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ns, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	legacyMeta := func(data []byte, ctype string) []byte {
		b, _ := json.Marshal(payloadMeta{Size: int64(len(data)), SHA256: sha(data), ContentType: ctype, CreatedAt: time.Now().UTC()})
		return b
	}
	plain := []byte("plain args")
	writeLegacy("plain", plain)
	writeLegacy("plain.meta.json", legacyMeta(plain, "text/plain"))
	// The clash as the old code left it: victim's sidecar overwritten by
	// the blob of key victim.meta.json, whose own sidecar is beside it.
	victim := []byte("victim args")
	clash := []byte(`{"size":1,"sha256":"` + strings.Repeat("0", 64) + `","content_type":"text/evil"}`)
	writeLegacy("victim", victim)
	writeLegacy("victim.meta.json", clash)
	writeLegacy("victim.meta.json.meta.json", legacyMeta(clash, "application/json"))
	// A sidecar whose blob never got written (a crash between the writes).
	stray := legacyMeta([]byte("never stored"), "text/plain")
	writeLegacy("gone.meta.json", stray)

	e := newEnvIn(t, dir)
	e.expectPayload("plain", "text/plain", plain)
	e.expectPayload("victim", "application/octet-stream", victim)
	e.expectPayload("victim.meta.json", "application/json", clash)
	e.expectPayload("gone.meta.json", "application/octet-stream", stray)
	if got := e.payloadStatus("gone"); got != http.StatusNotFound {
		t.Fatalf("presign get of a blob that never was: %d", got)
	}
	listing := func() []string {
		t.Helper()
		var out []string
		err := filepath.WalkDir(ns, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				rel, _ := filepath.Rel(ns, p)
				out = append(out, rel)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(out)
		return out
	}
	want := []string{
		".meta/gone.meta.json.json", ".meta/plain.json", ".meta/victim.json", ".meta/victim.meta.json.json",
		"gone.meta.json", "plain", "victim", "victim.meta.json",
	}
	if got := listing(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("after the migration:\n got %v\nwant %v", got, want)
	}
	before := map[string]string{}
	for _, f := range want {
		b, _ := os.ReadFile(filepath.Join(ns, f))
		before[f] = string(b)
	}
	e.srv.Close()

	e = newEnvIn(t, dir)
	for _, f := range listing() {
		if b, _ := os.ReadFile(filepath.Join(ns, f)); string(b) != before[f] {
			t.Fatalf("a second start changed %s", f)
		}
	}
	if got := listing(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("after a second start: %v", got)
	}
	e.expectPayload("plain", "text/plain", plain)
}
