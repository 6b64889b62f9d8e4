package releases

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"nymph/dist"
	"nymph/lakeshore/blobs"
)

// Handler serves the store under prefix:
//
//	GET|HEAD <prefix>/<version>/<triple>         the binary (ETag = its sha256; Range supported)
//	GET|HEAD <prefix>/<version>/<triple>.sha256  the sidecar, text/plain
//
// Anything else under prefix is 404, another method 405. The binaries are
// not secret — the daemon trusts the sha256 in its authenticated command,
// not the download — so the handler does no authentication of its own.
func (s *Store) Handler(prefix string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		version, triple, sidecar, ok := route(w, r, prefix)
		if !ok {
			return
		}
		rel, f, err := s.open(version, triple, !sidecar)
		if !lookedUp(w, version, triple, err) {
			return
		}
		releaseHeaders(w, rel, sidecar)
		if sidecar {
			http.ServeContent(w, r, "", rel.PublishedAt, strings.NewReader(rel.Sidecar()))
			return
		}
		defer f.Close()
		http.ServeContent(w, r, "", rel.PublishedAt, f)
	})
}

// route parses <prefix>/<version>/<triple>[.sha256] and answers 404 or
// 405 itself when the request is not one.
func route(w http.ResponseWriter, r *http.Request, prefix string) (version, triple string, sidecar, ok bool) {
	prefix = "/" + strings.Trim(prefix, "/")
	if prefix == "/" {
		prefix = ""
	}
	rest, ok := strings.CutPrefix(r.URL.Path, prefix+"/")
	version, file, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || version == "" || file == "" || strings.Contains(file, "/") {
		http.NotFound(w, r)
		return "", "", false, false
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return "", "", false, false
	}
	triple, sidecar = strings.CutSuffix(file, dist.SidecarExt)
	if ValidateVersion(version) != nil || ValidateTriple(triple) != nil {
		http.NotFound(w, r)
		return "", "", false, false
	}
	return version, triple, sidecar, true
}

// lookedUp answers a failed lookup (404, or 500 for a store that failed)
// and reports whether there is a release to serve.
func lookedUp(w http.ResponseWriter, version, triple string, err error) bool {
	if errors.Is(err, ErrNotFound) {
		http.Error(w, fmt.Sprintf("no release %s for %s", version, triple), http.StatusNotFound)
		return false
	}
	if err != nil {
		http.Error(w, "release store unavailable", http.StatusInternalServerError)
		return false
	}
	return true
}

func releaseHeaders(w http.ResponseWriter, rel Release, sidecar bool) {
	// A version can be re-published, so caches must revalidate; the ETag
	// makes that cheap.
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("ETag", `"`+rel.SHA256+`"`)
	if sidecar {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="`+rel.FileName()+`"`)
}

// Handler serves the bucket's releases at the paths Store.Handler does.
// The sidecar comes from the catalogue. The binary is streamed from the
// blob store (no Range: the blob store's reader is not seekable), or,
// with presign > 0, the request is redirected (302) to a presigned GET of
// it that is valid for presign, so the bytes never pass through the
// control plane; the daemon follows the redirect and checks the sha256
// its command names either way.
func (b *Bucket) Handler(prefix string, presign time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		version, triple, sidecar, ok := route(w, r, prefix)
		if !ok {
			return
		}
		ctx := r.Context()
		if sidecar {
			rel, err := b.GetContext(ctx, version, triple)
			if !lookedUp(w, version, triple, err) {
				return
			}
			releaseHeaders(w, rel, true)
			http.ServeContent(w, r, "", rel.PublishedAt, strings.NewReader(rel.Sidecar()))
			return
		}
		if presign > 0 {
			rel, err := b.GetContext(ctx, version, triple)
			if !lookedUp(w, version, triple, err) {
				return
			}
			p, err := b.st.PresignGet(ctx, b.Key(version, triple), presign)
			if !lookedUp(w, version, triple, notFoundOf(err)) {
				return
			}
			w.Header().Set("Cache-Control", "no-store") // the URL expires
			w.Header().Set("ETag", `"`+rel.SHA256+`"`)
			http.Redirect(w, r, p.URL, http.StatusFound)
			return
		}
		rc, rel, err := b.Open(ctx, version, triple)
		if errors.Is(err, blobs.ErrChecksum) {
			// A re-publish caught half way: the next try finds it whole.
			w.Header().Set("Retry-After", "1")
			http.Error(w, fmt.Sprintf("release %s for %s is being re-published; retry", version, triple), http.StatusServiceUnavailable)
			return
		}
		if !lookedUp(w, version, triple, err) {
			return
		}
		defer rc.Close()
		releaseHeaders(w, rel, false)
		if match := r.Header.Get("If-None-Match"); match == `"`+rel.SHA256+`"` || match == "*" {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Last-Modified", rel.PublishedAt.UTC().Format(http.TimeFormat))
		w.Header().Set("Content-Length", strconv.FormatInt(rel.Size, 10))
		if r.Method == http.MethodHead {
			return
		}
		// An error half way (the checksum at EOF among them) can only cut
		// the response short; the daemon then refuses the download.
		_, _ = io.Copy(w, rc)
	})
}

// notFoundOf maps the blob store's ErrNotFound to the catalogue's.
func notFoundOf(err error) error {
	if errors.Is(err, blobs.ErrNotFound) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}
