package e2e

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
	"nymph/test/realparts"
)

// rotatingProxy is the round-robin load balancer in front of the
// replicas: each request goes to the next replica in turn. Requests are
// counted in turns of their own kind (presign, submit, publish, ...), and
// a kind's first turn is offset so that the steps of one flow alternate —
// a payload uploaded through one replica is fetched through the other, a
// release published through one is listed and updated to through the
// other — rather than depending on how the daemon's polls happen to fall.
type rotatingProxy struct {
	URL     string
	mu      sync.Mutex
	targets []*url.URL
	turns   map[string]int
	served  map[string][]int // kind -> the replica of each request, in order
}

// firstTurn offsets the kinds that follow another in a flow.
var firstTurn = map[string]int{"presign": 1, "update": 1, "releases": 1, "download": 1}

func requestKind(r *http.Request) string {
	p := r.URL.Path
	switch {
	case strings.HasSuffix(p, "/payloads/presign"):
		return "presign"
	case r.Method == http.MethodPost && strings.HasSuffix(p, "/invocations"):
		return "submit"
	case r.Method == http.MethodPost && p == "/v1/releases":
		return "publish"
	case r.Method == http.MethodGet && p == "/v1/releases":
		return "releases"
	case strings.HasPrefix(p, "/v1/releases/"):
		return "download"
	case strings.HasSuffix(p, "/update"):
		return "update"
	}
	return "other"
}

func startRotatingProxy(t *testing.T) *rotatingProxy {
	t.Helper()
	p := &rotatingProxy{turns: map[string]int{}, served: map[string][]int{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			kind := requestKind(r.In)
			p.mu.Lock()
			n, ok := p.turns[kind]
			if !ok {
				n = firstTurn[kind]
			}
			p.turns[kind] = n + 1
			i := n % len(p.targets)
			p.served[kind] = append(p.served[kind], i)
			target := p.targets[i]
			p.mu.Unlock()
			r.SetURL(target)
		},
		// The proxy is transparent: a release download's redirect to the
		// bucket reaches the daemon as the replica sent it.
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *rotatingProxy) set(targets ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range targets {
		u, _ := url.Parse(s)
		p.targets = append(p.targets, u)
	}
}

// servedBy is the replicas that answered requests of kind, in order.
func (p *rotatingProxy) servedBy(kind string) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.served[kind])
}

// bucketKeys lists the keys under prefix in a moto bucket (moto answers
// an unsigned ListObjectsV2).
func bucketKeys(t *testing.T, moto *realparts.Moto, bucket, prefix string) []string {
	t.Helper()
	resp, err := http.Get(moto.URL + "/" + bucket + "?list-type=2&prefix=" + url.QueryEscape(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out struct {
		Contents []struct {
			Key string `xml:"Key"`
		} `xml:"Contents"`
	}
	if resp.StatusCode != http.StatusOK || xml.Unmarshal(body, &out) != nil {
		t.Fatalf("list s3://%s/%s: %s %s", bucket, prefix, resp.Status, body)
	}
	keys := []string{}
	for _, c := range out.Contents {
		keys = append(keys, c.Key)
	}
	return keys
}

// TestReplicasShareBlobsInABucket: two replicas on one PostgreSQL and one
// S3 bucket (moto), behind a round-robin proxy that daemon and operator
// both go through. A run with a 5 MiB argument (a payload_ref), a release
// publish and a `daemon update` all succeed with their steps landing on
// different replicas, and the bytes are in the bucket, not on either
// replica's disk.
func TestReplicasShareBlobsInABucket(t *testing.T) {
	t.Parallel()
	moto := realparts.StartMoto(t)
	moto.CreateBucket(t, "fleet")
	pg := realparts.StartPostgres(t)
	proxy := startRotatingProxy(t)
	args := []string{"--store", pg.DSN, "--blobs", "s3://fleet/cp", "--blobs-endpoint", moto.URL, "--public-url", proxy.URL}
	a := harness.StartControlPlane(t, harness.CPOptions{Env: moto.Env, Args: args})
	b := harness.StartControlPlane(t, harness.CPOptions{Env: moto.Env, Args: args, AdminToken: a.AdminToken, DaemonToken: a.DaemonToken})
	proxy.set(a.URL, b.URL)
	// The operator goes through the proxy too.
	a.Env = append(a.Env, "LAKESHORE_URL="+proxy.URL)
	op := a

	bin, _ := privateNymph(t, op)
	v2Path, v2 := v2Nymph(t)
	op.StartDaemon(t, harness.DaemonOptions{Label: "shared", Bin: bin, Runners: []string{"process"}, ServerURL: proxy.URL})

	script := writeTemp(t, "sum.sh", []byte(`printf %s "$(sha256sum < "$NYMPH_ARGS_PATH" | cut -c1-64)" > "$NYMPH_RESULT_PATH"`))
	for i := range 2 {
		data := randBytes(t, 5<<20)
		sum := sha256.Sum256(data)
		inv, r := runInv(t, op, "--runner", "process", "--args-file", writeTemp(t, fmt.Sprintf("args-%d.bin", i), data), "--script", script)
		expectSucceeded(t, fmt.Sprintf("run %d with 5 MiB args", i), inv, r, []byte(hex.EncodeToString(sum[:])))
		if inv.ArgsKey == "" || inv.ArgsSize != 5<<20 {
			t.Fatalf("run %d: the args did not travel as a payload: key %q, size %d", i, inv.ArgsKey, inv.ArgsSize)
		}
	}
	// Each run presigned twice (the CLI's put, the daemon's get) and was
	// submitted once: the upload and the fetch of each went through
	// different replicas, and the second run was submitted through the
	// replica its args were uploaded through.
	if got := proxy.servedBy("presign"); !slices.Equal(got, []int{1, 0, 1, 0}) {
		t.Fatalf("presigns served by %v, want [1 0 1 0] (each put through B, each get through A)", got)
	}
	if got := proxy.servedBy("submit"); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("submits served by %v", got)
	}

	publish(t, op, v2Path, v2Version)
	var list operatorapi.ReleaseList
	r := op.CLI(t, "release", "list", "--json")
	expectCode(t, r, 0)
	list = mustJSON[operatorapi.ReleaseList](t, r)
	if len(list.Releases) != 1 || list.Releases[0].Version != v2Version || list.Releases[0].SHA256 != sha(v2) {
		t.Fatalf("the other replica lists %+v, want %s published through the first", list.Releases, v2Version)
	}
	r = op.CLI(t, "daemon", "update", "shared", "--version", v2Version, "--json")
	expectCode(t, r, 0)
	q := mustJSON[operatorapi.UpdateQueued](t, r)
	if q.SHA256 != sha(v2) || !strings.HasPrefix(q.URL, proxy.URL+"/v1/releases/"+v2Version+"/") {
		t.Fatalf("queued update %+v, want the bucket's release through the control plane's URL", q)
	}
	waitVersion(t, op, "shared", v2Version)
	if got := proxy.servedBy("publish"); !slices.Equal(got, []int{0}) {
		t.Fatalf("publish served by %v", got)
	}
	if got := proxy.servedBy("releases"); len(got) == 0 || got[0] != 1 {
		t.Fatalf("release lists served by %v, want the first through B", got)
	}
	if got := proxy.servedBy("update"); !slices.Equal(got, []int{1}) {
		t.Fatalf("update served by %v", got)
	}
	if got := proxy.servedBy("download"); len(got) == 0 {
		t.Fatal("the daemon downloaded its update from somewhere other than the control plane's release URL")
	}

	// The bytes are in the bucket, and on neither replica's disk.
	if keys := bucketKeys(t, moto, "fleet", "cp/payloads/default/"); len(keys) != 2 {
		t.Fatalf("payloads in the bucket: %v, want the two runs' args", keys)
	}
	want := []string{"cp/releases/" + v2Version + "/nymph-x86_64-unknown-linux-gnu", "cp/releases/" + v2Version + "/nymph-x86_64-unknown-linux-gnu.sha256"}
	if keys := bucketKeys(t, moto, "fleet", "cp/releases/"); !slices.Equal(keys, want) {
		t.Fatalf("releases in the bucket: %v, want %v", keys, want)
	}
	// Deleting the release removes both its objects.
	expectCode(t, op.CLI(t, "release", "delete", v2Version), 0)
	if keys := bucketKeys(t, moto, "fleet", "cp/releases/"); len(keys) != 0 {
		t.Fatalf("after release delete the bucket still holds %v", keys)
	}
	for _, cp := range []*harness.ControlPlane{a, b} {
		for _, dir := range []string{"payloads", "releases"} {
			if ents, err := os.ReadDir(filepath.Join(cp.DataDir, dir)); err == nil && len(ents) > 0 {
				t.Fatalf("%s holds %s/ on its own disk: %v", cp.Addr, dir, ents)
			}
		}
	}
}

// payloadURLExpiry reads the expiry a control plane's own presigned
// payload URL carries (blobs.Local's token: base64url JSON, then its MAC).
func payloadURLExpiry(t *testing.T, path string) time.Time {
	t.Helper()
	token := strings.TrimPrefix(path, "/v1/payloads/")
	enc, _, _ := strings.Cut(token, ".")
	body, err := base64.RawURLEncoding.DecodeString(enc)
	var c struct {
		Exp int64 `json:"e"`
	}
	if err != nil || json.Unmarshal(body, &c) != nil || c.Exp == 0 {
		t.Errorf("payload URL %s carries no expiry the test can read", path)
		return time.Time{}
	}
	return time.Unix(c.Exp, 0)
}

// TestExpiredPayloadURLFailsTheRun: a presigned URL used after its expiry
// is refused by the store, and the daemon fails the invocation saying so
// (nothing is spawned). A proxy between daemon and control plane holds the
// daemon's download (not the CLI's upload) until the clock is past the URL's expiry (the event
// the test waits for), with presigned URLs valid for one second.
func TestExpiredPayloadURLFailsTheRun(t *testing.T) {
	t.Parallel()
	addr := harness.FreeAddr(t)
	target, _ := url.Parse("http://" + addr)
	rp := httputil.NewSingleHostReverseProxy(target)
	var held atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/payloads/") {
			exp := payloadURLExpiry(t, r.URL.Path)
			held.Add(1)
			for !time.Now().After(exp.Add(time.Second)) {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(time.Until(exp.Add(time.Second + time.Millisecond))):
				}
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	cp := harness.StartControlPlane(t, harness.CPOptions{Addr: addr, Args: []string{"--payload-url-ttl", "1s", "--public-url", proxy.URL}})
	marker := filepath.Join(t.TempDir(), "spawned")
	id := submitInv(t, cp, "--queue", "expiry", "--runner", "process", "--args-file", writeTemp(t, "args.bin", randBytes(t, 300<<10)),
		"--script", writeTemp(t, "touch.sh", []byte("touch "+marker)))
	cp.StartDaemon(t, harness.DaemonOptions{Label: "late", Queue: "expiry", Runners: []string{"process"}, ServerURL: proxy.URL})
	inv := waitInvState(t, cp, id, operatorapi.InvocationFailed, 60*time.Second)
	if inv.Error == nil || !strings.Contains(inv.Error.Message, "expired") || !strings.Contains(inv.Error.Message, "403") {
		t.Fatalf("a run whose payload URL expired: %+v, want it failed naming the expiry", inv.Error)
	}
	if held.Load() == 0 {
		t.Fatal("the daemon's download did not go through the proxy")
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the function ran without its args")
	}
	t.Logf("reported: %s: %s", inv.Error.Type, inv.Error.Message)
}

// TestServeRefusesABucketItCannotUse: a bucket that does not exist, refused
// credentials and an endpoint that is down each stop serve before it
// listens, with a message naming the fix; bad flags are usage errors.
func TestServeRefusesABucketItCannotUse(t *testing.T) {
	t.Parallel()
	bins := harness.Binaries(t)
	moto := realparts.StartMoto(t)
	moto.CreateBucket(t, "there")
	strict := realparts.StartMoto(t, realparts.MotoAuthenticate())
	down := "http://" + harness.FreeAddr(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"missing bucket", []string{"--blobs", "s3://not-there/cp", "--blobs-endpoint", moto.URL}, 1, "bucket not-there does not exist"},
		{"refused credentials", []string{"--blobs", "s3://there/cp", "--blobs-endpoint", strict.URL}, 1, "refused"},
		{"endpoint down", []string{"--blobs", "s3://there/cp", "--blobs-endpoint", down}, 1, "does not answer"},
		{"not a bucket URL", []string{"--blobs", "gs://there"}, 2, "want local or s3://BUCKET/PREFIX"},
		{"bad bucket name", []string{"--blobs", "s3://No_Such/x", "--blobs-endpoint", moto.URL}, 2, "--blobs"},
		{"endpoint without a bucket", []string{"--blobs-endpoint", moto.URL}, 2, "--blobs-endpoint is for a bucket"},
		{"negative retention", []string{"--payload-retention", "-1h"}, 2, "--payload-retention"},
		{"tiny URL ttl", []string{"--payload-url-ttl", "10ms"}, 2, "--payload-url-ttl"},
	} {
		addr := harness.FreeAddr(t)
		cmd := exec.Command(bins.Lakeshore, append([]string{"serve", "--addr", addr, "--data", t.TempDir(), "--no-credentials"}, tc.args...)...)
		cmd.Env = append(append(os.Environ(), "HOME="+t.TempDir(), "LAKESHORE_ADMIN_TOKEN=x"), moto.Env...)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != tc.code || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: exit %d, want %d with %q:\n%s", tc.name, code, tc.code, tc.want, out)
		}
		if strings.Contains(string(out), "control plane listening") {
			t.Errorf("%s: serve listened before it refused:\n%s", tc.name, out)
		}
	}
}
