package blobs_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/blobs"
	"nymph/lakeshore/blobs/blobstest"
	"nymph/test/fakeclock"
)

const prefix = "/v1/payloads/"

type localFixture struct {
	dir   string
	store *blobs.Local
	clock *fakeclock.Clock
	srv   *httptest.Server
}

func newLocal(t *testing.T) localFixture {
	t.Helper()
	dir := t.TempDir()
	clock := fakeclock.New(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))
	l, err := blobs.NewLocal(dir, blobs.LocalOptions{Secret: []byte("admin-token"), URLPrefix: prefix, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(prefix, l.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return localFixture{dir: dir, store: l, clock: clock, srv: srv}
}

func TestLocalConformance(t *testing.T) {
	blobstest.Run(t, func(t *testing.T) blobstest.Fixture {
		f := newLocal(t)
		return blobstest.Fixture{
			Store: f.store, Base: f.srv.URL, Client: f.srv.Client(),
			Now: f.clock.Now, Advance: f.clock.Advance,
			EnforcesExpiry: true, VerifiesUploads: true,
		}
	})
}

func hexsum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestLocalLayout: the files are where the control plane's payload store
// has always put them, with its permissions and metadata fields.
func TestLocalLayout(t *testing.T) {
	f := newLocal(t)
	b := []byte("hello")
	if _, err := f.store.Put(context.Background(), "payloads/ns1/k", bytes.NewReader(b), blobs.PutOptions{Size: 5, ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	for p, mode := range map[string]os.FileMode{
		"payloads":                  os.ModeDir | 0o700,
		"payloads/ns1":              os.ModeDir | 0o700,
		"payloads/ns1/.meta":        os.ModeDir | 0o700,
		"payloads/ns1/k":            0o600,
		"payloads/ns1/.meta/k.json": 0o600,
	} {
		st, err := os.Stat(filepath.Join(f.dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != mode {
			t.Errorf("%s: mode %s, want %s", p, st.Mode(), mode)
		}
	}
	mb, err := os.ReadFile(filepath.Join(f.dir, "payloads/ns1/.meta/k.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(mb, &m); err != nil {
		t.Fatal(err)
	}
	if m["size"] != 5.0 || m["sha256"] != hexsum(b) || m["content_type"] != "text/plain" || m["created_at"] != "2026-03-04T05:06:07Z" {
		t.Fatalf("metadata %s", mb)
	}
}

// TestLocalReadsExistingData: a data directory the payload store wrote
// before this package (and leftovers of a crash) reads as it should.
func TestLocalReadsExistingData(t *testing.T) {
	f := newLocal(t)
	ns := filepath.Join(f.dir, "payloads", "ns1")
	if err := os.MkdirAll(filepath.Join(ns, ".meta"), 0o700); err != nil {
		t.Fatal(err)
	}
	b := []byte("an old payload")
	write := func(p, s string) {
		if err := os.WriteFile(filepath.Join(ns, p), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("old", string(b))
	write(".meta/old.json", `{"size":14,"sha256":"`+hexsum(b)+`","content_type":"application/octet-stream","created_at":"2025-01-02T03:04:05Z"}`)
	write("orphan", "a blob whose metadata was never written")
	write(".old123456", "a temporary file a crash left")
	write(".meta/gone.json", `{"size":1}`) // metadata whose blob never landed

	ctx := context.Background()
	info, err := f.store.Stat(ctx, "payloads/ns1/old")
	if err != nil || info.Size != 14 || info.SHA256 != hexsum(b) || !info.Modified.Equal(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Fatalf("Stat of an old payload: %+v, %v", info, err)
	}
	for _, k := range []string{"payloads/ns1/orphan", "payloads/ns1/gone"} {
		if _, err := f.store.Stat(ctx, k); !errors.Is(err, blobs.ErrNotFound) {
			t.Fatalf("Stat %s: %v, want ErrNotFound", k, err)
		}
	}
	var keys []string
	if err := f.store.List(ctx, "", func(i blobs.Info) error { keys = append(keys, i.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "payloads/ns1/old" {
		t.Fatalf("List: %q, want only payloads/ns1/old", keys)
	}

	// Bytes changed behind the store's back: Open says so at EOF.
	write("old", "an old PAYLOAD")
	rc, _, err := f.store.Open(ctx, "payloads/ns1/old")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadAll(rc); !errors.Is(err, blobs.ErrChecksum) {
		t.Fatalf("reading corrupted bytes: %v, want ErrChecksum", err)
	}
}

func TestLocalAuthorize(t *testing.T) {
	f := newLocal(t)
	ctx := context.Background()
	longKey := strings.Repeat("k", 200) + "/" + strings.Repeat("k", 200) + "/" + strings.Repeat("k", 200)
	p, err := f.store.PresignPut(ctx, longKey, blobs.PutOptions{Size: 10, Max: 0, SHA256: hexsum([]byte("0123456789")), ContentType: "text/plain"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimPrefix(p.URL, prefix)
	if len(token) > 2048 || !strings.HasPrefix(p.URL, prefix) || len(p.Headers) != 0 {
		t.Fatalf("URL %q (%d bytes), headers %v", p.URL, len(token), p.Headers)
	}
	g, err := f.store.Authorize(token, "put")
	if err != nil {
		t.Fatal(err)
	}
	if g.Key != longKey || g.Put.Size != 10 || g.Put.SHA256 != hexsum([]byte("0123456789")) || g.Put.ContentType != "text/plain" {
		t.Fatalf("grant %+v", g)
	}
	if _, err := f.store.Authorize(token, "get"); !errors.Is(err, blobs.ErrDenied) {
		t.Fatalf("a put URL used for a get: %v, want ErrDenied", err)
	}
	enc, sig, _ := strings.Cut(token, ".")
	for name, bad := range map[string]string{
		"tampered body":  enc[:len(enc)-2] + "AA." + sig,
		"tampered sig":   enc + "." + sig[:len(sig)-2] + "AA",
		"no signature":   enc,
		"empty":          "",
		"over 2 KiB":     strings.Repeat("a", 2049) + "." + sig,
		"not base64 sig": enc + ".!!!",
	} {
		if _, err := f.store.Authorize(bad, "put"); !errors.Is(err, blobs.ErrDenied) {
			t.Errorf("%s: %v, want ErrDenied", name, err)
		}
	}
	other, err := blobs.NewLocal(f.dir, blobs.LocalOptions{Secret: []byte("another-token"), URLPrefix: prefix, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Authorize(token, "put"); !errors.Is(err, blobs.ErrDenied) {
		t.Fatalf("a URL signed with another secret: %v, want ErrDenied", err)
	}
	f.clock.Advance(time.Hour + time.Second)
	_, err = f.store.Authorize(token, "put")
	if !errors.Is(err, blobs.ErrExpired) || !strings.Contains(err.Error(), "2026-03-04T06:06:07Z") {
		t.Fatalf("after expiry: %v, want ErrExpired at 2026-03-04T06:06:07Z", err)
	}
	nosecret, err := blobs.NewLocal(f.dir, blobs.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nosecret.PresignPut(ctx, "a", blobs.PutOptions{Size: 1}, time.Minute); err == nil {
		t.Fatal("a store without a secret presigned a URL")
	}
}

// TestLocalHandler: every refusal of the handler is a 4xx that names its
// reason; none is a 500.
func TestLocalHandler(t *testing.T) {
	f := newLocal(t)
	ctx := context.Background()
	b := []byte("0123456789")
	if _, err := f.store.Put(ctx, "h/k", bytes.NewReader(b), blobs.PutOptions{Size: 10, ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	pg, err := f.store.PresignGet(ctx, "h/k", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	send := func(method, url string, body io.Reader, length int64, hdr map[string]string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, f.srv.URL+url, body)
		if err != nil {
			t.Fatal(err)
		}
		if body != nil {
			req.ContentLength = length
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		rb, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(rb)
	}

	code, h, body := send("GET", pg.URL, nil, 0, nil)
	if code != 200 || body != string(b) || h.Get("Content-Type") != "text/plain" || h.Get("Content-Length") != "10" ||
		h.Get("X-Checksum-Sha256") != hexsum(b) || h.Get("Cache-Control") != "no-store" {
		t.Fatalf("GET: %d %v %q", code, h, body)
	}
	if code, h, body = send("HEAD", pg.URL, nil, 0, nil); code != 200 || body != "" || h.Get("Content-Length") != "10" {
		t.Fatalf("HEAD: %d %v %q", code, h, body)
	}
	if code, _, body = send("PUT", pg.URL, strings.NewReader("x"), 1, nil); code != 403 {
		t.Fatalf("PUT with a get URL: %d %s", code, body)
	}
	if code, _, body = send("DELETE", pg.URL, nil, 0, nil); code != 405 {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	if code, _, body = send("GET", prefix+"garbage.token", nil, 0, nil); code != 403 || !strings.Contains(body, "not valid") {
		t.Fatalf("forged token: %d %s", code, body)
	}
	if code, _, body = send("GET", prefix+"a/b", nil, 0, nil); code != 404 {
		t.Fatalf("a path with a slash: %d %s", code, body)
	}

	pp, err := f.store.PresignPut(ctx, "h/new", blobs.PutOptions{Size: 10, SHA256: hexsum(b)}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		body   io.Reader
		length int64
		code   int
		says   string
	}{
		{"Content-Length over", strings.NewReader("0123456789a"), 11, 413, "size: Content-Length 11"},
		{"Content-Length under", strings.NewReader("012345678"), 9, 400, "size: presigned for 10 bytes"},
		{"chunked, over", io.MultiReader(strings.NewReader("0123456789a")), -1, 413, "declared 10 bytes, got more"},
		{"chunked, under", io.MultiReader(strings.NewReader("012345678")), -1, 400, "declared 10 bytes, got 9"},
		{"other bytes", strings.NewReader("9876543210"), 10, 400, "sha256: "},
	} {
		code, _, body := send("PUT", pp.URL, c.body, c.length, nil)
		if code != c.code || !strings.Contains(body, c.says) {
			t.Errorf("%s: %d %s, want %d saying %q", c.name, code, body, c.code, c.says)
		}
	}
	if _, err := f.store.Stat(ctx, "h/new"); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("refused PUTs left a blob: %v", err)
	}
	code, _, body = send("PUT", pp.URL, bytes.NewReader(b), 10, map[string]string{"Content-Type": "text/csv"})
	var res map[string]any
	if code != 200 || json.Unmarshal([]byte(body), &res) != nil || res["key"] != "h/new" || res["size"] != 10.0 || res["sha256"] != hexsum(b) || res["contentType"] != "text/csv" {
		t.Fatalf("PUT: %d %s", code, body)
	}

	if err := f.store.Delete(ctx, "h/k"); err != nil {
		t.Fatal(err)
	}
	if code, _, body = send("GET", pg.URL, nil, 0, nil); code != 404 {
		t.Fatalf("GET of a deleted blob: %d %s", code, body)
	}
	f.clock.Advance(2 * time.Minute)
	if code, _, body = send("GET", pg.URL, nil, 0, nil); code != 403 || !strings.Contains(body, "expired") {
		t.Fatalf("expired GET: %d %s", code, body)
	}
}

func TestLocalCheck(t *testing.T) {
	f := newLocal(t)
	if err := f.store.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	fresh, err := blobs.NewLocal(filepath.Join(t.TempDir(), "not", "yet"), blobs.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Check(context.Background()); err != nil {
		t.Fatalf("a directory that can be created: %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	under, err := blobs.NewLocal(filepath.Join(file, "blobs"), blobs.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := under.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "cannot create the directory") || !strings.Contains(err.Error(), file) {
		t.Fatalf("a directory under a file: %v", err)
	}
}

// TestLocalKeyUnderBlob: a file cannot also be a directory, so a local
// store refuses a key under another blob, and that blob under other keys,
// as invalid rather than failing.
func TestLocalKeyUnderBlob(t *testing.T) {
	f := newLocal(t)
	ctx := context.Background()
	for _, k := range []string{"u/a", "u/b/c"} {
		if _, err := f.store.Put(ctx, k, strings.NewReader("x"), blobs.PutOptions{Size: 1}); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"u/a/x", "u/b"} {
		if _, err := f.store.Put(ctx, k, strings.NewReader("x"), blobs.PutOptions{Size: 1}); !errors.Is(err, blobs.ErrInvalidKey) {
			t.Errorf("Put %s: %v, want ErrInvalidKey", k, err)
		}
		if _, err := f.store.Stat(ctx, k); !errors.Is(err, blobs.ErrNotFound) {
			t.Errorf("Stat %s: %v, want ErrNotFound", k, err)
		}
		if err := f.store.Delete(ctx, k); err != nil {
			t.Errorf("Delete %s: %v", k, err)
		}
	}
}

// TestLocalHandlerCorruptBlob: bytes that no longer hash to their sha256
// are not served as a whole response; the client sees the transfer fail.
func TestLocalHandlerCorruptBlob(t *testing.T) {
	f := newLocal(t)
	ctx := context.Background()
	for _, size := range []int{10, 256 << 10} {
		b := bytes.Repeat([]byte("a"), size)
		if _, err := f.store.Put(ctx, "c/k", bytes.NewReader(b), blobs.PutOptions{Size: int64(size)}); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(f.dir, "c", "k"), bytes.Repeat([]byte("b"), size), 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := f.store.PresignGet(ctx, "c/k", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		p.URL = f.srv.URL + p.URL
		resp, err := blobs.Do(ctx, f.srv.Client(), p, nil, 0)
		if err == nil {
			got, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			err = rerr
			if err == nil {
				t.Fatalf("%d bytes: a corrupted blob was served whole (%d bytes)", size, len(got))
			}
		}
		t.Logf("%d bytes: %v", size, err)
	}
}
