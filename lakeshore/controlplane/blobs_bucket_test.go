package controlplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/blobs"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/realparts"
)

// bucketEnv is a control plane whose payloads and releases are in a moto
// bucket (under prefix cp), and that bucket's store.
func bucketEnv(t *testing.T, opts ...envOpt) (*env, *blobs.S3, *realparts.Moto) {
	t.Helper()
	moto := realparts.StartMoto(t)
	moto.Setenv(t)
	moto.CreateBucket(t, "cp-blobs")
	st, err := blobs.OpenS3(context.Background(), blobs.S3Config{Bucket: "cp-blobs", Prefix: "cp", Endpoint: moto.URL})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	return newEnv(t, append([]envOpt{func(c *Config) { c.Blobs = st }}, opts...)...), st, moto
}

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// With a bucket, presign answers the bucket's own URLs: the bytes go
// there and come back from there, this control plane's payload route
// serves nothing, a put must say its size, and retention deletes from the
// bucket.
func TestPayloadsInABucket(t *testing.T) {
	e, st, moto := bucketEnv(t, func(c *Config) { c.PayloadRetention = time.Hour })
	data := bytes.Repeat([]byte("bucket "), 4096)
	digest := sha256.Sum256(data)
	sum := hex.EncodeToString(digest[:])
	r := e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "put", "size": len(data), "sha256": sum, "kind": "args"})
	if r.status != http.StatusOK {
		t.Fatalf("presign put: %d %q", r.status, r.body)
	}
	put := decodeJS[messages.PresignResponse](t, r)
	if !strings.HasPrefix(put.URL, moto.URL+"/cp-blobs/cp/payloads/default/args-") || len(put.Headers) == 0 {
		t.Fatalf("presigned put %+v, want a URL of the bucket with the headers it signs", put)
	}
	res, err := blobs.Do(context.Background(), http.DefaultClient, blobs.Presigned{URL: put.URL, Method: http.MethodPut, Headers: put.Headers}, bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatalf("PUT to the bucket: %v", err)
	}
	res.Body.Close()
	info, err := st.Stat(context.Background(), "payloads/default/"+put.Key)
	if err != nil || info.SHA256 != sum || info.Size != int64(len(data)) {
		t.Fatalf("in the bucket: %+v %v", info, err)
	}

	sub := e.submit(operatorapi.InvocationRequest{Queue: "q", Function: "m:f", ArgsKey: put.Key})
	if sub.Invocation.ArgsSize != int64(len(data)) {
		t.Fatalf("submitted %+v", sub.Invocation)
	}
	key := put.Key
	g := e.daemon("/v1/namespaces/default/payloads/presign", &messages.PresignRequest{Op: messages.PresignGet, Key: &key})
	if g.status != http.StatusOK {
		t.Fatalf("presign get: %d %q", g.status, g.body)
	}
	get := decodeMP[messages.PresignResponse](t, g)
	if !strings.HasPrefix(get.URL, moto.URL+"/cp-blobs/cp/payloads/default/"+key) {
		t.Fatalf("presigned get %+v", get)
	}
	if back := doCtx(t, context.Background(), http.MethodGet, get.URL, "", "", nil); back.status != http.StatusOK || !bytes.Equal(back.body, data) {
		t.Fatalf("GET from the bucket: %d, %d bytes", back.status, len(back.body))
	}

	if r := e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "put"}); r.status != http.StatusBadRequest || errField(t, r) != "size" {
		t.Fatalf("presign put of unknown size into a bucket: %d %q", r.status, r.body)
	}
	if r := e.do(http.MethodGet, "/v1/payloads/anything", "", "", nil); r.status != http.StatusNotFound || !strings.Contains(string(r.body), "s3://cp-blobs/cp") {
		t.Fatalf("this control plane's payload route with a bucket: %d %q", r.status, r.body)
	}
	// Large args submitted inline are stored in the bucket too.
	big := e.submit(operatorapi.InvocationRequest{Queue: "q", Function: "m:f", Args: bytes.Repeat([]byte{1}, messages.InlineThreshold+1)})
	if _, err := st.Stat(context.Background(), "payloads/default/"+big.Invocation.ArgsKey); err != nil {
		t.Fatalf("inline large args not in the bucket: %v", err)
	}

	// Finished more than the retention ago: deleted from the bucket.
	for _, id := range []string{sub.Invocation.ID, big.Invocation.ID} {
		if r := e.op(http.MethodPost, "/v1/namespaces/default/invocations/"+id+"/cancel", nil); r.status != http.StatusOK {
			t.Fatalf("cancel: %d %q", r.status, r.body)
		}
	}
	e.clock.Advance(time.Hour + time.Minute)
	if n, err := e.srv.sweepPayloads(context.Background()); err != nil || n != 2 {
		t.Fatalf("sweep deleted %d (%v), want 2", n, err)
	}
	if _, err := st.Stat(context.Background(), "payloads/default/"+key); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("after the retention the payload is still in the bucket: %v", err)
	}
}

// Releases in a bucket: published into it, listed with this control
// plane's URL, downloaded through a redirect to a presigned URL of the
// bucket (or handed out under the public URL), deleted from it.
func TestReleasesInABucket(t *testing.T) {
	e, st, moto := bucketEnv(t)
	const version, triple = "1.2.3", "x86_64-unknown-linux-gnu"
	bin := bytes.Repeat([]byte("not really nymph "), 1000)
	digest := sha256.Sum256(bin)
	sum := hex.EncodeToString(digest[:])
	r := e.do(http.MethodPost, "/v1/releases?version="+version+"&triple="+triple, "application/octet-stream", testAdmin, bin)
	if r.status != http.StatusCreated {
		t.Fatalf("publish: %d %q", r.status, r.body)
	}
	rel := decodeJS[operatorapi.Release](t, r)
	want := e.url + "/v1/releases/" + version + "/" + triple
	if rel.URL != want || rel.SHA256 != sum {
		t.Fatalf("published %+v, want URL %s", rel, want)
	}
	for _, k := range []string{"releases/" + version + "/nymph-" + triple, "releases/" + version + "/nymph-" + triple + ".sha256"} {
		if _, err := st.Stat(context.Background(), k); err != nil {
			t.Fatalf("%s not in the bucket: %v", k, err)
		}
	}
	res, err := noRedirects.Get(rel.URL)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	loc := res.Header.Get("Location")
	if res.StatusCode != http.StatusFound || !strings.HasPrefix(loc, moto.URL+"/cp-blobs/cp/releases/"+version+"/") {
		t.Fatalf("download: %d to %q, want a redirect to the bucket", res.StatusCode, loc)
	}
	if got := doCtx(t, context.Background(), http.MethodGet, rel.URL, "", "", nil); got.status != http.StatusOK || !bytes.Equal(got.body, bin) {
		t.Fatalf("download through the redirect: %d, %d bytes", got.status, len(got.body))
	}
	if got := doCtx(t, context.Background(), http.MethodGet, rel.SidecarURL, "", "", nil); string(got.body) != sum+"  nymph-"+triple+"\n" {
		t.Fatalf("sidecar %d %q", got.status, got.body)
	}

	// A second control plane on the same bucket lists it; with a public
	// URL, that is where downloads are handed out.
	other := newEnv(t, func(c *Config) { c.Blobs = st; c.BlobsPublicURL = "https://pub.example/cp" })
	var list operatorapi.ReleaseList
	if r := other.op(http.MethodGet, "/v1/releases", nil); r.status != http.StatusOK {
		t.Fatalf("list: %d %q", r.status, r.body)
	} else {
		list = decodeJS[operatorapi.ReleaseList](t, r)
	}
	if len(list.Releases) != 1 || list.Releases[0].URL != "https://pub.example/cp/releases/"+version+"/nymph-"+triple ||
		list.Releases[0].SidecarURL != list.Releases[0].URL+".sha256" {
		t.Fatalf("listed by the other %+v", list.Releases)
	}

	if r := other.do(http.MethodDelete, "/v1/releases/"+version+"/"+triple, "", testAdmin, nil); r.status != http.StatusOK {
		t.Fatalf("delete: %d %q", r.status, r.body)
	}
	if err := st.List(context.Background(), "releases/", func(i blobs.Info) error { return errors.New("left: " + i.Key) }); err != nil {
		t.Fatalf("after delete: %v", err)
	}
	if got := doCtx(t, context.Background(), http.MethodGet, rel.URL, "", "", nil); got.status != http.StatusNotFound {
		t.Fatalf("download after delete: %d", got.status)
	}
}
