package releases

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"nymph/atomicfile"
	"nymph/dist"
)

const (
	// MaxBinarySize bounds one published binary; a nymph binary is a few
	// tens of MiB, and the daemon refuses anything over 1 GiB anyway.
	MaxBinarySize int64 = 1 << 30

	indexName   = ".index.json"
	lockName    = ".lock"
	tempPattern = ".publish-*.tmp"
)

// ErrNotFound is returned (wrapped) when no release has the asked version
// and triple.
var ErrNotFound = errors.New("releases: not found")

// Release is one published binary.
type Release struct {
	Version     string    `json:"version"`
	Triple      string    `json:"triple"`
	SHA256      string    `json:"sha256"`
	Size        int64     `json:"size"`
	PublishedAt time.Time `json:"publishedAt"`
	// Path is the binary's absolute path on the control plane's disk.
	Path string `json:"path"`
}

// FileName is the binary's name inside its version directory, and the name
// its sidecar refers to.
func (r Release) FileName() string { return dist.BinPrefix + r.Triple }

// Sidecar is the .sha256 file's content: the hex digest, two spaces and the
// file name, as sha256sum prints it, so `sha256sum -c` accepts it.
func (r Release) Sidecar() string { return r.SHA256 + "  " + r.FileName() + "\n" }

// indexEntry is a Release as .index.json stores it; Path is derived.
type indexEntry struct {
	Version     string `json:"version"`
	Triple      string `json:"triple"`
	SHA256      string `json:"sha256"`
	Size        int64  `json:"size"`
	PublishedAt int64  `json:"published_at_unix_ms"`
}

type indexFile struct {
	Releases []indexEntry `json:"releases"`
}

// Store keeps published binaries in one directory. Methods are safe for
// concurrent use, also by several processes sharing the directory: writers
// hold an exclusive flock, readers a shared one.
type Store struct {
	dir string
	now func() time.Time
}

// Open returns the store kept in dir, creating the directory (0755) if
// needed. An unreadable or corrupt index is an error here rather than a
// silently empty catalogue.
func Open(dir string) (*Store, error) {
	if dir == "" {
		return nil, errors.New("releases: directory: empty path")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("releases: directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("releases: create directory: %w", err)
	}
	s := &Store{dir: abs, now: time.Now}
	if _, err := s.List(); err != nil {
		return nil, err
	}
	s.removeAbandonedUploads()
	return s, nil
}

// abandonedAfter is how long an upload's temporary file may go unwritten
// before Open takes it for the leftover of a crashed publish.
const abandonedAfter = time.Hour

func (s *Store) removeAbandonedUploads() {
	matches, _ := filepath.Glob(filepath.Join(s.dir, tempPattern))
	for _, m := range matches {
		if st, err := os.Stat(m); err == nil && s.now().Sub(st.ModTime()) > abandonedAfter {
			_ = os.Remove(m)
		}
	}
}

// Dir is the store's absolute directory.
func (s *Store) Dir() string { return s.dir }

var (
	versionRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._+-]{0,127}$`) })
	tripleRe  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9_]+(-[a-z0-9_]+){1,4}$`) })
)

// ValidateVersion accepts what a version stamp looks like (0.1.10,
// v2.0.0-rc.1, 1.2.3+build.5): it starts with a letter or digit, then
// letters, digits and . _ + -, at most 128 characters.
func ValidateVersion(v string) error {
	if v == "" {
		return errors.New("releases: field version: missing or empty")
	}
	if !versionRe().MatchString(v) {
		return fmt.Errorf("releases: field version: %q must start with a letter or digit and contain only letters, digits and . _ + - (at most 128)", v)
	}
	return nil
}

// ValidateTriple accepts a target triple such as x86_64-unknown-linux-gnu:
// two to five lowercase dash-separated parts of letters, digits and _.
func ValidateTriple(t string) error {
	if t == "" {
		return errors.New("releases: field triple: missing or empty")
	}
	if !tripleRe().MatchString(t) {
		return fmt.Errorf("releases: field triple: %q is not a target triple like %s (lowercase, 2-5 dash-separated parts)", t, dist.FallbackTriple)
	}
	return nil
}

// Publish stores src as the nymph binary for version and triple, replacing
// any earlier binary with the same pair. An empty triple is read from the
// binary's ELF header, else dist.DefaultTriple(). The upload is streamed to disk
// and hashed before any lock is taken, so a slow upload blocks nobody.
func (s *Store) Publish(ctx context.Context, src io.Reader, version, triple string) (Release, error) {
	if err := ValidateVersion(version); err != nil {
		return Release{}, err
	}
	if triple != "" {
		if err := ValidateTriple(triple); err != nil {
			return Release{}, err
		}
	}
	tmp, err := os.CreateTemp(s.dir, tempPattern)
	if err != nil {
		return Release{}, fmt.Errorf("releases: publish %s: %w", version, err)
	}
	tmpName := tmp.Name()
	defer func() {
		if tmpName != "" {
			_ = tmp.Close()
			_ = os.Remove(tmpName)
		}
	}()

	n, sum, triple, err := spool(ctx, tmp, src, version, triple)
	if err != nil {
		return Release{}, err
	}
	if err := tmp.Chmod(0o755); err != nil {
		return Release{}, fmt.Errorf("releases: publish %s: %w", version, err)
	}
	if err := tmp.Sync(); err != nil {
		return Release{}, fmt.Errorf("releases: publish %s: fsync: %w", version, err)
	}
	if err := tmp.Close(); err != nil {
		return Release{}, fmt.Errorf("releases: publish %s: %w", version, err)
	}
	if err := ctx.Err(); err != nil {
		return Release{}, fmt.Errorf("releases: publish %s: %w", version, err)
	}

	rel := Release{
		Version:     version,
		Triple:      triple,
		SHA256:      sum,
		Size:        n,
		PublishedAt: s.now().UTC().Truncate(time.Millisecond),
	}
	rel.Path = s.binPath(version, triple)

	err = s.locked(syscall.LOCK_EX, func() error {
		idx, err := s.readIndex()
		if err != nil {
			return err
		}
		vdir := filepath.Dir(rel.Path)
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return err
		}
		// Binary first, then sidecar, then index: a crash in between leaves
		// an index checksum that the new bytes fail, which a daemon refuses,
		// never a checksum that vouches for bytes it does not describe.
		if err := os.Rename(tmpName, rel.Path); err != nil {
			return err
		}
		tmpName = ""
		if err := atomicfile.Write(rel.Path+dist.SidecarExt, []byte(rel.Sidecar()), 0o644); err != nil {
			return err
		}
		idx.upsert(indexEntry{Version: version, Triple: triple, SHA256: rel.SHA256, Size: n, PublishedAt: rel.PublishedAt.UnixMilli()})
		return s.writeIndex(idx)
	})
	if err != nil {
		return Release{}, fmt.Errorf("releases: publish %s/%s: %w", version, triple, err)
	}
	return rel, nil
}

// Delete removes the release for version and triple: from the index
// first, so it is never offered without its bytes, then its binary and
// sidecar, and the version's directory once empty. An error wraps
// ErrNotFound when there is no such release.
func (s *Store) Delete(version, triple string) (Release, error) {
	if err := validatePair(version, triple); err != nil {
		return Release{}, err
	}
	var rel Release
	err := s.locked(syscall.LOCK_EX, func() error {
		idx, i, err := s.lookup(version, triple)
		if err != nil {
			return err
		}
		rel = s.release(idx.Releases[i])
		idx.Releases = append(idx.Releases[:i], idx.Releases[i+1:]...)
		if err := s.writeIndex(idx); err != nil {
			return err
		}
		for _, p := range []string{rel.Path + dist.SidecarExt, rel.Path} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		vdir := filepath.Dir(rel.Path)
		if err := os.Remove(vdir); err != nil && !errors.Is(err, os.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return atomicfile.SyncDir(s.dir)
	})
	if err != nil {
		return Release{}, fmt.Errorf("releases: delete %s/%s: %w", version, triple, err)
	}
	return rel, nil
}

// List returns every release, oldest version first (versions compare
// numerically part by part, a pre-release before its release), then by
// triple.
func (s *Store) List() ([]Release, error) {
	var out []Release
	err := s.locked(syscall.LOCK_SH, func() error {
		idx, err := s.readIndex()
		if err != nil {
			return err
		}
		out = make([]Release, 0, len(idx.Releases))
		for _, e := range idx.Releases {
			out = append(out, s.release(e))
		}
		return nil
	})
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

// Get returns the release for version and triple, or an error wrapping
// ErrNotFound.
func (s *Store) Get(version, triple string) (Release, error) {
	rel, f, err := s.open(version, triple, false)
	if f != nil {
		_ = f.Close()
	}
	return rel, err
}

// Latest returns the highest version published for triple, or an error
// wrapping ErrNotFound.
func (s *Store) Latest(triple string) (Release, error) {
	all, err := s.List()
	if err != nil {
		return Release{}, err
	}
	return latestOf(all, triple)
}

// The Context variants make Store a Catalogue. The store is a local
// directory, so ctx is only checked before the work starts.

// DeleteContext is Delete, for Catalogue.
func (s *Store) DeleteContext(ctx context.Context, version, triple string) (Release, error) {
	if err := ctx.Err(); err != nil {
		return Release{}, err
	}
	return s.Delete(version, triple)
}

// ListContext is List, for Catalogue.
func (s *Store) ListContext(ctx context.Context) ([]Release, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.List()
}

// GetContext is Get, for Catalogue.
func (s *Store) GetContext(ctx context.Context, version, triple string) (Release, error) {
	if err := ctx.Err(); err != nil {
		return Release{}, err
	}
	return s.Get(version, triple)
}

// LatestContext is Latest, for Catalogue.
func (s *Store) LatestContext(ctx context.Context, triple string) (Release, error) {
	if err := ctx.Err(); err != nil {
		return Release{}, err
	}
	return s.Latest(triple)
}

// Open opens the release's binary under the shared lock, so the bytes read
// match the Release returned even if the version is re-published meanwhile.
func (s *Store) Open(ctx context.Context, version, triple string) (io.ReadCloser, Release, error) {
	if err := ctx.Err(); err != nil {
		return nil, Release{}, err
	}
	rel, f, err := s.open(version, triple, true)
	if err != nil {
		return nil, Release{}, err
	}
	return f, rel, nil
}

// open looks the release up and, with withFile, opens its binary while the
// shared lock is held, so the bytes read later match the returned checksum
// even if the release is re-published meanwhile.
func (s *Store) open(version, triple string, withFile bool) (Release, *os.File, error) {
	if err := validatePair(version, triple); err != nil {
		return Release{}, nil, err
	}
	var (
		rel Release
		f   *os.File
	)
	err := s.locked(syscall.LOCK_SH, func() error {
		idx, i, err := s.lookup(version, triple)
		if err != nil {
			return err
		}
		rel = s.release(idx.Releases[i])
		if withFile {
			f, err = os.Open(rel.Path)
			if err != nil {
				return fmt.Errorf("release %s/%s: open binary: %w", version, triple, err)
			}
		}
		return nil
	})
	return rel, f, err
}

func validatePair(version, triple string) error {
	if err := ValidateVersion(version); err != nil {
		return err
	}
	return ValidateTriple(triple)
}

// lookup reads the index and finds version and triple in it, or returns an
// error wrapping ErrNotFound. The caller holds the lock.
func (s *Store) lookup(version, triple string) (*indexFile, int, error) {
	idx, err := s.readIndex()
	if err != nil {
		return nil, -1, err
	}
	i := idx.find(version, triple)
	if i < 0 {
		return nil, -1, fmt.Errorf("%w: no release %s for %s", ErrNotFound, version, triple)
	}
	return idx, i, nil
}

func (s *Store) release(e indexEntry) Release {
	return Release{
		Version:     e.Version,
		Triple:      e.Triple,
		SHA256:      e.SHA256,
		Size:        e.Size,
		PublishedAt: time.UnixMilli(e.PublishedAt).UTC(),
		Path:        s.binPath(e.Version, e.Triple),
	}
}

func (s *Store) binPath(version, triple string) string {
	return filepath.Join(s.dir, version, dist.BinPrefix+triple)
}

// locked runs fn holding flock(how) on the store's lock file. flock is per
// open file, so separate calls exclude each other inside one process too.
func (s *Store) locked(how int, fn func() error) error {
	lf, err := os.OpenFile(filepath.Join(s.dir, lockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("releases: lock: %w", err)
	}
	defer lf.Close()
	for {
		err = syscall.Flock(int(lf.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("releases: lock: %w", err)
	}
	return fn()
}

func (s *Store) readIndex() (*indexFile, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, indexName))
	if errors.Is(err, fs.ErrNotExist) {
		return &indexFile{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("releases: read index: %w", err)
	}
	var idx indexFile
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, fmt.Errorf("releases: index %s is corrupt: %w", filepath.Join(s.dir, indexName), err)
	}
	return &idx, nil
}

func (s *Store) writeIndex(idx *indexFile) error {
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(s.dir, indexName), append(data, '\n'), 0o644)
}

func (idx *indexFile) find(version, triple string) int {
	for i, e := range idx.Releases {
		if e.Version == version && e.Triple == triple {
			return i
		}
	}
	return -1
}

func (idx *indexFile) upsert(e indexEntry) {
	if i := idx.find(e.Version, e.Triple); i >= 0 {
		idx.Releases[i] = e
		return
	}
	idx.Releases = append(idx.Releases, e)
}

// CompareVersions orders version strings the way operators read them:
// split at the first '-' into release and pre-release (build metadata after
// '+' is ignored), compare runs of digits numerically and the rest
// lexically, and rank a pre-release below its release. It returns -1, 0 or
// +1.
func CompareVersions(a, b string) int {
	a, _, _ = strings.Cut(a, "+")
	b, _, _ = strings.Cut(b, "+")
	a = strings.TrimPrefix(a, "v")
	b = strings.TrimPrefix(b, "v")
	ar, ap, aPre := strings.Cut(a, "-")
	br, bp, bPre := strings.Cut(b, "-")
	if c := compareNatural(ar, br); c != 0 {
		return c
	}
	switch {
	case aPre && !bPre:
		return -1
	case !aPre && bPre:
		return 1
	}
	return compareNatural(ap, bp)
}

func compareNatural(a, b string) int {
	for a != "" && b != "" {
		at, arest := nextToken(a)
		bt, brest := nextToken(b)
		an, aErr := strconv.ParseUint(at, 10, 64)
		bn, bErr := strconv.ParseUint(bt, 10, 64)
		switch {
		case aErr == nil && bErr == nil:
			if an != bn {
				if an < bn {
					return -1
				}
				return 1
			}
		case aErr == nil:
			return 1 // a number outranks a word: 1.0.1 > 1.0.alpha
		case bErr == nil:
			return -1
		default:
			if c := strings.Compare(at, bt); c != 0 {
				return c
			}
		}
		a, b = arest, brest
	}
	return strings.Compare(a, b)
}

// nextToken splits off a run of digits, a run of other non-separators, or
// one separator-delimited piece; separators (. _ -) are dropped.
func nextToken(s string) (string, string) {
	s = strings.TrimLeft(s, "._-")
	if s == "" {
		return "", ""
	}
	isDigit := func(c byte) bool { return c >= '0' && c <= '9' }
	d := isDigit(s[0])
	i := 1
	for i < len(s) && s[i] != '.' && s[i] != '_' && s[i] != '-' && isDigit(s[i]) == d {
		i++
	}
	return s[:i], s[i:]
}

// spool copies an upload into tmp, hashing it, within MaxBinarySize, and
// names its triple: the one given, else its ELF header's, else
// dist.DefaultTriple(). Both catalogues publish through it.
func spool(ctx context.Context, tmp *os.File, src io.Reader, version, triple string) (n int64, sum, tripleOut string, err error) {
	h := sha256.New()
	n, err = io.Copy(io.MultiWriter(tmp, h), io.LimitReader(ctxReader{ctx, src}, MaxBinarySize+1))
	if err != nil {
		return 0, "", "", fmt.Errorf("releases: publish %s: read binary: %w", version, err)
	}
	if n == 0 {
		return 0, "", "", fmt.Errorf("releases: publish %s: the binary is empty", version)
	}
	if n > MaxBinarySize {
		return 0, "", "", fmt.Errorf("releases: publish %s: the binary exceeds %d bytes", version, MaxBinarySize)
	}
	if triple == "" {
		if t, ok := dist.TripleOfELF(tmp); ok {
			triple = t
		} else {
			triple = dist.DefaultTriple()
		}
	}
	return n, hex.EncodeToString(h.Sum(nil)), triple, nil
}

// ctxReader stops a long upload copy when ctx is cancelled.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
