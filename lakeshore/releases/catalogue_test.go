package releases

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"nymph/lakeshore/blobs"
)

// fixture is one Catalogue implementation on fresh storage, with what the
// shared tests need to look behind it.
type fixture struct {
	cat Catalogue
	// again is another catalogue over the same storage, as another
	// process (Store) or another replica (Bucket) would open it.
	again func(t *testing.T) Catalogue
	// stored reads the binary and sidecar as the storage holds them; nil
	// for one that is not there.
	stored func(t *testing.T, version, triple string) (bin, side []byte)
	// leftovers lists what the storage holds beyond the catalogue's own
	// bookkeeping (Store's lock file).
	leftovers func(t *testing.T) []string
	// store is the Store, or nil for a Bucket; blobs the Bucket's blob
	// store, or nil for a Store.
	store *Store
	blobs blobs.Store
}

// catalogues are the implementations every shared test runs against.
var catalogues = []struct {
	name string
	open func(t *testing.T) fixture
}{
	{"store", storeFixture},
	{"bucket-local", func(t *testing.T) fixture { return bucketFixture(t, localBlobs(t)) }},
	{"bucket-s3", func(t *testing.T) fixture { return bucketFixture(t, s3Blobs(t)) }},
}

// eachCatalogue runs test once per implementation, each on fresh storage.
func eachCatalogue(t *testing.T, test func(t *testing.T, f fixture)) {
	for _, c := range catalogues {
		t.Run(c.name, func(t *testing.T) { test(t, c.open(t)) })
	}
}

func storeFixture(t *testing.T) fixture {
	s := openStore(t)
	return fixture{
		cat: s,
		again: func(t *testing.T) Catalogue {
			again, err := Open(s.Dir())
			if err != nil {
				t.Fatal(err)
			}
			return again
		},
		stored: func(t *testing.T, version, triple string) ([]byte, []byte) {
			p := s.binPath(version, triple)
			return readOrNil(t, p), readOrNil(t, p+".sha256")
		},
		leftovers: func(t *testing.T) []string {
			var out []string
			err := filepath.WalkDir(s.Dir(), func(p string, d os.DirEntry, err error) error {
				if err != nil {
					return err
				}
				if p != s.Dir() && d.Name() != lockName {
					out = append(out, strings.TrimPrefix(p, s.Dir()+"/"))
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			return out
		},
		store: s,
	}
}

func readOrNil(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func bucketFixture(t *testing.T, st blobs.Store) fixture {
	b := NewBucket(st, DefaultBucketPrefix)
	return fixture{
		cat:   b,
		again: func(*testing.T) Catalogue { return NewBucket(st, DefaultBucketPrefix) },
		stored: func(t *testing.T, version, triple string) ([]byte, []byte) {
			key := b.Key(version, triple)
			return readBlob(t, st, key), readBlob(t, st, key+".sha256")
		},
		leftovers: func(t *testing.T) []string { return blobKeys(t, st, "") },
		blobs:     st,
	}
}

func readBlob(t *testing.T, st blobs.Store, key string) []byte {
	t.Helper()
	rc, _, err := st.Open(context.Background(), key)
	if errors.Is(err, blobs.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return b
}

func blobKeys(t *testing.T, st blobs.Store, prefix string) []string {
	t.Helper()
	var keys []string
	if err := st.List(context.Background(), prefix, func(in blobs.Info) error {
		keys = append(keys, in.Key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	return keys
}

func publish(t *testing.T, c Catalogue, body []byte, version, triple string) Release {
	t.Helper()
	rel, err := c.Publish(context.Background(), bytes.NewReader(body), version, triple)
	if err != nil {
		t.Fatalf("Publish(%s, %s): %v", version, triple, err)
	}
	return rel
}

func list(t *testing.T, c Catalogue) []Release {
	t.Helper()
	all, err := c.ListContext(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return all
}

func names(all []Release) string {
	var got []string
	for _, r := range all {
		got = append(got, r.Version+"/"+r.Triple)
	}
	return strings.Join(got, " ")
}
