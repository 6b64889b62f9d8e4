package cli_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nymph/identity"
	"nymph/lakeshore/cli"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/harness"
)

// TestServeTLSAndKeyVerbs runs `lakeshore serve` over HTTPS with signatures
// required, enrolls a hand-driven daemon with a token from `token create
// --enroll`, and drives show, rotate-key and revoke-key through --ca-file.
func TestServeTLSAndKeyVerbs(t *testing.T) {
	dir := t.TempDir()
	ca := harness.NewCA(t)
	certFile, keyFile, _ := ca.Issue(t)
	creds := filepath.Join(dir, "credentials.json")
	env := map[string]string{
		cli.EnvCredentials:       creds,
		cli.EnvDaemonToken:       "shared-daemon-token",
		cli.EnvRequireSignatures: "1",
		cli.EnvCAFile:            ca.CertFile,
		"HOME":                   dir,
	}
	_, stop := startServe(t, env, "--data", filepath.Join(dir, "data"), "--log-format", "json", "--tls-cert", certFile, "--tls-key", keyFile)
	c, err := cli.ReadCredentials(creds)
	if err != nil || !strings.HasPrefix(c.URL, "https://127.0.0.1:") {
		t.Fatalf("credentials %+v %v", c, err)
	}

	// The CA file is what makes the HTTPS server trusted.
	noCA := maps.Clone(env)
	delete(noCA, cli.EnvCAFile)
	if r := runCLI(t, runOpts{}, noCA, "daemon", "list"); r.code == 0 || !strings.Contains(r.stderr, "certificate") {
		t.Fatalf("list without the CA: %+v", r)
	}
	if r := runCLI(t, runOpts{}, noCA, "daemon", "list", "--ca-file", ca.CertFile); r.code != 0 {
		t.Fatalf("list with --ca-file: %+v", r)
	}
	if r := runCLI(t, runOpts{}, noCA, "daemon", "list", "--ca-file", filepath.Join(dir, "nope.pem")); r.code != cli.ExitUsage {
		t.Fatalf("list with a missing CA file: %+v", r)
	}

	r := runCLI(t, runOpts{}, env, "token", "create", "--enroll", "--ttl", "1h", "--json")
	var tok operatorapi.TokenResponse
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &tok) != nil || !strings.HasPrefix(tok.Token, "dle_") || tok.ExpiresAt == nil ||
		tok.ExpiresAt.Sub(time.Now()) < 59*time.Minute || tok.ExpiresAt.Sub(time.Now()) > time.Hour+time.Minute {
		t.Fatalf("token create --enroll --ttl 1h: %+v", r)
	}

	d := &signedDaemon{t: t, url: c.URL, client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}, key: newIdentityKey(t)}
	// Signatures are required: the bearer alone is turned away.
	if hr := d.hello("shared-daemon-token", false); hr.Reject == nil || hr.Reject.Code != messages.RejectEnrollmentSignatureRequired {
		t.Fatalf("bearer-only hello: %+v", hr.Reject)
	}
	hr := d.hello(tok.Token, true)
	if hr.Reject != nil || hr.KeyID == nil || *hr.KeyID != d.key.ID() {
		t.Fatalf("enrollment: %+v", hr.Reject)
	}
	d.worker = *hr.WorkerID
	if st := d.poll(); st != http.StatusOK {
		t.Fatalf("signed poll: %d", st)
	}

	r = runCLI(t, runOpts{}, env, "daemon", "show", "keyed")
	if r.code != 0 || !strings.Contains(r.stdout, d.key.ID()) || !strings.Contains(r.stdout, "KEY ID") {
		t.Fatalf("show: %+v", r)
	}
	r = runCLI(t, runOpts{}, env, "daemon", "rotate-key", "keyed", "--json")
	var q operatorapi.Queued
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &q) != nil || q.Kind != messages.KindRotateKey || q.WorkerID != d.worker {
		t.Fatalf("rotate-key: %+v", r)
	}
	r = runCLI(t, runOpts{}, env, "daemon", "revoke-key", "keyed", "--key-id", "k_unknown")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "HTTP 404") {
		t.Fatalf("revoke-key of an unknown key: %+v", r)
	}
	r = runCLI(t, runOpts{}, env, "daemon", "revoke-key", "keyed")
	if r.code != 0 || !strings.Contains(r.stdout, "revoked key "+d.key.ID()) {
		t.Fatalf("revoke-key: %+v", r)
	}
	if st := d.poll(); st != http.StatusUnauthorized {
		t.Fatalf("poll after revoke-key: %d", st)
	}
	r = runCLI(t, runOpts{}, env, "daemon", "show", "keyed", "--json")
	var w operatorapi.Worker
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &w) != nil || len(w.Keys) != 1 || w.Keys[0].RevokedAt == nil {
		t.Fatalf("show --json after revoke: %+v", r)
	}

	stop()
}

// startServe runs `lakeshore serve --addr 127.0.0.1:0 args...` with env and
// returns once it printed the admin token it generated, with what it
// printed and a stop that cancels it and fails the test unless it exits 0.
func startServe(t *testing.T, env map[string]string, args ...string) (out *lineSignal, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ready := &lineSignal{needle: "generated admin token", ch: make(chan struct{})}
	served := make(chan result, 1)
	go func() {
		served <- runCLI(t, runOpts{ctx: ctx, stdout: ready}, env, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...)
	}()
	select {
	case <-ready.ch:
	case r := <-served:
		t.Fatalf("serve exited early: %+v", r)
	case <-time.After(30 * time.Second):
		t.Fatal("serve printed no admin token")
	}
	return ready, func() {
		t.Helper()
		cancel()
		select {
		case r := <-served:
			if r.code != 0 {
				t.Fatalf("serve stopped with %+v", r)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not stop on cancel")
		}
	}
}

func TestServeRefusesHalfATLSPairAndABadSignatureSetting(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		env  map[string]string
		args []string
	}{
		{nil, []string{"--tls-cert", filepath.Join(dir, "cp.pem")}},
		{map[string]string{cli.EnvRequireSignatures: "sometimes"}, nil},
	} {
		env := map[string]string{cli.EnvCredentials: filepath.Join(dir, "c.json"), "HOME": dir}
		for k, v := range tc.env {
			env[k] = v
		}
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data", filepath.Join(dir, "data")}, tc.args...)
		if r := runCLI(t, runOpts{}, env, args...); r.code != cli.ExitUsage {
			t.Fatalf("%v %v: %+v", tc.env, tc.args, r)
		}
	}
}

func newIdentityKey(t *testing.T) *identity.Key {
	t.Helper()
	k, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// signedDaemon is a daemon with an identity key, driven by hand.
type signedDaemon struct {
	t      *testing.T
	url    string
	client *http.Client
	key    *identity.Key
	worker string
}

func (d *signedDaemon) post(path, bearer string, sign bool, body any) *http.Response {
	d.t.Helper()
	req, b := daemonRequest(d.t, d.url+path, bearer, body)
	if sign {
		if err := d.key.SignRequest(req, b, time.Now()); err != nil {
			d.t.Fatal(err)
		}
	}
	resp, err := d.client.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	return resp
}

func (d *signedDaemon) hello(bearer string, sign bool) messages.HelloResponse {
	d.t.Helper()
	v, proto := "0.0.0-test", messages.ProtocolVersion
	req := messages.HelloRequest{MachineID: "host-keyed", Label: "keyed", Tags: []string{},
		Capabilities: messages.Capabilities{Runners: []string{"process"}}, Versions: messages.Versions{Daemon: &v, Protocol: &proto}}
	if sign {
		req.PublicKey = d.key.PublicKeyB64()
	}
	resp := d.post("/v1/daemon/hello", bearer, sign, req)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var hr messages.HelloResponse
	if resp.StatusCode != http.StatusOK || messages.Unmarshal(raw, &hr) != nil {
		d.t.Fatalf("hello: %d %q", resp.StatusCode, raw)
	}
	return hr
}

func (d *signedDaemon) poll() int {
	d.t.Helper()
	resp := d.post("/v1/daemon/poll", "", true, messages.PollRequest{WorkerID: d.worker})
	resp.Body.Close()
	return resp.StatusCode
}

// A throttle setting that is not a rate is a usage error naming the flag,
// before anything starts.
func TestServeRefusesABadDaemonKeyRate(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{cli.EnvCredentials: filepath.Join(dir, "c.json"), "HOME": dir}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--daemon-key-rate", "-1"}, "--daemon-key-rate -1: want requests a second, 0 for no limit"},
		{[]string{"--daemon-key-rate", "NaN"}, `--daemon-key-rate "NaN": want a number`},
		{[]string{"--daemon-key-rate", "lots"}, `--daemon-key-rate "lots": want a number, e.g. --daemon-key-rate `},
		{[]string{"--daemon-key-burst", "0"}, "--daemon-key-burst 0: want at least 1"},
	} {
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data", filepath.Join(dir, "data")}, tc.args...)
		r := runCLI(t, runOpts{}, env, args...)
		if r.code != cli.ExitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Fatalf("%v: exit %d, stderr %q does not say %q", tc.args, r.code, r.stderr, tc.want)
		}
		if _, err := os.Stat(filepath.Join(dir, "data", "lakeshore.db")); err == nil {
			t.Fatalf("%v: a store was opened before the refusal", tc.args)
		}
	}
}
