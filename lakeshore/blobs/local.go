package blobs

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"nymph/atomicfile"
)

// Local keeps blobs as files under one directory, in the layout the
// control plane's payload store has always had, so an existing data
// directory stays readable: key a/b/c is the file dir/a/b/c and its
// metadata dir/a/b/.meta/c.json. A key segment starts with a letter or
// digit, so no key names a .meta directory or a temporary file (renameio's
// start with a dot). The metadata is written before the blob, so a blob
// that is there has complete metadata; one without is not found.
type Local struct {
	dir    string
	secret []byte // nil: no presigned URLs
	prefix string
	now    func() time.Time
	// locks serialise the metadata-then-blob write of one key against
	// another write or a read of it, so a reader never pairs one Put's
	// metadata with another's bytes. Striped, so they cost nothing per
	// key; a Local directory is never shared between processes.
	locks [64]sync.Mutex
}

// LocalOptions configures NewLocal.
type LocalOptions struct {
	// Secret signs presigned URLs (a key is derived from it); without one
	// the store presigns nothing. The control plane passes its admin
	// token, so URLs survive a restart.
	Secret []byte
	// URLPrefix is the path presigned URLs start with, "/v1/payloads/";
	// the token follows it.
	URLPrefix string
	// Now is the clock expiries are set and checked by; time.Now if nil.
	Now func() time.Time
}

// Grant is what a valid presigned URL allows: one operation on Key, and
// for a put, under Put's limits.
type Grant struct {
	Key string
	Put PutOptions
}

// localMeta is the metadata file of one blob; its field names are the
// payload store's.
type localMeta struct {
	Size        int64     `json:"size"`
	SHA256      string    `json:"sha256"`
	ContentType string    `json:"content_type"`
	CreatedAt   time.Time `json:"created_at"`
}

const (
	localMetaDir = ".meta"
	// maxToken bounds a token before it is decoded; a key is 1 KiB at most.
	maxToken = 2048
	opGet    = "get"
	opPut    = "put"
)

// NewLocal keeps blobs under dir, which is created (0700) when missing.
func NewLocal(dir string, o LocalOptions) (*Local, error) {
	if dir == "" {
		return nil, errors.New("blobs: local store needs a directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("blobs: local store %s: %w", dir, err)
	}
	l := &Local{dir: abs, prefix: o.URLPrefix, now: o.Now}
	if l.now == nil {
		l.now = time.Now
	}
	if len(o.Secret) > 0 {
		mac := hmac.New(sha256.New, o.Secret)
		mac.Write([]byte("lakeshore blob capability URLs v1"))
		l.secret = mac.Sum(nil)
	}
	return l, nil
}

func (l *Local) String() string { return "local:" + l.dir }

func (l *Local) lock(key string) *sync.Mutex {
	h := fnv.New32a()
	h.Write([]byte(key))
	return &l.locks[h.Sum32()%uint32(len(l.locks))]
}

func (l *Local) path(key string) string { return filepath.Join(l.dir, filepath.FromSlash(key)) }

func (l *Local) metaPath(key string) string {
	dir, name := filepath.Split(l.path(key))
	return filepath.Join(dir, localMetaDir, name+".json")
}

func checkKey(key string) error {
	if !ValidKey(key) {
		return fmt.Errorf("%w %q: 1-8 segments joined by '/', each 1-200 letters, digits, '.', '_', '+' or '-' starting with a letter or digit", ErrInvalidKey, key)
	}
	return nil
}

// Put streams r into a temporary file beside the blob, hashing as it goes;
// only bytes that match what o declared are committed.
func (l *Local) Put(ctx context.Context, key string, r io.Reader, o PutOptions) (Info, error) {
	if err := checkKey(key); err != nil {
		return Info{}, err
	}
	if err := o.validate(); err != nil {
		return Info{}, err
	}
	p := l.path(key)
	if err := os.MkdirAll(filepath.Join(filepath.Dir(p), localMetaDir), 0o700); err != nil {
		if errors.Is(err, syscall.ENOTDIR) {
			return Info{}, fmt.Errorf("%w %q: a prefix of it is a blob, and in a local store a blob cannot also hold others: %v", ErrInvalidKey, key, err)
		}
		return Info{}, fmt.Errorf("blobs: %s: %w", key, err)
	}
	blob, err := atomicfile.Create(p, 0o600)
	if err != nil {
		return Info{}, fmt.Errorf("blobs: %s: %w", key, err)
	}
	defer blob.Cleanup()
	n, sum, err := copyHashed(ctx, key, blob, r, o)
	if err != nil {
		return Info{}, err
	}
	if err := ctx.Err(); err != nil {
		return Info{}, err
	}
	m := localMeta{Size: n, SHA256: sum, ContentType: o.contentType(), CreatedAt: l.now().UTC()}
	mb, err := json.Marshal(m)
	if err != nil {
		return Info{}, err
	}
	mu := l.lock(key)
	mu.Lock()
	defer mu.Unlock()
	if st, err := os.Stat(p); err == nil && st.IsDir() {
		return Info{}, fmt.Errorf("%w %q: other keys have it as their prefix, in a local store it cannot also be a blob", ErrInvalidKey, key)
	}
	if err := atomicfile.Write(l.metaPath(key), mb, 0o600); err != nil {
		return Info{}, fmt.Errorf("blobs: %s: metadata: %w", key, err)
	}
	// The blob goes last: its presence means its metadata is complete.
	if err := blob.Commit(); err != nil {
		return Info{}, fmt.Errorf("blobs: %s: %w", key, err)
	}
	return m.info(key), nil
}

func (m localMeta) info(key string) Info {
	return Info{Key: key, Size: m.Size, SHA256: m.SHA256, ContentType: m.ContentType, Modified: m.CreatedAt}
}

// stat reads key's metadata; a key with no regular file or no metadata is
// ErrNotFound. The caller holds the key's lock.
func (l *Local) stat(key string) (Info, error) {
	st, err := os.Stat(l.path(key))
	if err != nil || !st.Mode().IsRegular() {
		if err == nil || errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return Info{}, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return Info{}, fmt.Errorf("blobs: %s: %w", key, err)
	}
	b, err := os.ReadFile(l.metaPath(key))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("%w: %s (the file is there without its metadata)", ErrNotFound, key)
	}
	if err != nil {
		return Info{}, fmt.Errorf("blobs: %s: metadata: %w", key, err)
	}
	var m localMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return Info{}, fmt.Errorf("blobs: %s: metadata: %w", key, err)
	}
	return m.info(key), nil
}

func (l *Local) Stat(_ context.Context, key string) (Info, error) {
	if err := checkKey(key); err != nil {
		return Info{}, err
	}
	mu := l.lock(key)
	mu.Lock()
	defer mu.Unlock()
	return l.stat(key)
}

// Open pairs the metadata with the file it describes under the key's lock;
// the open file keeps its bytes even if a Put replaces it afterwards.
func (l *Local) Open(_ context.Context, key string) (io.ReadCloser, Info, error) {
	if err := checkKey(key); err != nil {
		return nil, Info{}, err
	}
	mu := l.lock(key)
	mu.Lock()
	defer mu.Unlock()
	info, err := l.stat(key)
	if err != nil {
		return nil, Info{}, err
	}
	f, err := os.Open(l.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Info{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	if err != nil {
		return nil, Info{}, fmt.Errorf("blobs: %s: %w", key, err)
	}
	return newVerifyingReader(f, key, info), info, nil
}

// Delete removes the blob, then its metadata: a blob without metadata is
// not found, so a crash in between leaves nothing a reader would see.
func (l *Local) Delete(_ context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	mu := l.lock(key)
	mu.Lock()
	defer mu.Unlock()
	if st, err := os.Stat(l.path(key)); err == nil && st.IsDir() {
		return nil
	}
	for _, p := range []string{l.path(key), l.metaPath(key)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return fmt.Errorf("blobs: delete %s: %w", key, err)
		}
	}
	return nil
}

// List walks from the deepest directory prefix names, reading each
// directory sorted as keys sort: a subdirectory d as "d/", so "a.c"
// comes before "a/b" as it does in a string comparison.
func (l *Local) List(ctx context.Context, prefix string, fn func(Info) error) error {
	base := ""
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		base = prefix[:i]
		if !ValidKey(base) {
			return nil // no valid key starts with it
		}
	}
	return l.walk(ctx, base, prefix, fn)
}

func (l *Local) walk(ctx context.Context, rel, prefix string, fn func(Info) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dir := l.dir
	if rel != "" {
		dir = l.path(rel)
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("blobs: list %s: %w", prefix, err)
	}
	type entry struct {
		sortAs, key string
		dir         bool
	}
	var es []entry
	for _, e := range ents {
		if !segmentRe().MatchString(e.Name()) { // .meta, temporary files
			continue
		}
		key := e.Name()
		if rel != "" {
			key = rel + "/" + key
		}
		switch {
		case e.IsDir():
			es = append(es, entry{sortAs: key + "/", key: key, dir: true})
		case e.Type().IsRegular():
			es = append(es, entry{sortAs: key, key: key})
		}
	}
	slices.SortFunc(es, func(a, b entry) int { return strings.Compare(a.sortAs, b.sortAs) })
	for _, e := range es {
		// A directory can hold matches when it is under the prefix or the
		// prefix is under it.
		if !strings.HasPrefix(e.sortAs, prefix) && !strings.HasPrefix(prefix, e.sortAs) {
			continue
		}
		if e.dir {
			if strings.Count(e.key, "/") >= 7 { // no valid key is deeper
				continue
			}
			if err := l.walk(ctx, e.key, prefix, fn); err != nil {
				return err
			}
			continue
		}
		if !ValidKey(e.key) {
			continue
		}
		mu := l.lock(e.key)
		mu.Lock()
		info, err := l.stat(e.key)
		mu.Unlock()
		if errors.Is(err, ErrNotFound) {
			continue // deleted meanwhile, or a file without metadata
		}
		if err != nil {
			return err
		}
		if err := fn(info); err != nil {
			return err
		}
	}
	return nil
}

// Check creates the directory if it must and proves it writable with a
// probe file.
func (l *Local) Check(context.Context) error {
	if err := os.MkdirAll(l.dir, 0o700); err != nil {
		return fmt.Errorf("blob store %s: cannot create the directory: %w; create it or choose another", l, err)
	}
	f, err := os.CreateTemp(l.dir, ".check-*")
	if err != nil {
		return fmt.Errorf("blob store %s: the directory is not writable: %w; make it writable by this user or choose another", l, err)
	}
	name := f.Name()
	f.Close()
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("blob store %s: cannot remove a file it wrote: %w", l, err)
	}
	return nil
}

// capability is what a Local presigned URL grants. Short field names keep
// tokens small.
type capability struct {
	Op     string `json:"o"`
	Key    string `json:"k"`
	Size   int64  `json:"s"` // -1: any
	Max    int64  `json:"m,omitempty"`
	SHA256 string `json:"h,omitempty"`
	Type   string `json:"t,omitempty"`
	Exp    int64  `json:"e"` // unix seconds
}

func (l *Local) presign(c capability, ttl time.Duration) (Presigned, error) {
	if l.secret == nil {
		return Presigned{}, fmt.Errorf("blob store %s has no secret to sign URLs with", l)
	}
	if ttl <= 0 {
		return Presigned{}, fmt.Errorf("blobs: presign %s: ttl %s must be positive", c.Key, ttl)
	}
	exp := l.now().Add(ttl)
	c.Exp = exp.Unix()
	body, err := json.Marshal(c)
	if err != nil {
		return Presigned{}, err
	}
	enc := base64.RawURLEncoding.EncodeToString(body)
	token := enc + "." + base64.RawURLEncoding.EncodeToString(l.sign(enc))
	if len(token) > maxToken {
		return Presigned{}, fmt.Errorf("blobs: presign %s: token of %d bytes is over %d", c.Key, len(token), maxToken)
	}
	method := "GET"
	if c.Op == opPut {
		method = "PUT"
	}
	return Presigned{URL: l.prefix + token, Method: method, Headers: map[string]string{}, Expires: time.Unix(c.Exp, 0).UTC()}, nil
}

func (l *Local) sign(enc string) []byte {
	mac := hmac.New(sha256.New, l.secret)
	mac.Write([]byte(enc))
	return mac.Sum(nil)
}

func (l *Local) PresignGet(ctx context.Context, key string, ttl time.Duration) (Presigned, error) {
	if _, err := l.Stat(ctx, key); err != nil {
		return Presigned{}, err
	}
	return l.presign(capability{Op: opGet, Key: key, Size: -1}, ttl)
}

// PresignPut signs the limits of o into the URL; the content type, when o
// has none, is the one the PUT sends.
func (l *Local) PresignPut(_ context.Context, key string, o PutOptions, ttl time.Duration) (Presigned, error) {
	if err := checkKey(key); err != nil {
		return Presigned{}, err
	}
	if err := o.validate(); err != nil {
		return Presigned{}, err
	}
	return l.presign(capability{Op: opPut, Key: key, Size: o.Size, Max: o.Max, SHA256: o.SHA256, Type: o.ContentType}, ttl)
}

// Authorize checks a token from one of this store's URLs for op ("get" or
// "put"): its signature, its operation and its expiry. A token that fails
// is ErrDenied, or ErrExpired saying when it expired.
func (l *Local) Authorize(token, op string) (Grant, error) {
	denied := fmt.Errorf("%w: unknown, tampered with, or for another operation", ErrDenied)
	if l.secret == nil || len(token) > maxToken {
		return Grant{}, denied
	}
	enc, sig, ok := strings.Cut(token, ".")
	if !ok {
		return Grant{}, denied
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, l.sign(enc)) {
		return Grant{}, denied
	}
	body, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return Grant{}, denied
	}
	var c capability
	if json.Unmarshal(body, &c) != nil || c.Op != op || !ValidKey(c.Key) {
		return Grant{}, denied
	}
	if l.now().Unix() > c.Exp {
		return Grant{}, fmt.Errorf("%w at %s; presign again", ErrExpired, time.Unix(c.Exp, 0).UTC().Format(time.RFC3339))
	}
	return Grant{Key: c.Key, Put: PutOptions{Size: c.Size, Max: c.Max, SHA256: c.SHA256, ContentType: c.Type}}, nil
}

var _ Store = (*Local)(nil)
