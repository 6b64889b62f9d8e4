package controlplane

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"nymph/atomicfile"
)

var sha256HexRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-f]{64}$`) })

// migrateLegacy moves a data dir written with metadata beside its blobs
// (<key>.meta.json) to the .meta layout, once, when the control plane
// starts. Only files that have no metadata in .meta are looked at, so
// what this layout wrote is never touched, and running it again (after a
// crash halfway, say) finishes what is left.
//
// In one namespace's directory, for a file X (a valid key) without
// .meta/X.json:
//
//   - X.meta.json beside it that parses as metadata and whose size and
//     sha256 are X's bytes is X's legacy metadata: it is copied to
//     .meta/X.json (content type and creation time kept);
//   - else, if X is itself Y.meta.json and is the legacy metadata of Y (as
//     above), it is no blob: it is removed once Y's metadata is in place;
//   - else X is ambiguous: a blob whose metadata was overwritten through
//     the key clash (key "Y.meta.json" stored over Y's sidecar), a blob
//     whose metadata does not match its bytes, or the metadata of a blob
//     lost in a crash between the old code's two writes. Its bytes are the
//     only truth left, so its metadata is made from them (size, sha256,
//     application/octet-stream, the file's mtime) and a warning names it.
//     Nothing is deleted that is not proven to be a sidecar, and a blob
//     is only reachable through a URL presigned for its key, so a stray
//     sidecar kept as a blob is harmless.
func (p *PayloadStore) migrateLegacy(log zerolog.Logger) error {
	if p == nil {
		return nil
	}
	nss, err := os.ReadDir(p.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("payload store: %w", err)
	}
	for _, e := range nss {
		if !e.IsDir() || !validNamespace(e.Name()) {
			continue
		}
		if err := p.migrateNamespace(e.Name(), log); err != nil {
			return fmt.Errorf("payload store: namespace %s: %w", e.Name(), err)
		}
	}
	return nil
}

func (p *PayloadStore) migrateNamespace(ns string, log zerolog.Logger) error {
	ents, err := os.ReadDir(filepath.Join(p.dir, ns))
	if err != nil {
		return err
	}
	mig := &nsMigration{p: p, ns: ns, files: map[string]bool{}, legacy: map[string]legacyResult{}}
	var names []string
	for _, e := range ents {
		if e.Type().IsRegular() && payloadKeyRe().MatchString(e.Name()) {
			mig.files[e.Name()] = true
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, key := range names {
		if p.hasMeta(ns, key) {
			continue
		}
		m, ok, err := mig.legacyMeta(key)
		if err != nil {
			return err
		}
		if !ok {
			if base, isSidecar := strings.CutSuffix(key, legacyMetaSuffix); isSidecar {
				if _, ok, err := mig.legacyMeta(base); err != nil {
					return err
				} else if ok {
					continue // base's sidecar, removed below
				}
			}
			if m, err = p.metaFromBytes(ns, key); err != nil {
				return err
			}
			log.Warn().Str("namespace", ns).Str("key", key).Str("sha256", m.SHA256).Int64("size", m.Size).
				Msg("payload without matching metadata (an old data dir's key clash or crash); its metadata is made from its bytes")
		}
		if err := p.writeMeta(ns, key, m); err != nil {
			return err
		}
		log.Info().Str("namespace", ns).Str("key", key).Msg("payload metadata moved to " + metaDir)
	}
	for _, key := range names {
		base, isSidecar := strings.CutSuffix(key, legacyMetaSuffix)
		if !isSidecar || p.hasMeta(ns, key) {
			continue // not a sidecar, or a blob of its own
		}
		_, ok, err := mig.legacyMeta(base)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if err := os.Remove(p.path(ns, key)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return atomicfile.SyncDir(filepath.Join(p.dir, ns))
}

func (p *PayloadStore) hasMeta(ns, key string) bool {
	_, err := os.Stat(p.metaPath(ns, key))
	return err == nil
}

// nsMigration is the listing of one namespace's directory being migrated,
// and what was learnt of its sidecars (each blob is hashed once).
type nsMigration struct {
	p      *PayloadStore
	ns     string
	files  map[string]bool
	legacy map[string]legacyResult
}

type legacyResult struct {
	m  payloadMeta
	ok bool
}

// legacyMeta reads key's old sidecar, key.meta.json, and reports whether
// it is metadata that describes key's bytes exactly.
func (g *nsMigration) legacyMeta(key string) (payloadMeta, bool, error) {
	if r, seen := g.legacy[key]; seen {
		return r.m, r.ok, nil
	}
	m, ok, err := g.readLegacy(key)
	if err != nil {
		return payloadMeta{}, false, err
	}
	g.legacy[key] = legacyResult{m: m, ok: ok}
	return m, ok, nil
}

func (g *nsMigration) readLegacy(key string) (payloadMeta, bool, error) {
	if !g.files[key] || !g.files[key+legacyMetaSuffix] {
		return payloadMeta{}, false, nil
	}
	b, err := os.ReadFile(g.p.path(g.ns, key+legacyMetaSuffix))
	if err != nil {
		return payloadMeta{}, false, err
	}
	var m payloadMeta
	if json.Unmarshal(b, &m) != nil || m.Size < 0 || !sha256HexRe().MatchString(m.SHA256) {
		return payloadMeta{}, false, nil
	}
	got, err := g.p.metaFromBytes(g.ns, key)
	if err != nil {
		return payloadMeta{}, false, err
	}
	if got.Size != m.Size || got.SHA256 != m.SHA256 {
		return payloadMeta{}, false, nil
	}
	if m.ContentType == "" {
		m.ContentType = "application/octet-stream"
	}
	return m, true, nil
}

// metaFromBytes is the metadata a blob's bytes alone give.
func (p *PayloadStore) metaFromBytes(ns, key string) (payloadMeta, error) {
	f, err := os.Open(p.path(ns, key))
	if err != nil {
		return payloadMeta{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return payloadMeta{}, fmt.Errorf("read %s: %w", key, err)
	}
	st, err := f.Stat()
	if err != nil {
		return payloadMeta{}, err
	}
	return payloadMeta{Size: n, SHA256: hex.EncodeToString(h.Sum(nil)), ContentType: "application/octet-stream", CreatedAt: st.ModTime().UTC()}, nil
}

func (p *PayloadStore) writeMeta(ns, key string, m payloadMeta) error {
	if err := os.MkdirAll(filepath.Join(p.dir, ns, metaDir), 0o700); err != nil {
		return err
	}
	b, _ := json.Marshal(m)
	if err := atomicfile.Write(p.metaPath(ns, key), b, 0o600); err != nil {
		return fmt.Errorf("payload metadata: %w", err)
	}
	return nil
}
