package releases

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"nymph/dist"
	"nymph/lakeshore/blobs"
)

// Catalogue is what the control plane needs of a release catalogue,
// whether it is one directory (Store) or a blob store that replicas share
// (Bucket). Every method takes the request's context first.
type Catalogue interface {
	// Publish stores r as the binary for version and triple (an empty
	// triple is read from the ELF header), replacing an earlier one.
	Publish(ctx context.Context, r io.Reader, version, triple string) (Release, error)
	// DeleteContext removes the release, or returns an error wrapping
	// ErrNotFound.
	DeleteContext(ctx context.Context, version, triple string) (Release, error)
	// ListContext returns every release, oldest version first, then by
	// triple.
	ListContext(ctx context.Context) ([]Release, error)
	// GetContext returns one release, or an error wrapping ErrNotFound.
	GetContext(ctx context.Context, version, triple string) (Release, error)
	// LatestContext returns the highest version published for triple, or
	// an error wrapping ErrNotFound.
	LatestContext(ctx context.Context, triple string) (Release, error)
	// Open reads the release's binary; the Release returned describes the
	// bytes the reader gives.
	Open(ctx context.Context, version, triple string) (io.ReadCloser, Release, error)
}

var (
	_ Catalogue = (*Store)(nil)
	_ Catalogue = (*Bucket)(nil)
)

// DefaultBucketPrefix is where the control plane keeps releases in its blob
// store, beside "payloads/".
const DefaultBucketPrefix = "releases/"

// Bucket keeps releases in a blob store that several control planes share:
//
//	<prefix><version>/nymph-<triple>         the binary, stored with its sha256
//	<prefix><version>/nymph-<triple>.sha256  the sidecar, exactly Release.Sidecar()
//
// There is no index object: two replicas publishing at once would each
// rewrite it and one release would be lost. The catalogue is a listing of
// the prefix instead, and a release exists when its sidecar does (and its
// binary beside it). Publish writes the binary, then the sidecar; Delete
// removes the sidecar, then the binary; so a release is never listed
// without its bytes. Re-publishing leaves, for a moment, the old sidecar
// over the new binary: a daemon refuses that download on its checksum,
// and Open refuses it here, rather than anyone trusting a checksum that
// vouches for other bytes.
//
// A release's PublishedAt is when its sidecar was written, as the store
// reports it.
type Bucket struct {
	st     blobs.Store
	prefix string

	mu sync.Mutex
	// sidecars caches the sha256 read from each sidecar, so a listing
	// reads only the sidecars it has not seen at that size and time.
	sidecars map[string]sidecarEntry
}

type sidecarEntry struct {
	size     int64
	modified time.Time
	sha256   string
}

// NewBucket returns the catalogue kept in st under prefix (normally
// DefaultBucketPrefix; a missing trailing slash is added).
func NewBucket(st blobs.Store, prefix string) *Bucket {
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &Bucket{st: st, prefix: prefix, sidecars: map[string]sidecarEntry{}}
}

// String names where the catalogue lives, for logs and errors.
func (b *Bucket) String() string { return b.st.String() + " " + b.prefix }

// Key is the blob key of the binary for version and triple (its sidecar's
// is Key + ".sha256"), for presigning a download.
func (b *Bucket) Key(version, triple string) string {
	return b.prefix + version + "/" + dist.BinPrefix + triple
}

// Publish stores src as the binary for version and triple, with the same
// checks and limits as Store.Publish. The upload is spooled to a
// temporary file first: the triple may have to be read from its ELF
// header, and the blob store is given the size and sha256 up front.
func (b *Bucket) Publish(ctx context.Context, src io.Reader, version, triple string) (Release, error) {
	if err := ValidateVersion(version); err != nil {
		return Release{}, err
	}
	if triple != "" {
		if err := ValidateTriple(triple); err != nil {
			return Release{}, err
		}
	}
	tmp, err := os.CreateTemp("", "nymph-release-*.tmp")
	if err != nil {
		return Release{}, fmt.Errorf("releases: publish %s: spool: %w", version, err)
	}
	defer func() {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
	}()
	n, sum, triple, err := spool(ctx, tmp, src, version, triple)
	if err != nil {
		return Release{}, err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return Release{}, fmt.Errorf("releases: publish %s: %w", version, err)
	}
	rel := Release{Version: version, Triple: triple, SHA256: sum, Size: n}
	return b.put(ctx, rel, ctxReader{ctx, tmp})
}

// Import stores r as the release rel describes (version, triple, size and
// sha256 as another catalogue holds them), declaring that sha256 to the
// blob store, which refuses bytes that do not match it. It is how
// `lakeshore blobs migrate` copies a release without trusting the copy.
func (b *Bucket) Import(ctx context.Context, rel Release, r io.Reader) (Release, error) {
	if err := validatePair(rel.Version, rel.Triple); err != nil {
		return Release{}, err
	}
	if rel.Size <= 0 || rel.Size > MaxBinarySize {
		return Release{}, fmt.Errorf("releases: import %s/%s: size %d is not between 1 and %d bytes", rel.Version, rel.Triple, rel.Size, MaxBinarySize)
	}
	if !isHexSHA256(rel.SHA256) {
		return Release{}, fmt.Errorf("releases: import %s/%s: sha256 %q is not 64 hex digits", rel.Version, rel.Triple, rel.SHA256)
	}
	return b.put(ctx, Release{Version: rel.Version, Triple: rel.Triple, SHA256: rel.SHA256, Size: rel.Size}, r)
}

// put writes the binary, then its sidecar.
func (b *Bucket) put(ctx context.Context, rel Release, r io.Reader) (Release, error) {
	key := b.Key(rel.Version, rel.Triple)
	if _, err := b.st.Put(ctx, key, r, blobs.PutOptions{Size: rel.Size, SHA256: rel.SHA256, ContentType: "application/octet-stream"}); err != nil {
		return Release{}, fmt.Errorf("releases: publish %s/%s: binary: %w", rel.Version, rel.Triple, err)
	}
	side := rel.Sidecar()
	sum := sha256.Sum256([]byte(side))
	info, err := b.st.Put(ctx, key+dist.SidecarExt, strings.NewReader(side), blobs.PutOptions{
		Size: int64(len(side)), SHA256: hex.EncodeToString(sum[:]), ContentType: "text/plain; charset=utf-8",
	})
	if err != nil {
		return Release{}, fmt.Errorf("releases: publish %s/%s: sidecar: %w", rel.Version, rel.Triple, err)
	}
	rel.PublishedAt = info.Modified.UTC()
	if rel.PublishedAt.IsZero() {
		rel.PublishedAt = time.Now().UTC()
	}
	b.mu.Lock()
	b.sidecars[key+dist.SidecarExt] = sidecarEntry{size: info.Size, modified: info.Modified, sha256: rel.SHA256}
	b.mu.Unlock()
	return rel, nil
}

// DeleteContext removes the release's sidecar, so no one is offered it any
// more, then its binary. An error wraps ErrNotFound when there is no such
// release.
func (b *Bucket) DeleteContext(ctx context.Context, version, triple string) (Release, error) {
	rel, err := b.GetContext(ctx, version, triple)
	if err != nil {
		return Release{}, fmt.Errorf("releases: delete %s/%s: %w", version, triple, err)
	}
	key := b.Key(version, triple)
	for _, k := range []string{key + dist.SidecarExt, key} {
		if err := b.st.Delete(ctx, k); err != nil {
			return Release{}, fmt.Errorf("releases: delete %s/%s: %w", version, triple, err)
		}
	}
	b.mu.Lock()
	delete(b.sidecars, key+dist.SidecarExt)
	b.mu.Unlock()
	return rel, nil
}

// ListContext returns every release, in the order Store.List gives: one
// listing of the prefix, plus a read of each sidecar not seen before.
func (b *Bucket) ListContext(ctx context.Context) ([]Release, error) {
	out, err := b.scan(ctx, b.prefix, true)
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool {
		if c := CompareVersions(out[i].Version, out[j].Version); c != 0 {
			return c < 0
		}
		return out[i].Triple < out[j].Triple
	})
	return out, nil
}

// GetContext returns the release for version and triple, from a listing of
// its version alone, or an error wrapping ErrNotFound.
func (b *Bucket) GetContext(ctx context.Context, version, triple string) (Release, error) {
	if err := validatePair(version, triple); err != nil {
		return Release{}, err
	}
	found, err := b.scan(ctx, b.prefix+version+"/", false)
	if err != nil {
		return Release{}, err
	}
	for _, r := range found {
		if r.Triple == triple {
			return r, nil
		}
	}
	return Release{}, fmt.Errorf("%w: no release %s for %s", ErrNotFound, version, triple)
}

// LatestContext returns the highest version published for triple, or an
// error wrapping ErrNotFound.
func (b *Bucket) LatestContext(ctx context.Context, triple string) (Release, error) {
	all, err := b.ListContext(ctx)
	if err != nil {
		return Release{}, err
	}
	return latestOf(all, triple)
}

// Open reads the release's binary. The blob store's reader fails at EOF if
// the bytes do not hash to what they were stored with; a binary stored
// with another sha256 than its sidecar names (a re-publish caught half
// way) is refused here with an error wrapping blobs.ErrChecksum.
func (b *Bucket) Open(ctx context.Context, version, triple string) (io.ReadCloser, Release, error) {
	rel, err := b.GetContext(ctx, version, triple)
	if err != nil {
		return nil, Release{}, err
	}
	rc, info, err := b.st.Open(ctx, b.Key(version, triple))
	if errors.Is(err, blobs.ErrNotFound) {
		return nil, Release{}, fmt.Errorf("%w: release %s for %s was deleted meanwhile", ErrNotFound, version, triple)
	}
	if err != nil {
		return nil, Release{}, fmt.Errorf("releases: open %s/%s: %w", version, triple, err)
	}
	if info.SHA256 != rel.SHA256 || info.Size != rel.Size {
		_ = rc.Close()
		return nil, Release{}, fmt.Errorf("releases: open %s/%s: the binary (sha256 %s, %d bytes) is not the one its sidecar names (%s); it is being re-published, try again: %w",
			version, triple, info.SHA256, info.Size, rel.SHA256, blobs.ErrChecksum)
	}
	return rc, rel, nil
}

// scan lists the blobs under prefix and returns the releases among them:
// every valid sidecar key whose binary is listed too. With full, prefix is
// the whole catalogue, and cached sidecars no longer listed are dropped.
func (b *Bucket) scan(ctx context.Context, prefix string, full bool) ([]Release, error) {
	binaries := map[string]blobs.Info{}
	var sidecars []blobs.Info
	err := b.st.List(ctx, prefix, func(in blobs.Info) error {
		if strings.HasSuffix(in.Key, dist.SidecarExt) {
			sidecars = append(sidecars, in)
		} else {
			binaries[in.Key] = in
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("releases: list %s: %w", b.st.String(), err)
	}
	var out []Release
	seen := map[string]bool{}
	for _, sc := range sidecars {
		version, triple, ok := b.parseKey(strings.TrimSuffix(sc.Key, dist.SidecarExt))
		if !ok {
			continue
		}
		bin, ok := binaries[strings.TrimSuffix(sc.Key, dist.SidecarExt)]
		if !ok {
			continue // the binary is gone (a delete half way): not a release
		}
		seen[sc.Key] = true
		sum, err := b.sidecarSHA(ctx, sc, triple)
		if errors.Is(err, blobs.ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, err
		}
		if sum == "" {
			continue // not a sidecar this package wrote
		}
		out = append(out, Release{Version: version, Triple: triple, SHA256: sum, Size: bin.Size, PublishedAt: sc.Modified.UTC()})
	}
	if full {
		b.mu.Lock()
		for k := range b.sidecars {
			if !seen[k] {
				delete(b.sidecars, k)
			}
		}
		b.mu.Unlock()
	}
	return out, nil
}

// parseKey splits a binary's key into version and triple, if it is one.
func (b *Bucket) parseKey(key string) (version, triple string, ok bool) {
	rest, ok := strings.CutPrefix(key, b.prefix)
	if !ok {
		return "", "", false
	}
	version, file, ok := strings.Cut(rest, "/")
	if !ok {
		return "", "", false
	}
	triple, ok = strings.CutPrefix(file, dist.BinPrefix)
	if !ok || validatePair(version, triple) != nil {
		return "", "", false
	}
	return version, triple, true
}

// maxSidecar bounds what is read of a sidecar: a digest, two spaces and a
// file name.
const maxSidecar = 512

// sidecarSHA is the digest the sidecar in names, from the cache when the
// sidecar has not changed size or time since it was read. A sidecar that
// is not "<hex>  nymph-<triple>\n" gives "".
func (b *Bucket) sidecarSHA(ctx context.Context, in blobs.Info, triple string) (string, error) {
	b.mu.Lock()
	e, ok := b.sidecars[in.Key]
	b.mu.Unlock()
	if ok && e.size == in.Size && e.modified.Equal(in.Modified) {
		return e.sha256, nil
	}
	rc, _, err := b.st.Open(ctx, in.Key)
	if err != nil {
		return "", fmt.Errorf("releases: read sidecar %s: %w", in.Key, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxSidecar+1))
	if err != nil {
		return "", fmt.Errorf("releases: read sidecar %s: %w", in.Key, err)
	}
	sum := ""
	if s, name, ok := strings.Cut(strings.TrimSuffix(string(data), "\n"), "  "); ok && name == dist.BinPrefix+triple && isHexSHA256(s) {
		sum = s
	}
	b.mu.Lock()
	// Keyed by what the listing said, so the next listing hits.
	b.sidecars[in.Key] = sidecarEntry{size: in.Size, modified: in.Modified, sha256: sum}
	b.mu.Unlock()
	return sum, nil
}

func isHexSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func latestOf(all []Release, triple string) (Release, error) {
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].Triple == triple {
			return all[i], nil
		}
	}
	return Release{}, fmt.Errorf("%w: no release for triple %s", ErrNotFound, triple)
}
