package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/rs/zerolog"

	"nymph/dist"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/releases"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// targetVersionFor is what a poll response advertises as
// target_nymph_version. A store failure is logged and advertised as no
// target: a daemon must keep getting its commands whatever this costs.
func (s *Server) targetVersionFor(ctx context.Context, namespace string, log zerolog.Logger) *string {
	if v, ok := s.caches.targetVersion(namespace); ok {
		return v
	}
	epoch := s.caches.mark()
	v, err := s.st.TargetVersion(ctx, namespace)
	if err != nil {
		log.Warn().Err(err).Msg("poll: read target version")
		return nil
	}
	s.caches.putTargetVersion(namespace, v, epoch)
	return v
}

func (s *Server) writeTargetVersion(ctx context.Context, w http.ResponseWriter, ns string, v *string) {
	out := operatorapi.TargetVersion{Namespace: ns, Version: v, PublishedTriples: []string{}}
	if v != nil {
		triples, err := s.publishedTriples(ctx, *v)
		if err != nil {
			s.log.Error().Err(err).Msg("target version: list releases")
			writeOperatorError(w, err)
			return
		}
		out.PublishedTriples = triples
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetTargetVersion(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	v, err := s.st.TargetVersion(r.Context(), ns)
	if err != nil {
		s.log.Error().Err(err).Msg("read target version")
		writeOperatorError(w, err)
		return
	}
	s.writeTargetVersion(r.Context(), w, ns, v)
}

func (s *Server) handleSetTargetVersion(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	var req operatorapi.SetTargetVersionRequest
	if err := readJSON(w, r, &req); err != nil {
		writeOperatorError(w, err)
		return
	}
	if err := releases.ValidateVersion(req.Version); err != nil {
		writeOperatorError(w, releaseFieldError("version", err))
		return
	}
	err = s.st.SetTargetVersion(r.Context(), ns, &req.Version, s.now())
	s.announce(targetAnnouncement(ns))
	if err != nil {
		s.log.Error().Err(err).Msg("set target version")
		writeOperatorError(w, err)
		return
	}
	s.log.Info().Str("namespace", ns).Str("version", req.Version).Msg("target version set")
	s.writeTargetVersion(r.Context(), w, ns, &req.Version)
}

func (s *Server) handleClearTargetVersion(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	err = s.st.SetTargetVersion(r.Context(), ns, nil, s.now())
	s.announce(targetAnnouncement(ns))
	if err != nil {
		s.log.Error().Err(err).Msg("clear target version")
		writeOperatorError(w, err)
		return
	}
	s.log.Info().Str("namespace", ns).Msg("target version cleared")
	s.writeTargetVersion(r.Context(), w, ns, nil)
}

// workerVersions is the part of a worker's hello versions an update needs.
type workerVersions struct {
	Daemon *string `json:"daemon"`
	Arch   *string `json:"arch"`
}

func versionsOf(wk store.Worker) workerVersions {
	var v workerVersions
	_ = json.Unmarshal(wk.Versions, &v) // a worker with unreadable versions just has none
	return v
}

// handleUpdateWorker queues an ota_update. Whatever the request leaves out
// is filled in here, so the daemon always gets a complete, checked command:
// the version from the namespace's target, the URL from this control
// plane's release for the worker's architecture, the checksum from the
// release store or the URL's .sha256 sidecar.
func (s *Server) handleUpdateWorker(w http.ResponseWriter, r *http.Request) {
	wk, err := s.resolveWorker(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	var req operatorapi.UpdateRequest
	if err := readJSON(w, r, &req); err != nil {
		writeOperatorError(w, err)
		return
	}
	ota, err := s.resolveUpdate(r, wk, req)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	c, err := s.enqueue(r, wk, messages.KindOtaUpdate, ota, nil, nil)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	cur := versionsOf(wk).Daemon
	s.log.Info().Str("worker_id", wk.ID).Str("command_id", c.ID).Str("version", ota.Version).
		Str("url", dist.RedactURL(ota.URL)).Str("sha256", ota.SHA256).Msg("ota_update queued")
	writeJSON(w, http.StatusAccepted, operatorapi.UpdateQueued{
		CommandID: c.ID, WorkerID: wk.ID, Kind: messages.KindOtaUpdate,
		Version: ota.Version, URL: ota.URL, SHA256: ota.SHA256, CurrentVersion: cur,
	})
}

// maxURLLen bounds an operator-given download URL.
const maxURLLen = 4096

func (s *Server) resolveUpdate(r *http.Request, wk store.Worker, req operatorapi.UpdateRequest) (*messages.OtaUpdate, error) {
	version := strings.TrimSpace(req.Version)
	if version == "" {
		target, err := s.st.TargetVersion(r.Context(), wk.Namespace)
		if err != nil {
			return nil, err
		}
		if target == nil {
			return nil, badField(http.StatusBadRequest, "version",
				"no version was given, and namespace %q has no target version to fall back to: pass --version V, or set the target with `lakeshore daemon set-target-version V`", wk.Namespace)
		}
		version = *target
	}
	if err := releases.ValidateVersion(version); err != nil {
		return nil, releaseFieldError("version", err)
	}
	sum := strings.ToLower(strings.TrimSpace(req.SHA256))
	if sum != "" && !messages.ValidSHA256(sum) {
		return nil, badField(http.StatusBadRequest, "sha256", "must be exactly 64 hex characters, got %d characters", len(req.SHA256))
	}

	rawURL := strings.TrimSpace(req.URL)
	if rawURL == "" {
		rel, err := s.releaseForWorker(r.Context(), wk, version)
		if err != nil {
			return nil, err
		}
		rawURL = s.releaseURL(r.Host, rel)
		if sum == "" {
			sum = rel.SHA256
		}
		return &messages.OtaUpdate{Version: version, URL: rawURL, SHA256: sum}, nil
	}

	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(rawURL) > maxURLLen {
		return nil, badField(http.StatusBadRequest, "url", "must be an absolute http(s) URL of at most %d characters", maxURLLen)
	}
	if sum == "" {
		if sum, err = s.checksumOf(r, u); err != nil {
			return nil, err
		}
	}
	return &messages.OtaUpdate{Version: version, URL: rawURL, SHA256: sum}, nil
}

// releaseForWorker finds the published release of version for the
// worker's architecture.
func (s *Server) releaseForWorker(ctx context.Context, wk store.Worker, version string) (releases.Release, error) {
	if s.rel.store == nil {
		return releases.Release{}, badField(http.StatusConflict, "url",
			"this control plane keeps no releases (no data directory); give the download URL")
	}
	arch := versionsOf(wk).Arch
	if arch == nil || *arch == "" {
		return releases.Release{}, badField(http.StatusConflict, "url",
			"worker %s did not report its architecture (versions.arch), so no release can be chosen for it; give the download URL", wk.ID)
	}
	triple, err := dist.TripleForArch(*arch)
	if err != nil {
		return releases.Release{}, badField(http.StatusConflict, "url",
			"worker %s runs on %q, for which no release triple is known; give the download URL", wk.ID, *arch)
	}
	rel, err := s.rel.store.GetContext(ctx, version, triple)
	if errors.Is(err, releases.ErrNotFound) {
		return releases.Release{}, badField(http.StatusConflict, "version",
			"nymph %s is not published for %s (worker %s, arch %s); publish it with `lakeshore release publish PATH --version %s --triple %s` or give the download URL",
			version, triple, wk.ID, *arch, version, triple)
	}
	if err != nil {
		s.log.Error().Err(err).Str("version", version).Str("triple", triple).Msg("read release")
		return releases.Release{}, err
	}
	return rel, nil
}

// checksumOf finds the sha256 of the binary at u: from the release store
// when u is one of this control plane's own release URLs, else from the
// .sha256 sidecar published next to it.
func (s *Server) checksumOf(r *http.Request, u *url.URL) (string, error) {
	if v, t, ok := s.ownRelease(r, u); ok {
		if s.rel.store == nil {
			return "", errNoReleaseStore
		}
		rel, err := s.rel.store.GetContext(r.Context(), v, t)
		if errors.Is(err, releases.ErrNotFound) {
			return "", badField(http.StatusConflict, "url", "names release %s for %s, which is not published here", v, t)
		}
		if err != nil {
			return "", err
		}
		return rel.SHA256, nil
	}
	sum, err := dist.FetchChecksum(r.Context(), s.rel.client, u.String())
	if err != nil {
		return "", badField(http.StatusConflict, "sha256",
			"no sha256 was given, and the checksum could not be read from the URL's sidecar (the URL with .sha256 appended): %v; pass --sha256 with the binary's 64 hex characters", err)
	}
	return sum, nil
}

// ownRelease reports whether u addresses this control plane's release
// route, and which release. It answers from the store rather than over
// HTTP, which the public URL may not even allow from inside.
func (s *Server) ownRelease(r *http.Request, u *url.URL) (version, triple string, ok bool) {
	pub, err := url.Parse(s.currentPublicURL(r.Host))
	if err != nil {
		return "", "", false
	}
	if !strings.EqualFold(u.Host, pub.Host) && !strings.EqualFold(u.Host, r.Host) {
		return "", "", false
	}
	rest, found := strings.CutPrefix(u.Path, strings.TrimRight(pub.Path, "/")+dist.DefaultPrefix+"/")
	if !found {
		return "", "", false
	}
	version, triple, found = strings.Cut(rest, "/")
	if !found || strings.Contains(triple, "/") || strings.HasSuffix(triple, ".sha256") {
		return "", "", false
	}
	if releases.ValidateVersion(version) != nil || releases.ValidateTriple(triple) != nil {
		return "", "", false
	}
	return version, triple, true
}
