package releases

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"nymph/messages"
)

// DefaultPrefix is where the control plane mounts Handler unless it has a
// reason not to.
const DefaultPrefix = "/v1/releases"

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
		triple, sidecar := strings.CutSuffix(file, sidecarExt)
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

// URLFor is the address a daemon downloads version/triple from, given the
// control plane's public base URL and the prefix Handler is mounted at.
func URLFor(publicURL, prefix, version, triple string) string {
	base := strings.TrimRight(publicURL, "/")
	if p := strings.Trim(prefix, "/"); p != "" {
		base += "/" + p
	}
	return base + "/" + url.PathEscape(version) + "/" + url.PathEscape(triple)
}

// SidecarURL is where the checksum of the binary at binaryURL is published.
// A query string stays after the path, so a presigned URL keeps working.
func SidecarURL(binaryURL string) (string, error) {
	u, err := url.Parse(binaryURL)
	if err != nil {
		return "", fmt.Errorf("releases: url %q: %w", binaryURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("releases: url %q: not an absolute http(s) URL", binaryURL)
	}
	u.Path += sidecarExt
	u.RawPath = ""
	return u.String(), nil
}

// ParseSidecar reads the first field of the first line of a .sha256 file
// ("<hex>  <name>", or a bare hex digest) and returns it in lowercase.
func ParseSidecar(r io.Reader) (string, error) {
	line, err := bufio.NewReader(io.LimitReader(r, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("releases: read sidecar: %w", err)
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return "", errors.New("releases: sidecar is empty")
	}
	sum := strings.ToLower(fields[0])
	if !messages.ValidSHA256(sum) {
		return "", fmt.Errorf("releases: sidecar starts with %q, not a 64-character hex sha256", truncate(fields[0], 80))
	}
	return sum, nil
}

// FetchChecksum downloads the sidecar of binaryURL and returns the digest
// it publishes. It is how the control plane fills in the sha256 of an
// ota_update whose --url points outside its own store.
func FetchChecksum(ctx context.Context, client *http.Client, binaryURL string) (string, error) {
	su, err := SidecarURL(binaryURL)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, su, nil)
	if err != nil {
		return "", fmt.Errorf("releases: sidecar %s: %w", su, err)
	}
	if client == nil {
		client = &http.Client{}
	}
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = redact(ue.URL) // a presigned query is a credential
		}
		return "", fmt.Errorf("releases: fetch sidecar: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("releases: fetch sidecar %s: HTTP %s", redact(su), resp.Status)
	}
	sum, err := ParseSidecar(resp.Body)
	if err != nil {
		return "", fmt.Errorf("%w (from %s)", err, redact(su))
	}
	return sum, nil
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparseable url>"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
