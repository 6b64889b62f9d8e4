package controlplane

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"nymph/atomicfile"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// The payload store keeps blobs (large invocation args, for now) as files
// under its directory, <namespace>/<key>, and the metadata of each (size,
// sha256, content type) as <namespace>/.meta/<key>.json: a key starts with
// a letter or digit, so no key names that directory or anything in it.
// (Metadata once sat beside its blob as <key>.meta.json, which is also a
// valid key: storing key "victim.meta.json" overwrote the metadata of key
// "victim". migrateLegacy moves such a data dir to this layout.)
// Readers and writers never get a path: presign
// hands out a capability URL whose token names the namespace, key,
// operation and expiry and is signed with a key derived from the admin
// token, so it survives restarts and cannot be forged or stretched.

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
)

var errNoPayloadStore = badField(http.StatusServiceUnavailable, "payloads", "this control plane has no data directory, so no payload store")

// PayloadStore is the on-disk blob store. A nil *PayloadStore is none: the
// payload routes say so.
type PayloadStore struct {
	dir string
}

// NewPayloadStore keeps blobs under dir, which is created (0700) with the
// first one.
func NewPayloadStore(dir string) *PayloadStore { return &PayloadStore{dir: dir} }

// payloadMeta is the metadata of one blob.
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

// meta reads a blob's metadata; a blob that does not exist, or has no
// metadata, is ErrNotExist.
func (p *PayloadStore) meta(ns, key string) (payloadMeta, error) {
	if p == nil {
		return payloadMeta{}, errNoPayloadStore
	}
	if _, err := os.Stat(p.path(ns, key)); err != nil {
		return payloadMeta{}, err
	}
	b, err := os.ReadFile(p.metaPath(ns, key))
	if err != nil {
		return payloadMeta{}, fmt.Errorf("payload %s/%s: metadata: %w", ns, key, err)
	}
	var m payloadMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return payloadMeta{}, fmt.Errorf("payload %s/%s: metadata: %w", ns, key, err)
	}
	return m, nil
}

// put streams r (at most messages.MaxPayload bytes, exactly want when want
// >= 0) into the blob ns/key, hashing as it goes. A blob already there with
// the same bytes makes this a no-op; with other bytes it is a conflict.
func (p *PayloadStore) put(ns, key string, r io.Reader, want int64, contentType string, now time.Time) (payloadMeta, error) {
	if p == nil {
		return payloadMeta{}, errNoPayloadStore
	}
	if err := os.MkdirAll(filepath.Join(p.dir, ns, metaDir), 0o700); err != nil {
		return payloadMeta{}, fmt.Errorf("payload dir: %w", err)
	}
	blob, err := atomicfile.Create(p.path(ns, key), 0o600)
	if err != nil {
		return payloadMeta{}, fmt.Errorf("payload temp file: %w", err)
	}
	defer blob.Cleanup()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(blob, h), io.LimitReader(r, messages.MaxPayload+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return payloadMeta{}, badField(http.StatusRequestEntityTooLarge, "body", "larger than the %d byte payload limit", messages.MaxPayload)
		}
		return payloadMeta{}, badField(http.StatusBadRequest, "body", "could not be read: %v", err)
	}
	if n > messages.MaxPayload {
		return payloadMeta{}, badField(http.StatusRequestEntityTooLarge, "body", "larger than the %d byte payload limit", messages.MaxPayload)
	}
	if want >= 0 && n != want {
		return payloadMeta{}, badField(http.StatusBadRequest, "size", "presigned for %d bytes, got %d", want, n)
	}
	if contentType == "" {
		contentType = "application/octet-stream"
	}
	m := payloadMeta{Size: n, SHA256: hex.EncodeToString(h.Sum(nil)), ContentType: contentType, CreatedAt: now.UTC()}
	if old, err := p.meta(ns, key); err == nil {
		if old.SHA256 == m.SHA256 {
			return old, nil
		}
		return payloadMeta{}, badField(http.StatusConflict, "key", "payload %q already exists with other content", key)
	}
	mb, _ := json.Marshal(m)
	if err := atomicfile.Write(p.metaPath(ns, key), mb, 0o600); err != nil {
		return payloadMeta{}, fmt.Errorf("payload metadata: %w", err)
	}
	// The blob goes last: its presence means its metadata is complete.
	if err := blob.Commit(); err != nil {
		return payloadMeta{}, fmt.Errorf("payload write: %w", err)
	}
	return m, nil
}

// capability is what a presigned URL grants.
type capability struct {
	Op  string `json:"o"`
	NS  string `json:"n"`
	Key string `json:"k"`
	// Size is the exact size a put must have; -1 means any.
	Size int64 `json:"s"`
	Exp  int64 `json:"e"`
}

// urlKey signs capabilities.
type urlKey []byte

func newURLKey(adminToken string) urlKey {
	mac := hmac.New(sha256.New, []byte(adminToken))
	mac.Write([]byte("lakeshore payload capability URLs v1"))
	return mac.Sum(nil)
}

func (k urlKey) sign(c capability) string {
	body, _ := json.Marshal(c)
	enc := base64.RawURLEncoding.EncodeToString(body)
	mac := hmac.New(sha256.New, k)
	mac.Write([]byte(enc))
	return enc + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// verify checks a token's signature, expiry and operation.
func (k urlKey) verify(token, op string, now time.Time) (capability, error) {
	forbidden := badField(http.StatusForbidden, "token", "not a valid payload URL (unknown, tampered with, or for another operation)")
	enc, sig, ok := strings.Cut(token, ".")
	if !ok || len(token) > 2048 {
		return capability{}, forbidden
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return capability{}, forbidden
	}
	mac := hmac.New(sha256.New, k)
	mac.Write([]byte(enc))
	if !hmac.Equal(got, mac.Sum(nil)) {
		return capability{}, forbidden
	}
	body, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return capability{}, forbidden
	}
	var c capability
	if json.Unmarshal(body, &c) != nil || c.Op != op || !validNamespace(c.NS) || !payloadKeyRe().MatchString(c.Key) {
		return capability{}, forbidden
	}
	if now.Unix() > c.Exp {
		return capability{}, badField(http.StatusForbidden, "token", "payload URL expired at %s; presign again",
			time.Unix(c.Exp, 0).UTC().Format(time.RFC3339))
	}
	return c, nil
}

// storeArgs keeps large invocation args in the payload store and returns
// the ref a daemon resolves them by.
func (s *Server) storeArgs(ns, key string, data []byte) (*messages.PayloadRef, error) {
	m, err := s.payloads.put(ns, key, bytes.NewReader(data), int64(len(data)), "application/octet-stream", s.now())
	if err != nil {
		return nil, err
	}
	sum := m.SHA256
	return &messages.PayloadRef{Bucket: operatorapi.PayloadBucket, Key: key, Size: uint64(m.Size), ContentType: m.ContentType, SHA256: &sum}, nil
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
	now := s.now()
	c := capability{NS: ns, Size: -1, Exp: now.Add(operatorapi.PayloadTTL).Unix()}
	key := ""
	if req.Key != nil {
		key = *req.Key
	}
	if key != "" && !payloadKeyRe().MatchString(key) {
		return nil, badField(http.StatusBadRequest, "key", "must be 1-200 letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	switch req.Op {
	case messages.PresignGet:
		if key == "" {
			return nil, badField(http.StatusBadRequest, "key", "required for op get")
		}
		if _, err := s.payloads.meta(ns, key); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, badField(http.StatusNotFound, "key", "no payload %q in namespace %q", key, ns)
			}
			return nil, err
		}
	case messages.PresignPut:
		if req.Size != nil {
			if *req.Size > messages.MaxPayload {
				return nil, badField(http.StatusRequestEntityTooLarge, "size", "%d bytes is over the %d byte payload limit", *req.Size, messages.MaxPayload)
			}
			c.Size = int64(*req.Size)
		}
		if key == "" {
			key = newPayloadKey(req.Kind, req.JobID)
		}
	default:
		return nil, badField(http.StatusBadRequest, "op", "must be %q or %q", messages.PresignGet, messages.PresignPut)
	}
	c.Op, c.Key = req.Op, key
	return &messages.PresignResponse{
		URL:        s.currentPublicURL(r.Host) + payloadPrefix + s.urlKey.sign(c),
		Key:        key,
		ExpiresAtS: messages.Epoch(c.Exp),
	}, nil
}

var keyPartRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[^A-Za-z0-9._-]+`) })

// newPayloadKey names a new blob after its kind and job when they are
// given, so a directory listing is readable, and makes it unique.
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

func (s *Server) handlePayloadGet(w http.ResponseWriter, r *http.Request) {
	c, err := s.urlKey.verify(r.PathValue("token"), messages.PresignGet, s.now())
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	m, err := s.payloads.meta(c.NS, c.Key)
	if errors.Is(err, os.ErrNotExist) {
		writeOperatorError(w, badField(http.StatusNotFound, "key", "payload %q is gone", c.Key))
		return
	}
	if err != nil {
		s.log.Error().Err(err).Str("key", c.Key).Msg("payload read")
		writeOperatorError(w, err)
		return
	}
	f, err := os.Open(s.payloads.path(c.NS, c.Key))
	if err != nil {
		s.log.Error().Err(err).Str("key", c.Key).Msg("payload open")
		writeOperatorError(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", m.ContentType)
	w.Header().Set("Content-Length", strconv.FormatInt(m.Size, 10))
	w.Header().Set("X-Checksum-Sha256", m.SHA256)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = io.Copy(w, f)
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
	c, err := s.urlKey.verify(r.PathValue("token"), messages.PresignPut, s.now())
	if err != nil {
		fail(err)
		return
	}
	if r.ContentLength > messages.MaxPayload {
		fail(badField(http.StatusRequestEntityTooLarge, "body", "%d bytes is over the %d byte payload limit", r.ContentLength, messages.MaxPayload))
		return
	}
	if c.Size >= 0 && r.ContentLength >= 0 && r.ContentLength != c.Size {
		fail(badField(http.StatusBadRequest, "size", "presigned for %d bytes, Content-Length says %d", c.Size, r.ContentLength))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, messages.MaxPayload)
	ct := r.Header.Get("Content-Type")
	if len(ct) > 200 {
		ct = ""
	}
	m, err := s.payloads.put(c.NS, c.Key, r.Body, c.Size, ct, s.now())
	if err != nil {
		var fe *fieldError
		if !errors.As(err, &fe) {
			s.log.Error().Err(err).Str("key", c.Key).Msg("payload write")
		}
		fail(err)
		return
	}
	s.log.Info().Str("namespace", c.NS).Str("key", c.Key).Int64("size", m.Size).Str("sha256", m.SHA256).Msg("payload stored")
	sum := m.SHA256
	ref := &operatorapi.PayloadStored{Bucket: operatorapi.PayloadBucket, Key: c.Key, Size: uint64(m.Size), ContentType: m.ContentType, SHA256: &sum}
	if msgpackOut {
		writeMsgpack(w, http.StatusOK, ref)
		return
	}
	writeJSON(w, http.StatusOK, ref)
}
