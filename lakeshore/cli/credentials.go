package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"nymph/atomicfile"
)

// Environment variables lakeshore reads.
const (
	EnvURL         = "LAKESHORE_URL"
	EnvAdminToken  = "LAKESHORE_ADMIN_TOKEN"
	EnvNamespace   = "LAKESHORE_NAMESPACE"
	EnvCredentials = "LAKESHORE_CREDENTIALS"
	EnvDaemonToken = "LAKESHORE_DAEMON_TOKEN"
)

// Credentials is the file `lakeshore serve` leaves behind (mode 0600) so
// the CLI on the same machine needs no flags. URL is how this machine
// reaches the server; PublicURL is what daemons were told, and a token is
// also offered to a --server naming that.
type Credentials struct {
	URL        string `json:"url"`
	AdminToken string `json:"adminToken"`
	PublicURL  string `json:"publicUrl,omitempty"`
}

// CredentialsPath is $LAKESHORE_CREDENTIALS, else
// $XDG_CONFIG_HOME/lakeshore/credentials.json, else
// ~/.config/lakeshore/credentials.json.
func CredentialsPath(getenv func(string) string) (string, error) {
	if p := getenv(EnvCredentials); p != "" {
		return p, nil
	}
	if x := getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "lakeshore", "credentials.json"), nil
	}
	home := getenv("HOME")
	if home == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("locate the credentials file: %w", err)
		}
		home = h
	}
	return filepath.Join(home, ".config", "lakeshore", "credentials.json"), nil
}

// ReadCredentials loads path; a missing file is fs.ErrNotExist.
func ReadCredentials(path string) (Credentials, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Credentials{}, err
	}
	var c Credentials
	if err := json.Unmarshal(b, &c); err != nil {
		return Credentials{}, fmt.Errorf("credentials file %s: %w", path, err)
	}
	return c, nil
}

// WriteCredentials replaces path atomically with mode 0600, creating its
// directory with mode 0700.
func WriteCredentials(path string, c Credentials) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("credentials directory: %w", err)
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write credentials: %w", err)
	}
	return nil
}

// target is the control plane a command talks to.
type target struct {
	URL       string
	Token     string
	Namespace string
}

// errNoControlPlane is what an unconfigured CLI says.
var errNoControlPlane = errors.New("no control plane configured: run `lakeshore serve` here, or set " + EnvURL + " (or pass --server)")

// resolveTarget applies the precedence flag > environment > credentials
// file. The file's token is only offered to the server it was written for.
func resolveTarget(flagURL, flagToken, namespace string, getenv func(string) string) (target, error) {
	t := target{URL: flagURL, Token: flagToken, Namespace: namespace}
	if t.URL == "" {
		t.URL = getenv(EnvURL)
	}
	if t.Token == "" {
		t.Token = getenv(EnvAdminToken)
	}
	if t.Namespace == "" {
		t.Namespace = getenv(EnvNamespace)
	}
	if t.URL != "" && t.Token != "" {
		t.URL = withScheme(t.URL)
		return t, nil
	}
	path, err := CredentialsPath(getenv)
	if err != nil {
		return t, err
	}
	creds, err := ReadCredentials(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if t.URL == "" {
			return t, errNoControlPlane
		}
		return t, fmt.Errorf("no admin token for %s: set %s or pass --admin-token", t.URL, EnvAdminToken)
	case err != nil:
		return t, err
	}
	if t.URL == "" {
		if creds.URL == "" {
			return t, fmt.Errorf("%w (%s names no url)", errNoControlPlane, path)
		}
		t.URL = creds.URL
	}
	t.URL = withScheme(t.URL)
	if t.Token == "" {
		if sameServer(t.URL, creds.URL) || sameServer(t.URL, creds.PublicURL) {
			t.Token = creds.AdminToken
		}
		if t.Token == "" {
			return t, fmt.Errorf("no admin token for %s: set %s or pass --admin-token (%s is for %s)", t.URL, EnvAdminToken, path, creds.URL)
		}
	}
	return t, nil
}

// withScheme lets "host:port" stand for "http://host:port".
func withScheme(u string) string {
	u = strings.TrimSpace(u)
	if u != "" && !strings.Contains(u, "://") {
		return "http://" + u
	}
	return u
}

// sameServer compares two URLs by scheme, host and port, treating every
// loopback spelling as one host.
func sameServer(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	ka, oka := serverKey(withScheme(a))
	kb, okb := serverKey(withScheme(b))
	return oka && okb && ka == kb
}

func serverKey(raw string) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", false
	}
	scheme := strings.ToLower(u.Scheme)
	host := strings.ToLower(u.Hostname())
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	if host == "localhost" {
		host = "loopback"
	} else if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		host = "loopback"
	}
	return scheme + "://" + host + ":" + port, true
}
