package cli_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"nymph/lakeshore/blobs"
	"nymph/lakeshore/releases"
	"nymph/test/realparts"
)

// migrateEnv is a moto server with one fresh bucket, its credentials in
// the process environment as the AWS chain reads them.
type migrateEnv struct {
	moto   *realparts.Moto
	bucket string
}

func newMigrateEnv(t *testing.T) *migrateEnv {
	t.Helper()
	m := realparts.StartMoto(t)
	m.Setenv(t)
	e := &migrateEnv{moto: m, bucket: "lakeshore-migrate"}
	// moto takes an unsigned path-style PUT as CreateBucket.
	req, err := http.NewRequest(http.MethodPut, m.URL+"/"+e.bucket, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("create bucket %s: %s", e.bucket, resp.Status)
	}
	return e
}

func (e *migrateEnv) url() string { return "s3://" + e.bucket + "/cp" }

func (e *migrateEnv) migrate(t *testing.T, args ...string) result {
	t.Helper()
	return runCLI(t, runOpts{}, nil, append([]string{"blobs", "migrate", "--to", e.url(), "--endpoint", e.moto.URL, "--region", e.moto.Region}, args...)...)
}

// target opens the bucket the way the control plane will.
func (e *migrateEnv) target(t *testing.T) blobs.Store {
	t.Helper()
	bucket, prefix, err := blobs.ParseS3URL(e.url())
	if err != nil {
		t.Fatal(err)
	}
	st, err := blobs.OpenS3(context.Background(), blobs.S3Config{Bucket: bucket, Prefix: prefix, Endpoint: e.moto.URL, Region: e.moto.Region})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// dataDir is a serve --data directory with payloads and releases in it.
type dataDir struct {
	dir      string
	payloads map[string][]byte // by key
	releases map[string][]byte // by version/triple
}

func newDataDir(t *testing.T) *dataDir {
	t.Helper()
	ctx := context.Background()
	d := &dataDir{dir: t.TempDir(), payloads: map[string][]byte{}, releases: map[string][]byte{}}
	local, err := blobs.NewLocal(d.dir, blobs.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, size := range []int{10, 300 << 10, 1 << 20} {
		key := fmt.Sprintf("payloads/ns%d/inv-%d.args", i%2, i)
		body := randomBlob(t, size)
		if _, err := local.Put(ctx, key, bytes.NewReader(body), blobs.PutOptions{Size: int64(size), SHA256: sum(body), ContentType: "application/msgpack"}); err != nil {
			t.Fatal(err)
		}
		d.payloads[key] = body
	}
	rs, err := releases.Open(filepath.Join(d.dir, "releases"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]string{{"0.1.0", "x86_64-unknown-linux-gnu"}, {"0.2.0", "aarch64-unknown-linux-gnu"}} {
		body := randomBlob(t, 200<<10)
		if _, err := rs.Publish(ctx, bytes.NewReader(body), p[0], p[1]); err != nil {
			t.Fatal(err)
		}
		d.releases[p[0]+"/"+p[1]] = body
	}
	return d
}

func randomBlob(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

type migrateSummary struct {
	From, To string
	DryRun   bool
	Payloads struct {
		Copied, Skipped, Failed int
		Bytes                   int64
	}
	Releases struct {
		Copied, Skipped, Failed int
		Bytes                   int64
	}
	Failures []struct{ Key, Error string }
}

func decodeSummary(t *testing.T, r result) migrateSummary {
	t.Helper()
	var s migrateSummary
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("--json output: %v\n%s\nstderr: %s", err, r.stdout, r.stderr)
	}
	var doc any
	_ = json.Unmarshal([]byte(r.stdout), &doc)
	if bad := badKeys("", doc); len(bad) > 0 {
		t.Errorf("keys not camelCase: %v", bad)
	}
	return s
}

func TestBlobsMigrate(t *testing.T) {
	e := newMigrateEnv(t)
	d := newDataDir(t)
	ctx := context.Background()

	dry := e.migrate(t, "--from", "local:"+d.dir, "--dry-run", "--json")
	if dry.code != 0 {
		t.Fatalf("dry run: %+v", dry)
	}
	if s := decodeSummary(t, dry); !s.DryRun || s.Payloads.Copied != 3 || s.Releases.Copied != 2 {
		t.Fatalf("dry run summary %+v", s)
	}
	dst := e.target(t)
	if keys := listKeys(t, dst); len(keys) != 0 {
		t.Fatalf("a dry run copied %v", keys)
	}

	r := e.migrate(t, "--from", "local:"+d.dir, "--json")
	if r.code != 0 {
		t.Fatalf("migrate: %+v", r)
	}
	s := decodeSummary(t, r)
	var payloadBytes int64
	for _, b := range d.payloads {
		payloadBytes += int64(len(b))
	}
	if s.Payloads.Copied != 3 || s.Payloads.Skipped != 0 || s.Payloads.Failed != 0 || s.Payloads.Bytes != payloadBytes ||
		s.Releases.Copied != 2 || s.Releases.Failed != 0 || s.Releases.Bytes != 2*200<<10 || len(s.Failures) != 0 {
		t.Fatalf("summary %+v", s)
	}
	if !strings.Contains(r.stderr, "payloads 3/3 ") || !strings.Contains(r.stderr, "releases 2/2 0.2.0/aarch64-unknown-linux-gnu: copied") {
		t.Fatalf("progress on stderr:\n%s", r.stderr)
	}

	// Every payload is in the bucket under its key, with its sha256, and
	// reads back whole.
	for key, body := range d.payloads {
		info, err := dst.Stat(ctx, key)
		if err != nil || info.SHA256 != sum(body) || info.Size != int64(len(body)) {
			t.Fatalf("%s in the bucket: %+v %v", key, info, err)
		}
		rc, _, err := dst.Open(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("%s reads back %d bytes, %v", key, len(got), err)
		}
	}
	// The releases are a catalogue the control plane's Bucket reads.
	cat := releases.NewBucket(dst, releases.DefaultBucketPrefix)
	all, err := cat.ListContext(ctx)
	if err != nil || len(all) != 2 {
		t.Fatalf("releases in the bucket: %+v %v", all, err)
	}
	for _, rel := range all {
		body := d.releases[rel.Version+"/"+rel.Triple]
		if rel.SHA256 != sum(body) || rel.Size != int64(len(body)) {
			t.Fatalf("release %+v, want sha256 %s", rel, sum(body))
		}
		info, err := dst.Stat(ctx, cat.Key(rel.Version, rel.Triple))
		if err != nil || info.SHA256 != sum(body) {
			t.Fatalf("binary of %s: %+v %v", rel.Version, info, err)
		}
	}

	// A second run copies nothing and says so.
	again := e.migrate(t, "--from", "local:"+d.dir)
	if again.code != 0 || !strings.Contains(again.stdout, "nothing to copy") ||
		!strings.Contains(again.stdout, "payloads: 0 copied (0 B), 3 skipped") || !strings.Contains(again.stdout, "releases: 0 copied (0 B), 2 skipped") {
		t.Fatalf("second run: %+v", again)
	}
}

func TestBlobsMigrateCorruptPayloadFails(t *testing.T) {
	e := newMigrateEnv(t)
	d := newDataDir(t)
	const bad = "payloads/ns1/inv-1.args"
	// The bytes change after the metadata recorded their sha256 (bit rot,
	// a hand edit): same size, other content.
	p := filepath.Join(d.dir, filepath.FromSlash(bad))
	body, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	body[len(body)/2] ^= 0xff
	if err := os.WriteFile(p, body, 0o600); err != nil {
		t.Fatal(err)
	}

	// And a release binary rots the same way under its catalogue entry.
	const badRelease = "releases/0.2.0/nymph-aarch64-unknown-linux-gnu"
	p = filepath.Join(d.dir, filepath.FromSlash(badRelease))
	if body, err = os.ReadFile(p); err != nil {
		t.Fatal(err)
	}
	body[7] ^= 0xff
	if err := os.WriteFile(p, body, 0o755); err != nil {
		t.Fatal(err)
	}

	// A file with no metadata at all has no sha256 to be checked by.
	const bare = "payloads/ns0/no-metadata"
	if err := os.WriteFile(filepath.Join(d.dir, filepath.FromSlash(bare)), []byte("bytes"), 0o600); err != nil {
		t.Fatal(err)
	}

	r := e.migrate(t, "--from", "local:"+d.dir, "--json")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1: %+v", r.code, r)
	}
	s := decodeSummary(t, r)
	if s.Payloads.Copied != 2 || s.Payloads.Failed != 2 || s.Releases.Copied != 1 || s.Releases.Failed != 1 ||
		len(s.Failures) != 3 || s.Failures[0].Key != bare || s.Failures[1].Key != bad || s.Failures[2].Key != badRelease {
		t.Fatalf("summary %+v", s)
	}
	if !strings.Contains(r.stderr, "lakeshore: 3 blob(s) failed") || !strings.Contains(r.stderr, "\n  "+bad+": ") ||
		!strings.Contains(r.stderr, "\n  "+badRelease+": ") || !strings.Contains(r.stderr, "sha256 mismatch") ||
		!strings.Contains(r.stderr, "\n  "+bare+": it has no metadata") {
		t.Fatalf("stderr does not name every failure and why:\n%s", r.stderr)
	}
	dst := e.target(t)
	for _, key := range []string{bare, bad, badRelease, badRelease + ".sha256"} {
		if _, err := dst.Stat(context.Background(), key); !errors.Is(err, blobs.ErrNotFound) {
			t.Fatalf("%s of the corrupt source is in the bucket: %v", key, err)
		}
	}
	// Run again: the good ones are skipped, the bad ones still fail.
	again := e.migrate(t, "--from", "local:"+d.dir)
	if again.code != 1 || !strings.Contains(again.stdout, "payloads: 0 copied (0 B), 2 skipped (already there), 2 failed") ||
		!strings.Contains(again.stdout, "releases: 0 copied (0 B), 1 skipped (already there), 1 failed") {
		t.Fatalf("second run: %+v", again)
	}
}

func TestBlobsMigrateBadInput(t *testing.T) {
	data := newDataDir(t).dir
	empty := t.TempDir()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--to", "s3://b"}, []string{"--from is required", "local:"}},
		{[]string{"--from", "s3://b", "--to", "s3://b"}, []string{`--from "s3://b"`, "want local:DIR"}},
		{[]string{"--from", data, "--to", "s3://b"}, []string{"--from", "want local:DIR"}},
		{[]string{"--from", "local:" + empty, "--to", "s3://b"}, []string{"--from", "not a data directory", "neither payloads/ nor releases/"}},
		{[]string{"--from", "local:" + filepath.Join(empty, "nope"), "--to", "s3://b"}, []string{"not a data directory"}},
		{[]string{"--from", "local:" + data}, []string{"--to is required", "s3://"}},
		{[]string{"--from", "local:" + data, "--to", "gs://b/p"}, []string{`--to "gs://b/p"`, "want s3://BUCKET"}},
		{[]string{"--from", "local:" + data, "--to", "/tmp/x"}, []string{"--to", "want s3://BUCKET"}},
		{[]string{"--from", "local:" + data, "--to", "s3://b", "extra"}, []string{"takes no arguments"}},
		{[]string{"--from", "local:" + data, "--to", "s3://Bad_Bucket/p"}, []string{"--to", "Bad_Bucket"}},
		{[]string{"--from", "local:" + data, "--to", "s3://b/p?region=x"}, []string{"--to", "query"}},
		{[]string{"--from", "local:" + data, "--to", "s3://bucket", "--endpoint", "127.0.0.1:9000"}, []string{"--endpoint", "http://"}},
	} {
		r := runCLI(t, runOpts{}, nil, append([]string{"blobs", "migrate"}, c.args...)...)
		if r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage): %s", c.args, r.code, r.stderr)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%v: stderr %q does not say %q", c.args, r.stderr, w)
			}
		}
	}
}

func TestBlobsMigrateMissingBucket(t *testing.T) {
	e := newMigrateEnv(t)
	d := newDataDir(t)
	r := runCLI(t, runOpts{}, nil, "blobs", "migrate", "--from", "local:"+d.dir, "--to", "s3://no-such-bucket/cp", "--endpoint", e.moto.URL, "--region", e.moto.Region)
	if r.code != 1 || !strings.Contains(r.stderr, "no-such-bucket") || r.stdout != "" {
		t.Fatalf("missing bucket: %+v", r)
	}
	if keys := listKeys(t, e.target(t)); len(keys) != 0 {
		t.Fatalf("copied %v somewhere", keys)
	}
}

func TestBlobsMigrateHelp(t *testing.T) {
	r := runCLI(t, runOpts{}, nil, "blobs", "migrate", "--help")
	for _, w := range []string{"--from local:DIR", "--to s3://", "--endpoint", "--dry-run", "--json", "Examples:", "lakeshore blobs migrate --from local:/var/lib/lakeshore --to s3://", "sha256", "Exit codes:"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("help lacks %q:\n%s", w, r.stdout)
		}
	}
	if r := runCLI(t, runOpts{}, nil, "blobs"); r.code != 0 || !strings.Contains(r.stdout, "migrate") {
		t.Errorf("lakeshore blobs: %+v", r)
	}
}

func listKeys(t *testing.T, st blobs.Store) []string {
	t.Helper()
	var keys []string
	if err := st.List(context.Background(), "", func(in blobs.Info) error {
		keys = append(keys, in.Key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}
