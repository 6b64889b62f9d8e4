// Package dist names how nymph binaries are distributed: the target triple
// a binary is built for, the URL a release is served at, and the sha256
// sidecar published beside it. The control plane (which serves releases) and
// the daemon (which downloads them) both use it, so neither imports the
// other's side.
package dist

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

// SidecarExt is appended to a binary's URL or file name to name its
// checksum file.
const SidecarExt = ".sha256"

// BinPrefix starts the file name of every published binary: nymph-<triple>.
const BinPrefix = "nymph-"

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
		return "", fmt.Errorf("dist: url %q: %w", binaryURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("dist: url %q: not an absolute http(s) URL", binaryURL)
	}
	u.Path += SidecarExt
	u.RawPath = ""
	return u.String(), nil
}

// ParseSidecar reads the first field of the first line of a .sha256 file
// ("<hex>  <name>", or a bare hex digest) and returns it in lowercase.
func ParseSidecar(r io.Reader) (string, error) {
	line, err := bufio.NewReader(io.LimitReader(r, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("dist: read sidecar: %w", err)
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return "", errors.New("dist: sidecar is empty")
	}
	sum := strings.ToLower(fields[0])
	if !messages.ValidSHA256(sum) {
		return "", fmt.Errorf("dist: sidecar starts with %q, not a 64-character hex sha256", truncate(fields[0], 80))
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
		return "", fmt.Errorf("dist: sidecar %s: %w", su, err)
	}
	if client == nil {
		client = &http.Client{}
	}
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = RedactURL(ue.URL) // a presigned query is a credential
		}
		return "", fmt.Errorf("dist: fetch sidecar: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("dist: fetch sidecar %s: HTTP %s", RedactURL(su), resp.Status)
	}
	sum, err := ParseSidecar(resp.Body)
	if err != nil {
		return "", fmt.Errorf("%w (from %s)", err, RedactURL(su))
	}
	return sum, nil
}

// RedactURL keeps only the scheme, host and path of raw, for messages and
// logs: a presigned query (or userinfo) is a credential.
func RedactURL(raw string) string {
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
