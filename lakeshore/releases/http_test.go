package releases

import (
	"bytes"
	"context"
	"debug/elf"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/daemon/selfupdate"
	"nymph/dist"
	"nymph/messages"
	"nymph/test/fakeelf"
)

func serve(t *testing.T, s *Store) *httptest.Server {
	t.Helper()
	return serveHandler(t, s.Handler(dist.DefaultPrefix))
}

func serveHandler(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(dist.DefaultPrefix+"/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// served is a catalogue behind its handler.
type served struct {
	cat Catalogue
	srv *httptest.Server
	// ranges: the handler serves Range requests (Store's does; a
	// streamed bucket's does not, a presigned one's store does).
	ranges bool
	// redirects: a binary is a redirect to a presigned URL.
	redirects bool
}

// handlers are the ways a release download is served: from a Store, a
// Bucket streamed through the control plane, and a Bucket on S3 whose
// binaries are presigned redirects to the bucket itself.
var handlers = []struct {
	name string
	open func(t *testing.T) served
}{
	{"store", func(t *testing.T) served {
		s := openStore(t)
		return served{cat: s, srv: serve(t, s), ranges: true}
	}},
	{"bucket-local-streamed", func(t *testing.T) served {
		b := NewBucket(localBlobs(t), DefaultBucketPrefix)
		return served{cat: b, srv: serveHandler(t, b.Handler(dist.DefaultPrefix, 0))}
	}},
	{"bucket-s3-presigned", func(t *testing.T) served {
		b := NewBucket(s3Blobs(t), DefaultBucketPrefix)
		return served{cat: b, srv: serveHandler(t, b.Handler(dist.DefaultPrefix, time.Minute)), ranges: true, redirects: true}
	}},
}

func eachHandler(t *testing.T, test func(t *testing.T, h served)) {
	for _, h := range handlers {
		t.Run(h.name, func(t *testing.T) { test(t, h.open(t)) })
	}
}

// eachStreamingHandler is eachHandler without the presigned one, whose
// bytes do not pass through the handler.
func eachStreamingHandler(t *testing.T, test func(t *testing.T, h served)) {
	for _, h := range handlers {
		if strings.HasSuffix(h.name, "-presigned") {
			continue
		}
		t.Run(h.name, func(t *testing.T) { test(t, h.open(t)) })
	}
}

// noFollow, as a header of get, returns a redirect instead of following it.
const noFollow = "X-Test-No-Follow"

func get(t *testing.T, method, url string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := http.DefaultClient
	for k, v := range hdr {
		if k == noFollow {
			client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func TestHandlerServesBinaryAndSidecar(t *testing.T) {
	eachHandler(t, func(t *testing.T, h served) { testHandlerServes(t, h) })
}

func testHandlerServes(t *testing.T, h served) {
	s, srv := h.cat, h.srv
	body := randomBytes(t, 100<<10)
	rel := publish(t, s, body, "0.4.0", "x86_64-unknown-linux-gnu")
	binURL := dist.URLFor(srv.URL+"/", dist.DefaultPrefix, rel.Version, rel.Triple)
	if want := srv.URL + "/v1/releases/0.4.0/x86_64-unknown-linux-gnu"; binURL != want {
		t.Fatalf("dist.URLFor = %s, want %s", binURL, want)
	}

	resp, got := get(t, http.MethodGet, binURL, nil)
	if resp.StatusCode != 200 || !bytes.Equal(got, body) {
		t.Fatalf("GET binary: %s, %d bytes", resp.Status, len(got))
	}
	if resp.ContentLength != int64(len(body)) || (!h.redirects && (resp.Header.Get("ETag") != `"`+rel.SHA256+`"` || resp.Header.Get("Content-Type") != "application/octet-stream")) {
		t.Fatalf("binary headers: %v", resp.Header)
	}
	if h.redirects {
		resp, _ := get(t, http.MethodGet, binURL, map[string]string{noFollow: "1"})
		if resp.StatusCode != http.StatusFound || !strings.HasPrefix(resp.Header.Get("Location"), "http") || strings.HasPrefix(resp.Header.Get("Location"), srv.URL) {
			t.Fatalf("a presigned bucket's binary: %s to %q, want a redirect to the bucket", resp.Status, resp.Header.Get("Location"))
		}
	}

	resp, got = get(t, http.MethodGet, binURL+".sha256", nil)
	if resp.StatusCode != 200 || string(got) != rel.SHA256+"  nymph-x86_64-unknown-linux-gnu\n" {
		t.Fatalf("GET sidecar: %s %q", resp.Status, got)
	}
	if st, ok := s.(*Store); ok {
		side, _ := os.ReadFile(st.binPath(rel.Version, rel.Triple) + ".sha256")
		if !bytes.Equal(got, side) {
			t.Fatalf("served sidecar %q differs from the file %q", got, side)
		}
	}

	resp, got = get(t, http.MethodHead, binURL, nil)
	if resp.StatusCode != 200 || len(got) != 0 || resp.ContentLength != int64(len(body)) {
		t.Fatalf("HEAD: %s len=%d body=%d", resp.Status, resp.ContentLength, len(got))
	}
	if h.ranges {
		resp, got = get(t, http.MethodGet, binURL, map[string]string{"Range": "bytes=10-19"})
		if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, body[10:20]) {
			t.Fatalf("Range: %s %x", resp.Status, got)
		}
	}
	if !h.redirects {
		resp, _ = get(t, http.MethodGet, binURL, map[string]string{"If-None-Match": `"` + rel.SHA256 + `"`})
		if resp.StatusCode != http.StatusNotModified {
			t.Fatalf("If-None-Match: %s", resp.Status)
		}
	}

	sum, err := dist.FetchChecksum(context.Background(), srv.Client(), binURL)
	if err != nil || sum != rel.SHA256 {
		t.Fatalf("FetchChecksum = %s, %v", sum, err)
	}

	for _, path := range []string{
		"/v1/releases/0.4.1/x86_64-unknown-linux-gnu",
		"/v1/releases/0.4.0/aarch64-unknown-linux-gnu",
		"/v1/releases/0.4.0/aarch64-unknown-linux-gnu.sha256",
		"/v1/releases/0.4.0/nymph-x86_64-unknown-linux-gnu",
		"/v1/releases/0.4.0/x86_64-unknown-linux-gnu/extra",
		"/v1/releases/0.4.0/",
		"/v1/releases/0.4.0",
		"/v1/releases/",
		"/v1/releases/.index.json/x86_64-unknown-linux-gnu",
		"/v1/releases/%2e%2e/x86_64-unknown-linux-gnu",
		"/v1/releases/0.4.0/x86_64-unknown-linux-gnu.sha256.sha256",
	} {
		if resp, _ := get(t, http.MethodGet, srv.URL+path, nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s, want 404", path, resp.Status)
		}
	}
	if resp, _ := get(t, http.MethodPost, binURL, nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %s, want 405", resp.Status)
	}
	if _, err := dist.FetchChecksum(context.Background(), srv.Client(), srv.URL+"/v1/releases/9.9.9/x86_64-unknown-linux-gnu"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("FetchChecksum of a missing release: %v", err)
	}
}

// TestReadersSeeConsistentReleases downloads while the same version is
// re-published: every response's bytes must hash to its own ETag. A
// streamed bucket may instead answer 503 while it holds a new binary under
// the old sidecar, but never bytes its ETag does not name.
func TestReadersSeeConsistentReleases(t *testing.T) {
	// A presigned download's bytes are the bucket's, not the handler's;
	// the daemon checks them against its command's sha256.
	eachStreamingHandler(t, func(t *testing.T, h served) { testReadersSeeConsistentReleases(t, h.cat, h.srv) })
}

func testReadersSeeConsistentReleases(t *testing.T, s Catalogue, srv *httptest.Server) {
	const v, tr = "0.5.0", "x86_64-unknown-linux-gnu"
	publish(t, s, randomBytes(t, 64<<10), v, tr)
	url := dist.URLFor(srv.URL, dist.DefaultPrefix, v, tr)

	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		for range 20 {
			if _, err := s.Publish(context.Background(), bytes.NewReader(randomBytes(t, 64<<10)), v, tr); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				resp, err := srv.Client().Get(url)
				if err != nil {
					t.Error(err)
					return
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if _, bucket := s.(*Bucket); bucket && resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" {
					continue
				}
				if err != nil || resp.StatusCode != 200 {
					t.Errorf("GET: %s %v", resp.Status, err)
					return
				}
				if etag := resp.Header.Get("ETag"); etag != `"`+hexSum(body)+`"` {
					t.Errorf("ETag %s but the body hashes to %s", etag, hexSum(body))
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestDaemonInstallsFromStore is the two halves together: a binary
// published here, its URL from dist.URLFor and its checksum from the sidecar,
// installed by the daemon's selfupdate.Updater over a file in a temp dir.
func TestDaemonInstallsFromStore(t *testing.T) {
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	machine, ok := machines[runtime.GOARCH]
	if !ok || runtime.GOOS != "linux" {
		t.Skipf("fake ELF built only for linux amd64/arm64, not %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	eachHandler(t, func(t *testing.T, h served) { testDaemonInstalls(t, machine, h.cat, h.srv) })
}

func testDaemonInstalls(t *testing.T, machine elf.Machine, s Catalogue, srv *httptest.Server) {
	body := fakeelf.New(t, machine, 256<<10)
	rel := publish(t, s, body, "0.6.0", "")

	url := dist.URLFor(srv.URL, dist.DefaultPrefix, rel.Version, rel.Triple)
	sum, err := dist.FetchChecksum(context.Background(), srv.Client(), url)
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), "nymph")
	if err := os.WriteFile(exe, []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	u := selfupdate.New(zerolog.New(zerolog.NewTestWriter(t)), selfupdate.Options{ExePath: exe})
	if _, err := u.Install(context.Background(), messages.OtaUpdate{Version: rel.Version, URL: url, SHA256: sum}); err != nil {
		t.Fatalf("Install from the store: %v", err)
	}
	got, _ := os.ReadFile(exe)
	if !bytes.Equal(got, body) {
		t.Fatal("installed bytes differ from the published ones")
	}

	// A wrong version in the URL is a 404 the daemon reports, file intact.
	_, err = u.Install(context.Background(), messages.OtaUpdate{Version: "0.6.1", URL: dist.URLFor(srv.URL, dist.DefaultPrefix, "0.6.1", rel.Triple), SHA256: sum})
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("Install of an unpublished version: %v", err)
	}
	if got, _ := os.ReadFile(exe); !bytes.Equal(got, body) {
		t.Fatal("a failed install changed the binary")
	}
}

func TestSidecarParsing(t *testing.T) {
	h := strings.Repeat("Ab", 32)
	for in, want := range map[string]string{
		h + "  nymph-x86_64-unknown-linux-gnu\n": strings.ToLower(h),
		h + " *nymph\n":                          strings.ToLower(h),
		h:                                        strings.ToLower(h),
		"\n":                                     "",
		"not-a-sum  nymph\n":                     "",
		h[:63] + "  nymph\n":                     "",
	} {
		got, err := dist.ParseSidecar(strings.NewReader(in))
		if want == "" {
			if err == nil {
				t.Errorf("dist.ParseSidecar(%q) = %s, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("dist.ParseSidecar(%q) = %s, %v", in, got, err)
		}
	}
	su, err := dist.SidecarURL("https://r2.example/bin/nymph?X-Sig=abc")
	if err != nil || su != "https://r2.example/bin/nymph.sha256?X-Sig=abc" {
		t.Errorf("SidecarURL = %s, %v", su, err)
	}
	if _, err := dist.SidecarURL("file:///bin/nymph"); err == nil {
		t.Error("SidecarURL accepted a file URL")
	}
	_, err = dist.FetchChecksum(context.Background(), nil, "http://127.0.0.1:1/x?token=secret")
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("FetchChecksum error leaks the query or succeeded: %v", err)
	}
}
