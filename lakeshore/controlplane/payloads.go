package controlplane

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"nymph/lakeshore/blobs"
	"nymph/lakeshore/store"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// Payloads are kept in a blobs.Store: on this control plane's disk
// (PayloadStore, under the data directory) or in a bucket the replicas
// share (Config.Blobs). Readers and writers never get a path or a
// credential: presign hands out a URL that is its own capability — the
// bucket's SigV4 URL, or, on disk, a token for this control plane's
// payload route signed with a key derived from the admin token, so it
// survives restarts, holds on every replica and cannot be forged or
// stretched. The on-disk layout is <namespace>/<key> with the metadata in
// <namespace>/.meta/<key>.json: a key starts with a letter or digit, so no
// key names that directory or anything in it. (Metadata once sat beside
// its blob as <key>.meta.json, which is also a valid key; migrateLegacy
// moves such a data dir to this layout.)

// payloadKeyRe is what a key may look like: one safe path segment.
var payloadKeyRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$`) })

const (
	// metaDir, in each namespace's directory, holds the metadata.
	metaDir = ".meta"
	// legacyMetaSuffix named the metadata file beside its blob.
	legacyMetaSuffix = ".meta.json"
	payloadPrefix    = "/v1/payloads/"
	// limitPresign bounds the presign body; it carries a few short fields
	// (a key is 200 bytes at most).
	limitPresign = 16 << 10
	// sharedPayloadPrefix is where payloads live in a shared blob store.
	sharedPayloadPrefix = "payloads/"
	// DefaultPayloadRetention is how long a payload outlives its job.
	DefaultPayloadRetention = 7 * 24 * time.Hour
	// expiredBatch is how many expired payloads one sweep step deletes.
	expiredBatch = 200
)

var errNoPayloadStore = badField(http.StatusServiceUnavailable, "payloads", "this control plane has no data directory, so no payload store")

// PayloadStore names the directory a lone control plane keeps its
// payloads in (Config.Payloads). A nil *PayloadStore is none: the payload
// routes say so.
type PayloadStore struct {
	dir string
}

// NewPayloadStore keeps blobs under dir, which is created (0700) with the
// first one.
func NewPayloadStore(dir string) *PayloadStore { return &PayloadStore{dir: dir} }

// payloadMeta is the on-disk metadata of one blob (the legacy migration
// reads and writes it; blobs.Local keeps the same format).
type payloadMeta struct {
	Size        int64     `json:"size"`
	SHA256      string    `json:"sha256"`
	ContentType string    `json:"content_type"`
	CreatedAt   time.Time `json:"created_at"`
}

func (p *PayloadStore) path(ns, key string) string { return filepath.Join(p.dir, ns, key) }

// metaPath is where the metadata of blob ns/key lives.
func (p *PayloadStore) metaPath(ns, key string) string {
	return filepath.Join(p.dir, ns, metaDir, key+".json")
}

// payloads is where this control plane keeps payload bytes.
type payloads struct {
	st blobs.Store
	// local is st when this control plane serves the presigned URLs
	// itself (its own disk); nil for a shared bucket.
	local *blobs.Local
	// prefix is put before "<namespace>/<key>" in st.
	prefix string
	// retention is how long a payload outlives its job; negative keeps
	// every payload.
	retention time.Duration
	// ttl is how long a presigned URL stays valid.
	ttl time.Duration
}

func (p *payloads) key(ns, key string) string { return p.prefix + ns + "/" + key }

// openPayloads picks the payload store cfg names: the shared blob store,
// else the directory.
func openPayloads(cfg Config, secret []byte, now func() time.Time) (*payloads, error) {
	retention, ttl := cfg.PayloadRetention, cfg.PayloadURLTTL
	if retention == 0 {
		retention = DefaultPayloadRetention
	}
	switch {
	case ttl == 0:
		ttl = operatorapi.PayloadTTL
	case ttl < time.Second:
		return nil, fmt.Errorf("PayloadURLTTL %v: must be at least a second", ttl)
	}
	if cfg.Blobs != nil {
		return &payloads{st: cfg.Blobs, prefix: sharedPayloadPrefix, retention: retention, ttl: ttl}, nil
	}
	if cfg.Payloads == nil {
		return nil, nil
	}
	l, err := blobs.NewLocal(cfg.Payloads.dir, blobs.LocalOptions{Secret: secret, URLPrefix: payloadPrefix, Now: now})
	if err != nil {
		return nil, fmt.Errorf("payload store: %w", err)
	}
	return &payloads{st: l, local: l, retention: retention, ttl: ttl}, nil
}

// stat describes payload ns/key; a missing one is a 404 naming it.
func (p *payloads) stat(ctx context.Context, ns, key string) (blobs.Info, error) {
	if p == nil {
		return blobs.Info{}, errNoPayloadStore
	}
	info, err := p.st.Stat(ctx, p.key(ns, key))
	if errors.Is(err, blobs.ErrNotFound) {
		return blobs.Info{}, badField(http.StatusNotFound, "key", "no payload %q in namespace %q", key, ns)
	}
	return info, err
}

// payloadURLKey derives the key that signs on-disk payload URLs.
func payloadURLKey(adminToken string) []byte {
	mac := hmac.New(sha256.New, []byte(adminToken))
	mac.Write([]byte("lakeshore payload capability URLs v1"))
	return mac.Sum(nil)
}

// blobError turns a blob store refusal into the 4xx that names its field;
// anything else is returned as it is.
func blobError(err error) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return badField(http.StatusRequestEntityTooLarge, "body", "larger than the %d byte payload limit", messages.MaxPayload)
	case errors.Is(err, blobs.ErrExpired):
		return badField(http.StatusForbidden, "token", "%s; presign again", strings.TrimPrefix(err.Error(), "blobs: "))
	case errors.Is(err, blobs.ErrDenied):
		return badField(http.StatusForbidden, "token", "not a valid payload URL (unknown, tampered with, or for another operation)")
	case errors.Is(err, blobs.ErrChecksum):
		return badField(http.StatusBadRequest, "sha256", "%s", strings.TrimPrefix(err.Error(), "blobs: "))
	case errors.Is(err, blobs.ErrSize):
		return badField(http.StatusBadRequest, "size", "%s", strings.TrimPrefix(err.Error(), "blobs: "))
	}
	return err
}

// storeArgs keeps large invocation args in the payload store and returns
// the ref a daemon resolves them by.
func (s *Server) storeArgs(ctx context.Context, ns, key, jobID string, data []byte) (*messages.PayloadRef, error) {
	if s.payloads == nil {
		return nil, errNoPayloadStore
	}
	sum := sha256.Sum256(data)
	hexSum := hex.EncodeToString(sum[:])
	// Recorded first: a crash after the write leaves a blob retention
	// knows of, never one it does not.
	if err := s.st.RecordPayload(ctx, store.PayloadBlob{Namespace: ns, Key: key, JobID: jobID, CreatedAt: s.now()}); err != nil {
		return nil, err
	}
	info, err := s.payloads.st.Put(ctx, s.payloads.key(ns, key), bytes.NewReader(data),
		blobs.PutOptions{Size: int64(len(data)), SHA256: hexSum, ContentType: "application/octet-stream"})
	if err != nil {
		return nil, fmt.Errorf("store args in %s: %w", s.payloads.st, err)
	}
	return &messages.PayloadRef{Bucket: operatorapi.PayloadBucket, Key: key, Size: uint64(info.Size), ContentType: info.ContentType, SHA256: &hexSum}, nil
}

// handlePresignJSON is RoutePresign for an operator.
func (s *Server) handlePresignJSON(w http.ResponseWriter, r *http.Request) {
	resp, err := s.presignJSON(w, r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// handlePresignMsgpack is RoutePresign for a daemon, signed or with its
// bearer (as on poll).
func (s *Server) handlePresignMsgpack(w http.ResponseWriter, r *http.Request, p daemonPrincipal) {
	resp, err := s.presignMsgpack(w, r, p)
	if err != nil {
		s.log.Info().Err(err).Msg("presign refused")
		writeDaemonError(w, err)
		return
	}
	writeMsgpack(w, http.StatusOK, resp)
}

func isJSONContentType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.Contains(strings.ToLower(strings.TrimSpace(mt)), "json")
}

var presignChecks = []check{
	{path: "op", required: true, kind: kString},
	{path: "key", kind: kString},
	{path: "size", kind: kUint64},
	{path: "jobId", kind: kString},
	{path: "kind", kind: kString},
	{path: "sha256", kind: kString},
}

func (s *Server) presignJSON(w http.ResponseWriter, r *http.Request) (*messages.PresignResponse, error) {
	ns, err := namespace(r)
	if err != nil {
		return nil, err
	}
	body, err := readBody(w, r, limitPresign)
	if err != nil {
		return nil, err
	}
	req, err := decodePresign(body, true)
	if err != nil {
		return nil, err
	}
	return s.presign(r, ns, req)
}

func (s *Server) presignMsgpack(w http.ResponseWriter, r *http.Request, p daemonPrincipal) (*messages.PresignResponse, error) {
	ns, err := namespace(r)
	if err != nil {
		return nil, err
	}
	if ns != p.namespace {
		return nil, badField(http.StatusForbidden, "ns", "this daemon's credentials belong to namespace %q, not %q", p.namespace, ns)
	}
	body, err := readBody(w, r, limitPresign)
	if err != nil {
		return nil, err
	}
	req, err := decodePresign(body, false)
	if err != nil {
		return nil, err
	}
	return s.presign(r, ns, req)
}

// decodePresign decodes a presign body, an operator's JSON or a daemon's
// msgpack.
func decodePresign(body []byte, asJSON bool) (messages.PresignRequest, error) {
	var req messages.PresignRequest
	if asJSON {
		return req, decodeJSON(body, &req)
	}
	return req, decodeChecked(body, presignChecks, &req)
}

// presign answers one presign request in namespace ns.
func (s *Server) presign(r *http.Request, ns string, req messages.PresignRequest) (*messages.PresignResponse, error) {
	if s.payloads == nil {
		return nil, errNoPayloadStore
	}
	ctx := r.Context()
	key := ""
	if req.Key != nil {
		key = *req.Key
	}
	if key != "" && !payloadKeyRe().MatchString(key) {
		return nil, badField(http.StatusBadRequest, "key", "must be 1-200 letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	var (
		p   blobs.Presigned
		err error
	)
	switch req.Op {
	case messages.PresignGet:
		if key == "" {
			return nil, badField(http.StatusBadRequest, "key", "required for op get")
		}
		p, err = s.payloads.st.PresignGet(ctx, s.payloads.key(ns, key), s.payloads.ttl)
		if errors.Is(err, blobs.ErrNotFound) {
			return nil, badField(http.StatusNotFound, "key", "no payload %q in namespace %q", key, ns)
		}
	case messages.PresignPut:
		o := blobs.PutOptions{Size: -1, Max: messages.MaxPayload}
		if req.Size != nil {
			if *req.Size > messages.MaxPayload {
				return nil, badField(http.StatusRequestEntityTooLarge, "size", "%d bytes is over the %d byte payload limit", *req.Size, messages.MaxPayload)
			}
			o.Size = int64(*req.Size)
		} else if s.payloads.local == nil {
			return nil, badField(http.StatusBadRequest, "size", "required: payloads are kept in %s, which cannot cap an upload of unknown size at the %d byte limit", s.payloads.st, messages.MaxPayload)
		}
		if req.SHA256 != nil && *req.SHA256 != "" {
			sum := strings.ToLower(*req.SHA256)
			if !messages.ValidSHA256(sum) {
				return nil, badField(http.StatusBadRequest, "sha256", "must be 64 hex characters")
			}
			o.SHA256 = sum
		}
		if key == "" {
			key = newPayloadKey(req.Kind, req.JobID)
		} else if _, err := s.payloads.st.Stat(ctx, s.payloads.key(ns, key)); err == nil {
			return nil, badField(http.StatusConflict, "key", "payload %q already exists in namespace %q; a payload never changes, so upload under another key", key, ns)
		} else if !errors.Is(err, blobs.ErrNotFound) {
			return nil, err
		}
		job := ""
		if req.JobID != nil {
			job = *req.JobID
		}
		if err := s.st.RecordPayload(ctx, store.PayloadBlob{Namespace: ns, Key: key, JobID: job, CreatedAt: s.now()}); err != nil {
			return nil, err
		}
		p, err = s.payloads.st.PresignPut(ctx, s.payloads.key(ns, key), o, s.payloads.ttl)
	default:
		return nil, badField(http.StatusBadRequest, "op", "must be %q or %q", messages.PresignGet, messages.PresignPut)
	}
	if err != nil {
		return nil, blobError(err)
	}
	u := p.URL
	if strings.HasPrefix(u, "/") {
		u = s.currentPublicURL(r.Host) + u
	}
	return &messages.PresignResponse{URL: u, Key: key, ExpiresAtS: messages.Epoch(p.Expires.Unix()), Headers: p.Headers}, nil
}

var keyPartRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[^A-Za-z0-9._-]+`) })

// newPayloadKey names a new blob after its kind and job when they are
// given, so a listing is readable, and makes it unique.
func newPayloadKey(kind, job *string) string {
	parts := []string{}
	for _, p := range []*string{kind, job} {
		if p == nil {
			continue
		}
		if v := strings.Trim(keyPartRe().ReplaceAllString(*p, "_"), "._-"); v != "" {
			parts = append(parts, v[:min(len(v), 60)])
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "blob")
	}
	return strings.Join(append(parts, strings.ToLower(newULID())), "-")
}

// errPayloadsElsewhere answers the on-disk payload routes of a control
// plane whose payloads are in a bucket: its presigned URLs point there.
func (s *Server) errPayloadsElsewhere() error {
	if s.payloads == nil {
		return errNoPayloadStore
	}
	return badField(http.StatusNotFound, "token", "this control plane keeps its payloads in %s, so its presigned URLs point there; presign again", s.payloads.st)
}

func (s *Server) handlePayloadGet(w http.ResponseWriter, r *http.Request) {
	if s.payloads == nil || s.payloads.local == nil {
		writeOperatorError(w, s.errPayloadsElsewhere())
		return
	}
	g, err := s.payloads.local.Authorize(r.PathValue("token"), messages.PresignGet)
	if err != nil {
		writeOperatorError(w, blobError(err))
		return
	}
	body, info, err := s.payloads.local.Open(r.Context(), g.Key)
	if errors.Is(err, blobs.ErrNotFound) {
		writeOperatorError(w, badField(http.StatusNotFound, "key", "payload %q is gone", path.Base(g.Key)))
		return
	}
	if err != nil {
		s.log.Error().Err(err).Str("key", g.Key).Msg("payload read")
		writeOperatorError(w, err)
		return
	}
	defer body.Close()
	w.Header().Set("Content-Type", info.ContentType)
	w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
	w.Header().Set("X-Checksum-Sha256", info.SHA256)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		if _, err := io.Copy(w, body); err != nil {
			// The bytes no longer match their checksum, or the disk
			// failed: the client sees a short body, and the log why.
			s.log.Error().Err(err).Str("key", g.Key).Msg("payload read")
		}
	}
}

func (s *Server) handlePayloadPut(w http.ResponseWriter, r *http.Request) {
	msgpackOut := strings.Contains(r.Header.Get("Accept"), "msgpack")
	fail := func(err error) {
		if msgpackOut {
			writeDaemonError(w, err)
			return
		}
		writeOperatorError(w, err)
	}
	if s.payloads == nil || s.payloads.local == nil {
		fail(s.errPayloadsElsewhere())
		return
	}
	local := s.payloads.local
	g, err := local.Authorize(r.PathValue("token"), messages.PresignPut)
	if err != nil {
		fail(blobError(err))
		return
	}
	o := g.Put
	if r.ContentLength > messages.MaxPayload {
		fail(badField(http.StatusRequestEntityTooLarge, "body", "%d bytes is over the %d byte payload limit", r.ContentLength, messages.MaxPayload))
		return
	}
	if o.Size >= 0 && r.ContentLength >= 0 && r.ContentLength != o.Size {
		fail(badField(http.StatusBadRequest, "size", "presigned for %d bytes, Content-Length says %d", o.Size, r.ContentLength))
		return
	}
	// The reader keeps why reading stopped, so a broken or stalled
	// upload is blamed on the client, not the store.
	body := &countingReader{r: http.MaxBytesReader(w, r.Body, messages.MaxPayload)}
	if ct := r.Header.Get("Content-Type"); len(ct) <= 200 {
		o.ContentType = ct
	}
	ctx := r.Context()
	var info blobs.Info
	if old, err := local.Stat(ctx, g.Key); err == nil {
		// A payload never changes: the same bytes again are a no-op,
		// other bytes a conflict.
		info, err = sameBytes(body, old, o)
		if err != nil {
			fail(uploadError(body, err))
			return
		}
	} else if info, err = local.Put(ctx, g.Key, body, o); err != nil {
		err = uploadError(body, err)
		var fe *fieldError
		if !errors.As(err, &fe) {
			s.log.Error().Err(err).Str("key", g.Key).Msg("payload write")
		}
		fail(err)
		return
	}
	s.log.Info().Str("key", g.Key).Int64("size", info.Size).Str("sha256", info.SHA256).Msg("payload stored")
	sum := info.SHA256
	ref := &operatorapi.PayloadStored{Bucket: operatorapi.PayloadBucket, Key: path.Base(g.Key), Size: uint64(info.Size), ContentType: info.ContentType, SHA256: &sum}
	if msgpackOut {
		writeMsgpack(w, http.StatusOK, ref)
		return
	}
	writeJSON(w, http.StatusOK, ref)
}

// uploadError names why an upload failed: the client's body when reading
// it broke off, else the store's refusal.
func uploadError(body *countingReader, err error) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(body.err, &mbe):
		return badField(http.StatusRequestEntityTooLarge, "body", "larger than the %d byte payload limit", messages.MaxPayload)
	case body.err != nil:
		return badField(http.StatusBadRequest, "body", "could not be read after %d bytes: %v", body.n, body.err)
	}
	return blobError(err)
}

// sameBytes hashes an upload to a payload that exists: the same bytes
// answer its description, others a 409.
func sameBytes(body io.Reader, old blobs.Info, o blobs.PutOptions) (blobs.Info, error) {
	h := sha256.New()
	n, err := io.Copy(h, body)
	if err != nil {
		return blobs.Info{}, blobError(err)
	}
	if o.Size >= 0 && n != o.Size {
		return blobs.Info{}, badField(http.StatusBadRequest, "size", "presigned for %d bytes, got %d", o.Size, n)
	}
	if hex.EncodeToString(h.Sum(nil)) != old.SHA256 {
		return blobs.Info{}, badField(http.StatusConflict, "key", "payload %q already exists with other content", path.Base(old.Key))
	}
	return old, nil
}
