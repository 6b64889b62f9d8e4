// Package blobstest is the conformance suite every blobs.Store passes:
// what the control plane relies on of a store (round trips with their
// sha256, replacement, missing keys, listing order, refusals that leave
// nothing behind, presigned GET and PUT over real HTTP, expiry, deletion)
// whichever implementation is behind it.
package blobstest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/blobs"
)

// Fixture is one fresh, empty store and what the suite needs around it.
type Fixture struct {
	Store blobs.Store
	// Base resolves relative presigned URLs (Local's), e.g. the URL of
	// an httptest.Server serving the store's handler.
	Base   string
	Client *http.Client
	// Now is the store's clock, Advance moves it.
	Now     func() time.Time
	Advance func(d time.Duration)
	// EnforcesExpiry: the backend refuses a presigned URL after its
	// expiry (an emulator may not).
	EnforcesExpiry bool
	// VerifiesUploads: the backend refuses a presigned PUT whose length
	// or bytes are not what was signed; without it the suite checks that
	// Open catches the mismatch instead.
	VerifiesUploads bool
}

// authorizer is a store whose URLs carry a token it checks itself (Local):
// the suite reads their expiry through it.
type authorizer interface {
	Authorize(token, op string) (blobs.Grant, error)
}

// Run runs every case, each on a store open returns for it.
func Run(t *testing.T, open func(t *testing.T) Fixture) {
	cases := []struct {
		name string
		fn   func(t *testing.T, f Fixture)
	}{
		{"RoundTrip", roundTrip},
		{"Empty", empty},
		{"Replace", replace},
		{"Missing", missing},
		{"List", list},
		{"InvalidKeys", invalidKeys},
		{"PutMismatch", putMismatch},
		{"PresignedGet", presignedGet},
		{"PresignedPut", presignedPut},
		{"PresignedPutAnySize", presignedPutAnySize},
		{"PresignedPutMismatch", presignedPutMismatch},
		{"Expiry", expiry},
		{"DeleteThenStat", deleteThenStat},
		{"ConcurrentPuts", concurrentPuts},
		{"ConcurrentReplace", concurrentReplace},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := open(t)
			if f.Client == nil {
				f.Client = http.DefaultClient
			}
			c.fn(t, f)
		})
	}
}

// hideSeek makes a reader that is not an io.ReadSeeker, as a request body
// is, so a store cannot rewind it.
type hideSeek struct{ io.Reader }

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// pattern is n bytes that differ by seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ seed
	}
	return b
}

func put(t *testing.T, s blobs.Store, key string, b []byte, ct string) blobs.Info {
	t.Helper()
	info, err := s.Put(context.Background(), key, bytes.NewReader(b), blobs.PutOptions{Size: int64(len(b)), SHA256: sum(b), ContentType: ct})
	if err != nil {
		t.Fatalf("Put %s: %v", key, err)
	}
	return info
}

// read opens key and reads it whole, the reader's error included.
func read(t *testing.T, s blobs.Store, key string) ([]byte, blobs.Info, error) {
	t.Helper()
	rc, info, err := s.Open(context.Background(), key)
	if err != nil {
		return nil, info, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return b, info, err
}

func mustRead(t *testing.T, s blobs.Store, key string, want []byte) blobs.Info {
	t.Helper()
	b, info, err := read(t, s, key)
	if err != nil {
		t.Fatalf("Open %s: %v", key, err)
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("Open %s: %d bytes (sha256 %s), want %d (%s)", key, len(b), sum(b), len(want), sum(want))
	}
	return info
}

func wantInfo(t *testing.T, what string, got blobs.Info, key string, b []byte, ct string) {
	t.Helper()
	if got.Key != key || got.Size != int64(len(b)) || got.SHA256 != sum(b) || got.ContentType != ct {
		t.Fatalf("%s: %+v, want key %s size %d sha256 %s content type %s", what, got, key, len(b), sum(b), ct)
	}
	if got.Modified.IsZero() {
		t.Fatalf("%s: no modification time", what)
	}
}

func wantNotFound(t *testing.T, s blobs.Store, key string) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Stat(ctx, key); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("Stat %s: %v, want ErrNotFound", key, err)
	}
	if rc, _, err := s.Open(ctx, key); !errors.Is(err, blobs.ErrNotFound) {
		if rc != nil {
			rc.Close()
		}
		t.Fatalf("Open %s: %v, want ErrNotFound", key, err)
	}
}

func roundTrip(t *testing.T, f Fixture) {
	ctx := context.Background()
	b := pattern(300<<10, 1)
	info := put(t, f.Store, "payloads/ns1/round-trip", b, "text/plain")
	wantInfo(t, "Put", info, "payloads/ns1/round-trip", b, "text/plain")
	st, err := f.Store.Stat(ctx, "payloads/ns1/round-trip")
	if err != nil {
		t.Fatal(err)
	}
	wantInfo(t, "Stat", st, "payloads/ns1/round-trip", b, "text/plain")
	wantInfo(t, "Open", mustRead(t, f.Store, "payloads/ns1/round-trip", b), "payloads/ns1/round-trip", b, "text/plain")

	// Nothing declared, from a reader that cannot rewind: the store hashes
	// what came and defaults the content type.
	b2 := pattern(5<<20+7, 2)
	info, err = f.Store.Put(ctx, "releases/v1.2.3/nymph-linux-amd64", hideSeek{bytes.NewReader(b2)}, blobs.PutOptions{Size: -1})
	if err != nil {
		t.Fatal(err)
	}
	wantInfo(t, "Put of unknown size", info, "releases/v1.2.3/nymph-linux-amd64", b2, blobs.DefaultContentType)
	mustRead(t, f.Store, "releases/v1.2.3/nymph-linux-amd64", b2)
}

func empty(t *testing.T, f Fixture) {
	info := put(t, f.Store, "e/empty", nil, "")
	wantInfo(t, "Put", info, "e/empty", nil, blobs.DefaultContentType)
	mustRead(t, f.Store, "e/empty", []byte{})
}

func replace(t *testing.T, f Fixture) {
	put(t, f.Store, "r/key", pattern(1000, 3), "text/plain")
	b := pattern(10, 4)
	put(t, f.Store, "r/key", b, "application/json")
	st, err := f.Store.Stat(context.Background(), "r/key")
	if err != nil {
		t.Fatal(err)
	}
	wantInfo(t, "Stat after replace", st, "r/key", b, "application/json")
	mustRead(t, f.Store, "r/key", b)
}

func missing(t *testing.T, f Fixture) {
	ctx := context.Background()
	wantNotFound(t, f.Store, "no/such/key")
	if _, err := f.Store.PresignGet(ctx, "no/such/key", time.Minute); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("PresignGet: %v, want ErrNotFound", err)
	}
	if err := f.Store.Delete(ctx, "no/such/key"); err != nil {
		t.Fatalf("Delete of a missing key: %v", err)
	}
}

func listKeys(t *testing.T, s blobs.Store, prefix string) []string {
	t.Helper()
	var keys []string
	err := s.List(context.Background(), prefix, func(i blobs.Info) error {
		keys = append(keys, i.Key)
		if i.Size < 0 || i.Modified.IsZero() {
			return fmt.Errorf("List %q: %s has size %d, modified %s", prefix, i.Key, i.Size, i.Modified)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("List %q: %v", prefix, err)
	}
	return keys
}

func list(t *testing.T, f Fixture) {
	// In key order "-" < "." < "/", so a walk of directories in name
	// order would get these wrong.
	all := []string{"l/a-b", "l/a.c", "l/a/x", "l/b", "l2/q", "m/z"}
	for _, i := range []int{3, 5, 0, 2, 4, 1} {
		put(t, f.Store, all[i], []byte(all[i]), "")
	}
	for _, c := range []struct {
		prefix string
		want   []string
	}{
		{"", all},
		{"l/", all[:4]},
		{"l", all[:5]},
		{"l/a", all[:3]},
		{"l/a/", all[2:3]},
		{"m/z", all[5:]},
		{"nope/", nil},
		{"../", nil},
	} {
		if got := listKeys(t, f.Store, c.prefix); !slices.Equal(got, c.want) {
			t.Errorf("List %q: %q, want %q", c.prefix, got, c.want)
		}
	}
	sizes := map[string]int64{}
	if err := f.Store.List(context.Background(), "", func(i blobs.Info) error { sizes[i.Key] = i.Size; return nil }); err != nil {
		t.Fatal(err)
	}
	for _, k := range all {
		if sizes[k] != int64(len(k)) {
			t.Errorf("List: %s has size %d, want %d", k, sizes[k], len(k))
		}
	}
	stop := errors.New("stop")
	n := 0
	err := f.Store.List(context.Background(), "", func(blobs.Info) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Fatalf("List whose fn fails: %v after %d calls, want stop after 1", err, n)
	}
}

func invalidKeys(t *testing.T, f Fixture) {
	ctx := context.Background()
	for _, key := range []string{"", "/a", "a/", "a//b", "../x", "a/../b", ".meta/x", "a/.meta", "a b", "a/b/c/d/e/f/g/h/i", strings.Repeat("k", 201)} {
		check := func(op string, err error) {
			t.Helper()
			if !errors.Is(err, blobs.ErrInvalidKey) {
				t.Errorf("%s %q: %v, want ErrInvalidKey", op, key, err)
			}
		}
		_, err := f.Store.Put(ctx, key, strings.NewReader("x"), blobs.PutOptions{Size: 1})
		check("Put", err)
		_, err = f.Store.Stat(ctx, key)
		check("Stat", err)
		_, _, err = f.Store.Open(ctx, key)
		check("Open", err)
		check("Delete", f.Store.Delete(ctx, key))
		_, err = f.Store.PresignGet(ctx, key, time.Minute)
		check("PresignGet", err)
		_, err = f.Store.PresignPut(ctx, key, blobs.PutOptions{Size: 1}, time.Minute)
		check("PresignPut", err)
	}
	if keys := listKeys(t, f.Store, ""); len(keys) != 0 {
		t.Fatalf("refused keys left blobs: %q", keys)
	}
}

func putMismatch(t *testing.T, f Fixture) {
	ctx := context.Background()
	b := pattern(64<<10, 5)
	old := pattern(100, 6)
	put(t, f.Store, "m/existing", old, "text/plain")
	for _, c := range []struct {
		name string
		o    blobs.PutOptions
		want error
		says string
	}{
		{"short", blobs.PutOptions{Size: int64(len(b)) + 1}, blobs.ErrSize, "declared " + strconv.Itoa(len(b)+1) + " bytes, got " + strconv.Itoa(len(b))},
		{"long", blobs.PutOptions{Size: int64(len(b)) - 1}, blobs.ErrSize, "declared " + strconv.Itoa(len(b)-1) + " bytes, got more"},
		{"over max", blobs.PutOptions{Size: -1, Max: int64(len(b)) - 1}, blobs.ErrSize, "over the " + strconv.Itoa(len(b)-1) + " byte cap"},
		{"sha256", blobs.PutOptions{Size: int64(len(b)), SHA256: sum(old)}, blobs.ErrChecksum, "declared sha256 " + sum(old) + ", got " + sum(b)},
		{"sha256 unknown size", blobs.PutOptions{Size: -1, SHA256: sum(old)}, blobs.ErrChecksum, "got " + sum(b)},
	} {
		for _, seek := range []bool{true, false} {
			var r io.Reader = bytes.NewReader(b)
			if !seek {
				r = hideSeek{r}
			}
			for _, key := range []string{"m/new", "m/existing"} {
				_, err := f.Store.Put(ctx, key, r, c.o)
				if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
					t.Fatalf("%s (seekable %v) into %s: %v, want %v saying %q", c.name, seek, key, err, c.want, c.says)
				}
				r = bytes.NewReader(b)
				if !seek {
					r = hideSeek{r}
				}
			}
			wantNotFound(t, f.Store, "m/new")
			mustRead(t, f.Store, "m/existing", old)
		}
	}
	if _, err := f.Store.Put(ctx, "m/x", bytes.NewReader(b), blobs.PutOptions{Size: int64(len(b)), SHA256: "not-hex"}); !errors.Is(err, blobs.ErrChecksum) {
		t.Fatalf("Put with a malformed sha256: %v, want ErrChecksum", err)
	}
	if got := listKeys(t, f.Store, "m/"); !slices.Equal(got, []string{"m/existing"}) {
		t.Fatalf("refused Puts left blobs: List m/ is %q", got)
	}
}

// resolve makes a Local presigned URL absolute.
func resolve(f Fixture, p blobs.Presigned) blobs.Presigned {
	if strings.HasPrefix(p.URL, "/") {
		p.URL = strings.TrimRight(f.Base, "/") + p.URL
	}
	return p
}

// wantExpires checks a URL's stated expiry is the store's now plus ttl.
func wantExpires(t *testing.T, p blobs.Presigned, now time.Time, ttl time.Duration) {
	t.Helper()
	if want := now.Add(ttl).Truncate(time.Second); !p.Expires.Truncate(time.Second).Equal(want) {
		t.Fatalf("Expires %s, want %s (now %s + %s)", p.Expires, want, now, ttl)
	}
}

func presignedGet(t *testing.T, f Fixture) {
	ctx := context.Background()
	b := pattern(200<<10, 7)
	put(t, f.Store, "g/key", b, "text/csv")
	now := f.Now()
	p, err := f.Store.PresignGet(ctx, "g/key", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p.Method != http.MethodGet {
		t.Fatalf("method %q", p.Method)
	}
	wantExpires(t, p, now, 10*time.Minute)
	resp, err := blobs.Do(ctx, f.Client, resolve(f, p), nil, 0)
	if err != nil {
		t.Fatalf("presigned GET: %v", err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("presigned GET: %d bytes, %v; want %d", len(got), err, len(b))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/csv" {
		t.Fatalf("presigned GET: Content-Type %q", ct)
	}
}

func presignedPut(t *testing.T, f Fixture) {
	ctx := context.Background()
	b := pattern(300<<10, 8)
	now := f.Now()
	p, err := f.Store.PresignPut(ctx, "p/key", blobs.PutOptions{Size: int64(len(b)), SHA256: sum(b), ContentType: "application/x-tar"}, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p.Method != http.MethodPut {
		t.Fatalf("method %q", p.Method)
	}
	wantExpires(t, p, now, 5*time.Minute)
	resp, err := blobs.Do(ctx, f.Client, resolve(f, p), bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatalf("presigned PUT: %v", err)
	}
	resp.Body.Close()
	st, err := f.Store.Stat(ctx, "p/key")
	if err != nil {
		t.Fatal(err)
	}
	wantInfo(t, "Stat after presigned PUT", st, "p/key", b, "application/x-tar")
	mustRead(t, f.Store, "p/key", b)
}

// presignedPutAnySize: a store may presign a put of unknown size (Local,
// which caps it itself) or refuse with ErrSize (S3, which cannot cap it).
func presignedPutAnySize(t *testing.T, f Fixture) {
	ctx := context.Background()
	p, err := f.Store.PresignPut(ctx, "p/any", blobs.PutOptions{Size: -1, Max: 1000}, time.Minute)
	if err != nil {
		if !errors.Is(err, blobs.ErrSize) {
			t.Fatalf("PresignPut of unknown size: %v, want it granted or ErrSize", err)
		}
		t.Logf("this store presigns no put of unknown size: %v", err)
		return
	}
	b := pattern(999, 9)
	resp, err := blobs.Do(ctx, f.Client, resolve(f, p), bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatalf("presigned PUT of unknown size: %v", err)
	}
	resp.Body.Close()
	mustRead(t, f.Store, "p/any", b)
	p, err = f.Store.PresignPut(ctx, "p/over", blobs.PutOptions{Size: -1, Max: 1000}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	big := pattern(1001, 9)
	_, err = blobs.Do(ctx, f.Client, resolve(f, p), bytes.NewReader(big), int64(len(big)))
	var se *blobs.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("presigned PUT over the cap: %v, want 413", err)
	}
	wantNotFound(t, f.Store, "p/over")
}

func presignedPutMismatch(t *testing.T, f Fixture) {
	ctx := context.Background()
	b := pattern(4096, 10)
	other := pattern(4096, 11)
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"longer", append(slices.Clone(b), 'x')},
		{"shorter", b[:len(b)-1]},
		{"other bytes", other},
	} {
		key := "pm/" + strings.ReplaceAll(c.name, " ", "-")
		p, err := f.Store.PresignPut(ctx, key, blobs.PutOptions{Size: int64(len(b)), SHA256: sum(b)}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		_, err = blobs.Do(ctx, f.Client, resolve(f, p), bytes.NewReader(c.body), int64(len(c.body)))
		if f.VerifiesUploads {
			var se *blobs.StatusError
			if !errors.As(err, &se) || se.Code/100 != 4 {
				t.Fatalf("%s: presigned PUT of %d bytes: %v, want a 4xx", c.name, len(c.body), err)
			}
			wantNotFound(t, f.Store, key)
			continue
		}
		// The backend took bytes that are not what was signed (the
		// fixture says it checks neither length nor checksum): Open must
		// not pass them off as the blob.
		if err != nil {
			t.Logf("%s: refused anyway: %v", c.name, err)
			continue
		}
		if _, _, err := read(t, f.Store, key); !errors.Is(err, blobs.ErrChecksum) {
			t.Fatalf("%s: an upload the backend did not verify reads back with %v, want ErrChecksum", c.name, err)
		}
		t.Logf("%s: the backend took it (it verifies no uploads); Open caught it with ErrChecksum", c.name)
	}
}

func expiry(t *testing.T, f Fixture) {
	ctx := context.Background()
	b := pattern(1000, 12)
	put(t, f.Store, "x/key", b, "")
	const ttl = 90 * time.Second
	now := f.Now()
	pg, err := f.Store.PresignGet(ctx, "x/key", ttl)
	if err != nil {
		t.Fatal(err)
	}
	pp, err := f.Store.PresignPut(ctx, "x/new", blobs.PutOptions{Size: int64(len(b))}, ttl)
	if err != nil {
		t.Fatal(err)
	}
	wantExpires(t, pg, now, ttl)
	wantExpires(t, pp, now, ttl)
	for _, p := range []blobs.Presigned{pg, pp} {
		u, err := url.Parse(p.URL)
		if err != nil {
			t.Fatal(err)
		}
		// A SigV4 URL states its expiry as its signing time and a
		// lifetime, which the backend checks.
		if q := u.Query(); q.Has("X-Amz-Expires") {
			if got := q.Get("X-Amz-Expires"); got != strconv.Itoa(int(ttl.Seconds())) {
				t.Fatalf("%s: X-Amz-Expires %s, want %d", p.Method, got, int(ttl.Seconds()))
			}
			if got, want := q.Get("X-Amz-Date"), now.UTC().Format("20060102T150405Z"); got != want {
				t.Fatalf("%s: X-Amz-Date %s, want the store's now %s", p.Method, got, want)
			}
		}
	}

	f.Advance(ttl - time.Second)
	resp, err := blobs.Do(ctx, f.Client, resolve(f, pg), nil, 0)
	if err != nil {
		t.Fatalf("presigned GET a second before expiry: %v", err)
	}
	resp.Body.Close()

	f.Advance(2 * time.Second)
	if a, ok := f.Store.(authorizer); ok {
		// A token the store checks itself states its expiry in its
		// signed body: the store must read it as expired now.
		for op, p := range map[string]blobs.Presigned{"get": pg, "put": pp} {
			token := p.URL[strings.LastIndex(p.URL, "/")+1:]
			if _, err := a.Authorize(token, op); !errors.Is(err, blobs.ErrExpired) {
				t.Fatalf("Authorize %s after expiry: %v, want ErrExpired", op, err)
			}
		}
	}
	if !f.EnforcesExpiry {
		t.Logf("the backend does not enforce expiry (the fixture says): the URLs' stated expiry was checked instead")
		return
	}
	var se *blobs.StatusError
	_, err = blobs.Do(ctx, f.Client, resolve(f, pg), nil, 0)
	if !errors.As(err, &se) || se.Code != http.StatusForbidden || !strings.Contains(strings.ToLower(se.Body), "expired") {
		t.Fatalf("presigned GET after expiry: %v, want 403 saying expired", err)
	}
	_, err = blobs.Do(ctx, f.Client, resolve(f, pp), bytes.NewReader(b), int64(len(b)))
	if !errors.As(err, &se) || se.Code != http.StatusForbidden || !strings.Contains(strings.ToLower(se.Body), "expired") {
		t.Fatalf("presigned PUT after expiry: %v, want 403 saying expired", err)
	}
	wantNotFound(t, f.Store, "x/new")
}

// deleteThenStat is what payload retention relies on: a deleted blob is
// gone for every reader.
func deleteThenStat(t *testing.T, f Fixture) {
	ctx := context.Background()
	put(t, f.Store, "d/key", pattern(500, 13), "")
	put(t, f.Store, "d/keep", []byte("d/keep"), "")
	if err := f.Store.Delete(ctx, "d/key"); err != nil {
		t.Fatal(err)
	}
	wantNotFound(t, f.Store, "d/key")
	if _, err := f.Store.PresignGet(ctx, "d/key", time.Minute); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("PresignGet after Delete: %v", err)
	}
	if got := listKeys(t, f.Store, "d/"); !slices.Equal(got, []string{"d/keep"}) {
		t.Fatalf("List after Delete: %q", got)
	}
	if err := f.Store.Delete(ctx, "d/key"); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
}

func concurrentPuts(t *testing.T, f Fixture) {
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			b := pattern(64<<10+i, byte(i))
			_, errs[i] = f.Store.Put(context.Background(), "c/key-"+strconv.Itoa(i), hideSeek{bytes.NewReader(b)}, blobs.PutOptions{Size: -1, SHA256: sum(b)})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Put %d: %v", i, err)
		}
		mustRead(t, f.Store, "c/key-"+strconv.Itoa(i), pattern(64<<10+i, byte(i)))
	}
}

// concurrentReplace: readers of a key that writers keep replacing read one
// whole version or another, never one Put's bytes under another's sha256.
func concurrentReplace(t *testing.T, f Fixture) {
	const writers, rounds = 4, 5
	versions := map[string]bool{}
	for i := range writers {
		versions[sum(pattern(20<<10+i, byte(i)))] = true
	}
	put(t, f.Store, "cr/key", pattern(20<<10, 0), "")
	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, writers*rounds+64)
	for i := range writers {
		wg.Go(func() {
			b := pattern(20<<10+i, byte(i))
			for range rounds {
				if _, err := f.Store.Put(context.Background(), "cr/key", bytes.NewReader(b), blobs.PutOptions{Size: int64(len(b)), SHA256: sum(b)}); err != nil {
					errs <- err
				}
			}
		})
	}
	var readers sync.WaitGroup
	for range 4 {
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				b, info, err := read(t, f.Store, "cr/key")
				switch {
				case err != nil:
					errs <- fmt.Errorf("Open during replacement: %w", err)
					return
				case !versions[sum(b)] || info.SHA256 != sum(b):
					errs <- fmt.Errorf("Open during replacement: read %d bytes hashing to %s under sha256 %s", len(b), sum(b), info.SHA256)
					return
				}
			}
		})
	}
	wg.Wait()
	close(done)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
