package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestResolveTargetPrecedence(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.json")
	if err := WriteCredentials(creds, Credentials{URL: "http://127.0.0.1:7700", AdminToken: "file-token", PublicURL: "https://cp.example.internal:7700"}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(creds)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("credentials mode = %v, %v", st.Mode(), err)
	}

	base := map[string]string{EnvCredentials: creds}
	cases := []struct {
		name               string
		flagURL, flagToken string
		env                map[string]string
		wantURL, wantToken string
		wantErr            string
	}{
		{name: "file only", wantURL: "http://127.0.0.1:7700", wantToken: "file-token"},
		{name: "env url, same server as file", env: map[string]string{EnvURL: "http://localhost:7700/"}, wantURL: "http://localhost:7700/", wantToken: "file-token"},
		{name: "flag url is the public url", flagURL: "https://CP.example.internal:7700", wantURL: "https://CP.example.internal:7700", wantToken: "file-token"},
		{name: "other server gets no file token", flagURL: "http://10.0.0.9:7700", wantErr: "no admin token for http://10.0.0.9:7700"},
		{name: "env token wins", env: map[string]string{EnvAdminToken: "env-token"}, wantURL: "http://127.0.0.1:7700", wantToken: "env-token"},
		{name: "flag token wins", flagToken: "flag-token", env: map[string]string{EnvAdminToken: "env-token"}, wantURL: "http://127.0.0.1:7700", wantToken: "flag-token"},
		{name: "flag url wins, bare host:port", flagURL: "127.0.0.1:7700", env: map[string]string{EnvURL: "http://elsewhere:1"}, wantURL: "http://127.0.0.1:7700", wantToken: "file-token"},
		{name: "no file", env: map[string]string{EnvCredentials: filepath.Join(dir, "missing.json")}, wantErr: "no control plane configured"},
		{name: "no file but a url", env: map[string]string{EnvCredentials: filepath.Join(dir, "missing.json"), EnvURL: "http://x:1"}, wantErr: "no admin token for http://x:1"},
		{name: "url and token, no file needed", env: map[string]string{EnvCredentials: filepath.Join(dir, "missing.json"), EnvURL: "x:1", EnvAdminToken: "t"}, wantURL: "http://x:1", wantToken: "t"},
	}
	for _, c := range cases {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range c.env {
			env[k] = v
		}
		got, err := resolveTarget(c.flagURL, c.flagToken, "", envMap(env))
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: err = %v, want %q", c.name, err, c.wantErr)
			}
			continue
		}
		if err != nil || got.URL != c.wantURL || got.Token != c.wantToken {
			t.Errorf("%s: got %+v, %v; want %s %s", c.name, got, err, c.wantURL, c.wantToken)
		}
	}
}

func TestNoControlPlaneMessage(t *testing.T) {
	home := t.TempDir()
	_, err := resolveTarget("", "", "", envMap(map[string]string{"HOME": home}))
	if !errors.Is(err, errNoControlPlane) {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(err.Error(), "run `lakeshore serve` here, or set LAKESHORE_URL") {
		t.Fatalf("message = %q", err)
	}
}

func TestBrokenCredentialsFileIsNamed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(p, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := resolveTarget("", "", "", envMap(map[string]string{EnvCredentials: p}))
	if err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("err = %v", err)
	}
}

func TestCredentialsPath(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{EnvCredentials: "/x/c.json", "XDG_CONFIG_HOME": "/cfg", "HOME": "/h"}, "/x/c.json"},
		{map[string]string{"XDG_CONFIG_HOME": "/cfg", "HOME": "/h"}, "/cfg/lakeshore/credentials.json"},
		{map[string]string{"HOME": "/h"}, "/h/.config/lakeshore/credentials.json"},
	}
	for _, c := range cases {
		got, err := CredentialsPath(envMap(c.env))
		if err != nil || got != c.want {
			t.Errorf("CredentialsPath(%v) = %q, %v; want %q", c.env, got, err, c.want)
		}
	}
}

func TestWriteCredentialsCreatesPrivateDir(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a", "b", "credentials.json")
	want := Credentials{URL: "http://127.0.0.1:1", AdminToken: "tok"}
	if err := WriteCredentials(p, want); err != nil {
		t.Fatal(err)
	}
	if err := WriteCredentials(p, want); err != nil {
		t.Fatalf("overwrite: %v", err)
	}
	got, err := ReadCredentials(p)
	if err != nil || got != want {
		t.Fatalf("read back %+v, %v", got, err)
	}
	st, _ := os.Stat(filepath.Dir(p))
	if st.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v", st.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Fatalf("temp files left behind: %v", entries)
	}
}

func TestSameServer(t *testing.T) {
	same := [][2]string{
		{"http://127.0.0.1:7700", "http://localhost:7700/"},
		{"http://[::1]:7700", "127.0.0.1:7700"},
		{"https://CP.example:443", "https://cp.example"},
	}
	for _, p := range same {
		if !sameServer(p[0], p[1]) {
			t.Errorf("sameServer(%q, %q) = false", p[0], p[1])
		}
	}
	differ := [][2]string{
		{"http://127.0.0.1:7700", "http://127.0.0.1:7701"},
		{"http://cp:80", "https://cp:80"},
		{"http://a:1", ""},
		{"http://a:1", "http://b:1"},
	}
	for _, p := range differ {
		if sameServer(p[0], p[1]) {
			t.Errorf("sameServer(%q, %q) = true", p[0], p[1])
		}
	}
}

func TestJoinWatchValue(t *testing.T) {
	root := (&app{env: Env{Getenv: envMap(nil)}}).rootCmd()
	cases := [][2]string{
		{"daemon list --watch 5", "daemon list --watch=5"},
		{"daemon list --watch", "daemon list --watch"},
		{"daemon show gpu --watch 0.5 --json", "daemon show gpu --watch=0.5 --json"},
		{"daemon show --watch gpu", "daemon show --watch gpu"},
		{"daemon show gpu -- --watch 5", "daemon show gpu -- --watch 5"},
		// Not a watch verb: the remote command keeps its words.
		{"daemon exec d tail --watch 5", "daemon exec d tail --watch 5"},
	}
	for _, c := range cases {
		got := strings.Join(joinWatchValue(root, strings.Fields(c[0])), " ")
		if got != c[1] {
			t.Errorf("joinWatchValue(%q) = %q, want %q", c[0], got, c[1])
		}
	}
}
