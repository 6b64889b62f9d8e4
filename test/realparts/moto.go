package realparts

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// motoVersionGlob finds moto_server where it lives on these machines: a
// Python package installed under one pyenv Python, whose script names that
// Python in its #! line. It is tried first because pyenv's directories are
// not on a non-login shell's PATH (CI's among them) and a shim runs
// whichever Python pyenv selects, which may lack moto.
const motoVersionGlob = "/root/.pyenv/versions/*/bin/moto_server"

// motoPaths are tried after motoVersionGlob: a moto on PATH, then the shim.
var motoPaths = []string{"moto_server", "/root/.pyenv/shims/moto_server"}

// Moto is a private moto_server (an emulator of the AWS APIs, EC2 among
// them) on 127.0.0.1. It accepts any credentials; Env gives the fixed
// test ones. Its EC2 launches any AMI it lists, e.g. MotoImageID.
type Moto struct {
	// URL is the base endpoint, http://127.0.0.1:PORT.
	URL  string
	Port int
	// Region is the region the tests use (moto serves them all).
	Region string
	// Env is the environment that gives an AWS SDK the test credentials
	// (test/test) and nothing else: shared config and credentials files
	// point at empty files in Dir and the instance metadata service is
	// off, so a developer's own AWS setup never leaks into a test.
	Env []string
	// Dir holds the empty AWS files and moto.log.
	Dir string
}

// MotoImageID is an AMI that moto's EC2 lists in every region.
const MotoImageID = "ami-12c6146b"

// MotoOption changes how StartMoto runs the server.
type MotoOption func(*motoOptions)

type motoOptions struct {
	authenticate bool
}

// MotoAuthenticate makes the server check credentials the way AWS does:
// every request signed with a key that moto's IAM does not hold (Env's
// test/test among them) is refused with AuthFailure. It is how a test
// sees wrong credentials refused.
func MotoAuthenticate() MotoOption {
	return func(o *motoOptions) { o.authenticate = true }
}

// StartMoto starts a private moto_server and returns once it answers HTTP.
func StartMoto(t testing.TB, opts ...MotoOption) *Moto {
	t.Helper()
	var o motoOptions
	for _, opt := range opts {
		opt(&o)
	}
	bin := findMoto(t)
	dir := privateDir(t, "moto")
	m := &Moto{Region: "us-east-1", Dir: dir}
	emptyConfig := filepath.Join(dir, "aws-config")
	emptyCreds := filepath.Join(dir, "aws-credentials")
	mustWrite(t, emptyConfig, "", 0o600)
	mustWrite(t, emptyCreds, "", 0o600)
	m.Env = []string{
		"AWS_ACCESS_KEY_ID=test",
		"AWS_SECRET_ACCESS_KEY=test",
		"AWS_SESSION_TOKEN=",
		"AWS_PROFILE=",
		"AWS_DEFAULT_PROFILE=",
		"AWS_REGION=" + m.Region,
		"AWS_CONFIG_FILE=" + emptyConfig,
		"AWS_SHARED_CREDENTIALS_FILE=" + emptyCreds,
		"AWS_EC2_METADATA_DISABLED=true",
	}

	fam := newFamily(t)
	client := &http.Client{Timeout: 2 * time.Second}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("realparts: %v", err)
		}
		m.Port = port
		m.URL = "http://127.0.0.1:" + strconv.Itoa(port)
		cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", strconv.Itoa(port))
		// The server takes no AWS settings: boto inside it fails every
		// request on an empty AWS_PROFILE, and a developer's own would
		// not belong in it either.
		cmd.Env = withoutAWS(fam.env())
		if o.authenticate {
			// moto lets this many requests through unchecked; none.
			cmd.Env = append(cmd.Env, "INITIAL_NO_AUTH_ACTION_COUNT=0")
		}
		c, err := fam.start("moto_server", cmd, filepath.Join(dir, "moto.log"))
		if err != nil {
			t.Fatalf("realparts: %v", err)
		}
		// Python imports take a second or two; any HTTP answer, whatever
		// its status, means the server is serving.
		lastErr = poll(60*time.Second, 20*time.Millisecond, []*child{c}, func() error {
			resp, err := client.Get(m.URL + "/")
			if err != nil {
				return fmt.Errorf("%w: %v", errNotYet, err)
			}
			resp.Body.Close()
			return nil
		})
		if lastErr == nil {
			return m
		}
		// Most likely the port was taken between freePort and bind.
		fam.kill()
	}
	t.Fatalf("realparts: moto_server did not start: %v", lastErr)
	return nil
}

// Setenv puts Env into the test's process environment (t.Setenv, so the
// test may not be parallel), for code that reads the AWS credential chain
// of its own process as the control plane does.
func (m *Moto) Setenv(t testing.TB) {
	t.Helper()
	for _, kv := range m.Env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// withoutAWS drops every AWS_ variable from env.
func withoutAWS(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "AWS_") {
			out = append(out, kv)
		}
	}
	return out
}

// findMoto resolves moto_server in a pyenv Python, on PATH or through the
// pyenv shim; a missing one skips the test, or fails it when CI=true.
func findMoto(t testing.TB) string {
	t.Helper()
	matches, _ := filepath.Glob(motoVersionGlob)
	for _, p := range matches {
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p
		}
	}
	for _, name := range motoPaths {
		if p, err := lookTool(name); err == nil {
			return p
		}
	}
	Unavailable(t, "moto_server not found on PATH, as %s or as %s (it is the Python package moto[server])", motoPaths[1], motoVersionGlob)
	return ""
}

// CreateBucket makes an empty S3 bucket, for a test that needs one of its
// own. It is a plain unsigned PUT: moto takes one unless it authenticates.
func (m *Moto) CreateBucket(t testing.TB, name string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, m.URL+"/"+name, nil)
	if err != nil {
		t.Fatalf("realparts: %v", err)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("realparts: create bucket %s: %v", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		t.Fatalf("realparts: create bucket %s: %s: %s", name, resp.Status, b)
	}
}
