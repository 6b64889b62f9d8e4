package releases

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"nymph/lakeshore/blobs"
)

// bucketStores are the blob stores the Bucket-only tests run on.
var bucketStores = []struct {
	name string
	open func(t *testing.T) blobs.Store
}{
	{"local", func(t *testing.T) blobs.Store { return localBlobs(t) }},
	{"s3", func(t *testing.T) blobs.Store { return s3Blobs(t) }},
}

func eachBucketStore(t *testing.T, test func(t *testing.T, st blobs.Store)) {
	for _, s := range bucketStores {
		t.Run(s.name, func(t *testing.T) { test(t, s.open(t)) })
	}
}

// TestBucketReplicasPublishConcurrently: two replicas (two Buckets over one
// store) publishing different versions at once each find both in List,
// which an index object rewritten by both would not guarantee.
func TestBucketReplicasPublishConcurrently(t *testing.T) {
	eachBucketStore(t, func(t *testing.T, st blobs.Store) {
		a, b := NewBucket(st, DefaultBucketPrefix), NewBucket(st, DefaultBucketPrefix)
		const triple = "x86_64-unknown-linux-gnu"
		bodies := map[string][]byte{}
		for i := range 8 {
			bodies[fmt.Sprintf("1.%d.0", i)] = randomBytes(t, 8<<10)
		}
		var wg sync.WaitGroup
		errs := make(chan error, len(bodies))
		i := 0
		for v, body := range bodies {
			c := a
			if i%2 == 1 {
				c = b
			}
			i++
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Publish(context.Background(), bytes.NewReader(body), v, triple); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		want := "1.0.0/x 1.1.0/x 1.2.0/x 1.3.0/x 1.4.0/x 1.5.0/x 1.6.0/x 1.7.0/x"
		want = strings.ReplaceAll(want, "/x", "/"+triple)
		for name, c := range map[string]*Bucket{"a": a, "b": b} {
			all := list(t, c)
			if got := names(all); got != want {
				t.Fatalf("replica %s lists %s, want %s", name, got, want)
			}
			for _, r := range all {
				if r.SHA256 != hexSum(bodies[r.Version]) {
					t.Fatalf("replica %s: %s has sha256 %s, want %s", name, r.Version, r.SHA256, hexSum(bodies[r.Version]))
				}
			}
		}
	})
}

// TestBucketHalfReleasesAreNotReleases: what a publish or delete cut short
// leaves (a binary without its sidecar, a sidecar without its binary), or
// a sidecar this package did not write, is no release.
func TestBucketHalfReleasesAreNotReleases(t *testing.T) {
	eachBucketStore(t, func(t *testing.T, st blobs.Store) {
		ctx := context.Background()
		b := NewBucket(st, DefaultBucketPrefix)
		const gnu = "x86_64-unknown-linux-gnu"
		whole := publish(t, b, randomBytes(t, 1000), "2.0.0", gnu)
		bin := randomBytes(t, 1000)
		putBlob(t, st, b.Key("2.1.0", gnu), bin)                                                                 // binary only
		putBlob(t, st, b.Key("2.2.0", gnu)+".sha256", []byte(hexSum(bin)+"  nymph-"+gnu+"\n"))                   // sidecar only
		putBlob(t, st, b.Key("2.3.0", gnu), bin)                                                                 // a sidecar naming
		putBlob(t, st, b.Key("2.3.0", gnu)+".sha256", []byte(hexSum(bin)+"  nymph-aarch64-unknown-linux-gnu\n")) // another file
		putBlob(t, st, b.Key("2.4.0", gnu), bin)                                                                 // a sidecar that
		putBlob(t, st, b.Key("2.4.0", gnu)+".sha256", []byte("not a checksum\n"))                                // is no sidecar
		putBlob(t, st, "releases/stray", bin)                                                                    // not a release key
		putBlob(t, st, "payloads/default/x.sha256", bin)                                                         // outside the prefix

		if got := names(list(t, b)); got != "2.0.0/"+gnu {
			t.Fatalf("List %s, want only 2.0.0/%s", got, gnu)
		}
		for _, v := range []string{"2.1.0", "2.2.0", "2.3.0", "2.4.0"} {
			if _, err := b.GetContext(ctx, v, gnu); !errors.Is(err, ErrNotFound) {
				t.Errorf("Get %s: %v, want ErrNotFound", v, err)
			}
			if _, err := b.DeleteContext(ctx, v, gnu); !errors.Is(err, ErrNotFound) {
				t.Errorf("Delete %s: %v, want ErrNotFound", v, err)
			}
		}
		if l, err := b.LatestContext(ctx, gnu); err != nil || l.Version != whole.Version {
			t.Fatalf("Latest: %+v %v, want %s", l, err, whole.Version)
		}
		// Publishing over a half release makes it whole.
		publish(t, b, bin, "2.1.0", gnu)
		if got := names(list(t, b)); got != "2.0.0/"+gnu+" 2.1.0/"+gnu {
			t.Fatalf("after publishing 2.1.0: %s", got)
		}
	})
}

// TestBucketOpenRefusesAMismatchedPair: a binary re-published under an old
// sidecar (a publish cut between its two writes) is not served.
func TestBucketOpenRefusesAMismatchedPair(t *testing.T) {
	eachBucketStore(t, func(t *testing.T, st blobs.Store) {
		ctx := context.Background()
		b := NewBucket(st, DefaultBucketPrefix)
		const gnu = "x86_64-unknown-linux-gnu"
		rel := publish(t, b, randomBytes(t, 2000), "3.0.0", gnu)
		putBlob(t, st, b.Key("3.0.0", gnu), randomBytes(t, 2000))
		if _, _, err := b.Open(ctx, "3.0.0", gnu); !errors.Is(err, blobs.ErrChecksum) || !strings.Contains(err.Error(), "re-published") {
			t.Fatalf("Open of a binary its sidecar does not name: %v", err)
		}
		if got, err := b.GetContext(ctx, "3.0.0", gnu); err != nil || got.SHA256 != rel.SHA256 {
			t.Fatalf("Get: %+v %v (the sidecar still names %s)", got, err, rel.SHA256)
		}
	})
}

// TestBucketImport: a release copied in with its declared sha256 is
// refused when the bytes do not match, and leaves nothing listed.
func TestBucketImport(t *testing.T) {
	eachBucketStore(t, func(t *testing.T, st blobs.Store) {
		ctx := context.Background()
		b := NewBucket(st, DefaultBucketPrefix)
		body := randomBytes(t, 3000)
		want := Release{Version: "4.0.0", Triple: "aarch64-unknown-linux-gnu", SHA256: hexSum(body), Size: 3000}
		got, err := b.Import(ctx, want, bytes.NewReader(body))
		if err != nil || got.SHA256 != want.SHA256 || got.Size != 3000 || got.PublishedAt.IsZero() {
			t.Fatalf("Import: %+v %v", got, err)
		}
		other := want
		other.Version = "4.0.1"
		corrupt := bytes.Clone(body)
		corrupt[100] ^= 1
		if _, err := b.Import(ctx, other, bytes.NewReader(corrupt)); !errors.Is(err, blobs.ErrChecksum) {
			t.Fatalf("Import of bytes that do not match: %v, want ErrChecksum", err)
		}
		if _, err := b.Import(ctx, Release{Version: "4.0.2", Triple: want.Triple, SHA256: "abc", Size: 3}, bytes.NewReader(body)); err == nil || !strings.Contains(err.Error(), "sha256") {
			t.Fatalf("Import with a bad sha256: %v", err)
		}
		if names := names(list(t, b)); names != "4.0.0/aarch64-unknown-linux-gnu" {
			t.Fatalf("List after imports: %s", names)
		}
		if keys := blobKeys(t, st, "releases/4.0.1/"); len(keys) != 0 {
			t.Fatalf("a refused import left %v", keys)
		}
	})
}

// countingStore counts the reads and listings that reach a blob store.
type countingStore struct {
	blobs.Store
	opens, lists atomic.Int64
}

func (c *countingStore) Open(ctx context.Context, key string) (io.ReadCloser, blobs.Info, error) {
	c.opens.Add(1)
	return c.Store.Open(ctx, key)
}

func (c *countingStore) List(ctx context.Context, prefix string, fn func(blobs.Info) error) error {
	c.lists.Add(1)
	return c.Store.List(ctx, prefix, fn)
}

// TestBucketListReadsOnlyNewSidecars: a listing costs one List of the
// prefix, plus a read of each sidecar that is new or changed since.
func TestBucketListReadsOnlyNewSidecars(t *testing.T) {
	eachBucketStore(t, func(t *testing.T, st blobs.Store) {
		const gnu = "x86_64-unknown-linux-gnu"
		writer := NewBucket(st, DefaultBucketPrefix)
		for i := range 5 {
			publish(t, writer, randomBytes(t, 100), fmt.Sprintf("5.%d.0", i), gnu)
		}
		c := &countingStore{Store: st}
		reader := NewBucket(c, DefaultBucketPrefix)
		step := func(name string, wantLen int, wantOpens int64) {
			t.Helper()
			c.opens.Store(0)
			c.lists.Store(0)
			if all := list(t, reader); len(all) != wantLen {
				t.Fatalf("%s: %d releases, want %d", name, len(all), wantLen)
			}
			if c.lists.Load() != 1 || c.opens.Load() != wantOpens {
				t.Fatalf("%s: %d listings and %d reads, want 1 and %d", name, c.lists.Load(), c.opens.Load(), wantOpens)
			}
		}
		step("first listing", 5, 5)
		step("second listing", 5, 0)
		publish(t, writer, randomBytes(t, 100), "5.9.0", gnu)
		step("after one more publish", 6, 1)
		if _, err := writer.DeleteContext(context.Background(), "5.0.0", gnu); err != nil {
			t.Fatal(err)
		}
		step("after a delete", 5, 0)
	})
}

func putBlob(t *testing.T, st blobs.Store, key string, data []byte) {
	t.Helper()
	if _, err := st.Put(context.Background(), key, bytes.NewReader(data), blobs.PutOptions{Size: int64(len(data)), SHA256: hexSum(data)}); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// BenchmarkBucketList measures a listing of 100 releases on moto: "cold"
// by a replica that has read no sidecar yet (one listing and 100 reads),
// "warm" by one that has (the listing alone).
//
//	go test ./lakeshore/releases/ -run '^$' -bench BucketList -benchtime 20x
func BenchmarkBucketList(b *testing.B) {
	st := s3Blobs(b)
	writer := NewBucket(st, DefaultBucketPrefix)
	for i := range 100 {
		if _, err := writer.Publish(context.Background(), bytes.NewReader([]byte(fmt.Sprint("binary ", i))), fmt.Sprintf("7.%d.0", i), "x86_64-unknown-linux-gnu"); err != nil {
			b.Fatal(err)
		}
	}
	run := func(b *testing.B, c *Bucket) {
		all, err := c.ListContext(context.Background())
		if err != nil || len(all) != 100 {
			b.Fatalf("%d releases, %v", len(all), err)
		}
	}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			run(b, NewBucket(st, DefaultBucketPrefix))
		}
	})
	b.Run("warm", func(b *testing.B) {
		c := NewBucket(st, DefaultBucketPrefix)
		run(b, c)
		for b.Loop() {
			run(b, c)
		}
	})
}
