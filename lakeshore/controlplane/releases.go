package controlplane

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"nymph/dist"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/releases"
)

// releaseState is the control plane's half of over-the-air updates: the
// release store it serves binaries from and the limits of publishing.
type releaseState struct {
	store releases.Catalogue // nil: none (Config.Releases, Config.Blobs)
	// download serves GET /v1/releases/...: the binaries from the data
	// dir, or a redirect to a presigned URL of the bucket's.
	download http.Handler
	// public, when set, is the bucket prefix's public URL: downloads are
	// handed out there (Config.BlobsPublicURL).
	public string
	// maxSize caps one published binary; tests lower it.
	maxSize int64
	// client fetches .sha256 sidecars of URLs outside this control plane.
	client *http.Client
}

// releaseRedirectTTL is how long the presigned URL a release download is
// redirected to stays valid: long enough for a slow link to fetch a
// binary, short enough that a leaked one is soon worthless. The URL
// handed out (in an update command, a bootstrap) is this control plane's,
// which never expires.
const releaseRedirectTTL = 30 * time.Minute

// newReleaseState picks the release catalogue cfg names: the shared bucket,
// else the data dir's.
func newReleaseState(cfg Config) releaseState {
	rs := releaseState{maxSize: releases.MaxBinarySize, client: &http.Client{Timeout: sidecarTimeout}}
	switch {
	case cfg.Blobs != nil:
		b := releases.NewBucket(cfg.Blobs, releases.DefaultBucketPrefix)
		rs.store, rs.download, rs.public = b, b.Handler(dist.DefaultPrefix, releaseRedirectTTL), cfg.BlobsPublicURL
	case cfg.Releases != nil:
		rs.store, rs.download = cfg.Releases, cfg.Releases.Handler(dist.DefaultPrefix)
	}
	return rs
}

// releaseURL is where a daemon downloads rel: under the bucket's public
// URL when there is one, else this control plane's release route.
func (s *Server) releaseURL(host string, rel releases.Release) string {
	if s.rel.public != "" {
		return s.rel.public + "/" + releases.DefaultBucketPrefix + rel.Version + "/" + rel.FileName()
	}
	return dist.URLFor(s.currentPublicURL(host), dist.DefaultPrefix, rel.Version, rel.Triple)
}

// sidecarTimeout bounds fetching a checksum for `daemon update --url`.
const sidecarTimeout = 15 * time.Second

var errNoReleaseStore = badField(http.StatusConflict, "", "this control plane has no data directory, so it keeps no releases")

// handleDownloadRelease serves binaries and sidecars without authentication:
// they are not secret, and the daemon checks the download against the
// sha256 of its authenticated command.
func (s *Server) handleDownloadRelease(w http.ResponseWriter, r *http.Request) {
	if s.rel.store == nil {
		http.NotFound(w, r)
		return
	}
	s.rel.download.ServeHTTP(w, r)
}

// releaseFieldError turns a releases validation error into a 400 naming
// field, without the package prefix.
func releaseFieldError(field string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "releases: field "+field+": ")
	return badField(http.StatusBadRequest, field, "%s", msg)
}

// countingReader remembers how much of the upload was read and why reading
// stopped, so a failed publish can be blamed on the right party.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		c.err = err
	}
	return n, err
}

func (s *Server) handlePublishRelease(w http.ResponseWriter, r *http.Request) {
	if s.rel.store == nil {
		writeOperatorError(w, errNoReleaseStore)
		return
	}
	q := r.URL.Query()
	version, triple := q.Get(operatorapi.QueryVersion), q.Get(operatorapi.QueryTriple)
	if err := releases.ValidateVersion(version); err != nil {
		writeOperatorError(w, releaseFieldError("version", err))
		return
	}
	if triple != "" {
		if err := releases.ValidateTriple(triple); err != nil {
			writeOperatorError(w, releaseFieldError("triple", err))
			return
		}
	}
	if r.ContentLength > s.rel.maxSize {
		writeOperatorError(w, badField(http.StatusRequestEntityTooLarge, "body", "the binary is %d bytes; at most %d are accepted", r.ContentLength, s.rel.maxSize))
		return
	}
	body := &countingReader{r: http.MaxBytesReader(w, r.Body, s.rel.maxSize)}
	rel, err := s.rel.store.Publish(r.Context(), body, version, triple)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(body.err, &mbe):
			err = badField(http.StatusRequestEntityTooLarge, "body", "the binary exceeds %d bytes", s.rel.maxSize)
		case body.err != nil:
			err = badField(http.StatusBadRequest, "body", "the upload broke off after %d bytes: %v", body.n, body.err)
		case body.n == 0:
			err = badField(http.StatusBadRequest, "body", "empty; send the binary as the request body")
		default:
			s.log.Error().Err(err).Str("version", version).Str("triple", triple).Msg("publish release")
		}
		writeOperatorError(w, err)
		return
	}
	s.log.Info().Str("version", rel.Version).Str("triple", rel.Triple).Str("sha256", rel.SHA256).
		Int64("size", rel.Size).Msg("release published")
	writeJSON(w, http.StatusCreated, s.releaseView(r, rel))
}

// handleDeleteRelease removes one published binary. A version that a
// namespace targets is kept: its daemons would be told to update to a
// binary that is gone.
func (s *Server) handleDeleteRelease(w http.ResponseWriter, r *http.Request) {
	if s.rel.store == nil {
		writeOperatorError(w, errNoReleaseStore)
		return
	}
	version, triple := r.PathValue("version"), r.PathValue("triple")
	if err := releases.ValidateVersion(version); err != nil {
		writeOperatorError(w, releaseFieldError("version", err))
		return
	}
	if err := releases.ValidateTriple(triple); err != nil {
		writeOperatorError(w, releaseFieldError("triple", err))
		return
	}
	nss, err := s.st.NamespacesTargeting(r.Context(), version)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	if len(nss) > 0 {
		writeOperatorError(w, badField(http.StatusConflict, "version",
			"%s is the target version of namespace %s; set another target or clear it first (lakeshore daemon set-target-version)",
			version, strings.Join(nss, ", ")))
		return
	}
	rel, err := s.rel.store.DeleteContext(r.Context(), version, triple)
	if errors.Is(err, releases.ErrNotFound) {
		writeOperatorError(w, badField(http.StatusNotFound, "version", "no release %s for %s", version, triple))
		return
	}
	if err != nil {
		s.log.Error().Err(err).Str("version", version).Str("triple", triple).Msg("delete release")
		writeOperatorError(w, err)
		return
	}
	s.log.Info().Str("version", rel.Version).Str("triple", rel.Triple).Msg("release deleted")
	writeJSON(w, http.StatusOK, s.releaseView(r, rel))
}

func (s *Server) handleListReleases(w http.ResponseWriter, r *http.Request) {
	out := operatorapi.ReleaseList{Releases: []operatorapi.Release{}}
	if s.rel.store != nil {
		all, err := s.rel.store.ListContext(r.Context())
		if err != nil {
			s.log.Error().Err(err).Msg("list releases")
			writeOperatorError(w, err)
			return
		}
		for _, rel := range all {
			out.Releases = append(out.Releases, s.releaseView(r, rel))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) releaseView(r *http.Request, rel releases.Release) operatorapi.Release {
	u := s.releaseURL(r.Host, rel)
	return operatorapi.Release{
		Version: rel.Version, Triple: rel.Triple, SHA256: rel.SHA256, Size: rel.Size,
		PublishedAt: rel.PublishedAt, URL: u, SidecarURL: u + ".sha256",
	}
}

// publishedTriples lists the triples version is published for here.
func (s *Server) publishedTriples(ctx context.Context, version string) ([]string, error) {
	out := []string{}
	if s.rel.store == nil {
		return out, nil
	}
	all, err := s.rel.store.ListContext(ctx)
	if err != nil {
		return nil, err
	}
	for _, rel := range all {
		if rel.Version == version {
			out = append(out, rel.Triple)
		}
	}
	return out, nil
}
