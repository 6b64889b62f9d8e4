package releases

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"nymph/dist"
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
	prefix = "/" + strings.Trim(prefix, "/")
	if prefix == "/" {
		prefix = ""
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, prefix+"/")
		version, file, ok2 := strings.Cut(rest, "/")
		if !ok || !ok2 || version == "" || file == "" || strings.Contains(file, "/") {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		triple, sidecar := strings.CutSuffix(file, dist.SidecarExt)
		if ValidateVersion(version) != nil || ValidateTriple(triple) != nil {
			http.NotFound(w, r)
			return
		}
		rel, f, err := s.open(version, triple, !sidecar)
		if errors.Is(err, ErrNotFound) {
			http.Error(w, fmt.Sprintf("no release %s for %s", version, triple), http.StatusNotFound)
			return
		}
		if err != nil {
			http.Error(w, "release store unavailable", http.StatusInternalServerError)
			return
		}
		// A version can be re-published, so caches must revalidate; the ETag
		// makes that cheap.
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("ETag", `"`+rel.SHA256+`"`)
		if sidecar {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			http.ServeContent(w, r, "", rel.PublishedAt, strings.NewReader(rel.Sidecar()))
			return
		}
		defer f.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="`+rel.FileName()+`"`)
		http.ServeContent(w, r, "", rel.PublishedAt, f)
	})
}
