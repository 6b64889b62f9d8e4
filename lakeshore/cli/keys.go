package cli

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"nymph/lakeshore/controlplane"
	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

// Environment variables of daemon identity and TLS.
const (
	// EnvCAFile names a PEM file of CA certificates the CLI trusts besides
	// the system's, for a control plane whose certificate a private CA signed.
	EnvCAFile = "LAKESHORE_CA_FILE"
	// EnvRequireSignatures=1 makes serve refuse unsigned daemon requests.
	EnvRequireSignatures = "LAKESHORE_REQUIRE_DAEMON_SIGNATURES"
	EnvTLSCert           = "LAKESHORE_TLS_CERT"
	EnvTLSKey            = "LAKESHORE_TLS_KEY"
)

// httpClient is the operator API's HTTP client: nil (the default) unless
// --ca-file or $LAKESHORE_CA_FILE names a CA to trust.
func (a *app) httpClient() (*http.Client, error) {
	caFile := a.caFile
	if caFile == "" {
		caFile = a.env.Getenv(EnvCAFile)
	}
	if caFile == "" {
		return nil, nil
	}
	hc, err := opclient.HTTPClientWithCA(caFile)
	if err != nil {
		return nil, &usageError{err: fmt.Errorf("--ca-file: %w", err)}
	}
	return hc, nil
}

// identityOpts are serve's TLS and daemon-identity settings.
type identityOpts struct {
	tlsCert, tlsKey   string
	requireSignatures bool
	keyMaxAge         time.Duration
	// keyRate and keyBurst throttle each daemon key; rate 0 turns it off.
	keyRate  float64
	keyBurst int
}

func (o *identityOpts) addFlags(cmd *cobra.Command, getenv func(string) string) {
	fs := cmd.Flags()
	fs.StringVar(&o.tlsCert, "tls-cert", getenv(EnvTLSCert), "serve HTTPS with this PEM certificate (chain) file; needs --tls-key (env "+EnvTLSCert+")")
	fs.StringVar(&o.tlsKey, "tls-key", getenv(EnvTLSKey), "PEM private key of --tls-cert (env "+EnvTLSKey+")")
	fs.BoolVar(&o.requireSignatures, "require-daemon-signatures", false,
		"refuse daemons that do not sign their requests (env "+EnvRequireSignatures+"=1)")
	fs.DurationVar(&o.keyMaxAge, "key-rotation-max-age", 0, "ask daemons to rotate keys older than this, e.g. 720h (default: never)")
	floatVar(fs, &o.keyRate, "daemon-key-rate", controlplane.DefaultKeyRequestRate,
		"signed requests a second one daemon key may sustain before it is answered 429 (0: no limit)")
	fs.IntVar(&o.keyBurst, "daemon-key-burst", controlplane.DefaultKeyRequestBurst,
		"signed requests one daemon key may send at once on top of --daemon-key-rate")
}

// resolve folds the environment into the flags and checks them.
func (o *identityOpts) resolve(getenv func(string) string) error {
	if v := strings.TrimSpace(getenv(EnvRequireSignatures)); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return &usageError{err: fmt.Errorf("%s=%q: want 1 or 0", EnvRequireSignatures, v)}
		}
		o.requireSignatures = o.requireSignatures || on
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return usagef("--tls-cert and --tls-key go together")
	}
	if o.keyMaxAge < 0 {
		return usagef("--key-rotation-max-age %s: want a positive duration", o.keyMaxAge)
	}
	if o.keyRate < 0 || math.IsNaN(o.keyRate) || math.IsInf(o.keyRate, 0) {
		return usagef("--daemon-key-rate %v: want requests a second, 0 for no limit", o.keyRate)
	}
	if o.keyBurst < 1 {
		return usagef("--daemon-key-burst %d: want at least 1", o.keyBurst)
	}
	return nil
}

// apply copies the settings into the control plane's configuration.
func (o identityOpts) apply(cfg *controlplane.Config) {
	cfg.TLSCertFile, cfg.TLSKeyFile = o.tlsCert, o.tlsKey
	cfg.RequireSignatures = o.requireSignatures
	cfg.KeyRotationMaxAge = o.keyMaxAge
	cfg.KeyRequestRate, cfg.KeyRequestBurst = o.keyRate, o.keyBurst
	if o.keyRate == 0 {
		cfg.KeyRequestRate = -1 // no limit
	}
}

// url gives a URL derived from the listener the scheme serve speaks.
func (o identityOpts) url(u string) string {
	if o.tlsCert != "" {
		if rest, ok := strings.CutPrefix(u, "http://"); ok {
			return "https://" + rest
		}
	}
	return u
}

func (a *app) daemonRotateKeyCmd() *cobra.Command {
	return a.queueVerb(onDaemon[operatorapi.Queued]{
		use:   "rotate-key <daemon>",
		short: "Ask a daemon to replace its identity key",
		long: `Queue a rotate_key command. The daemon makes a new Ed25519 keypair, registers it
with the control plane in a request signed by its current key, and switches to
it only once the control plane has accepted it; from then on the old key is
refused. A daemon without an enrolled key ([identity] disabled) is a 409.
--json prints {commandId, workerId, kind}.`,
		example: `  lakeshore daemon rotate-key gpu-rig
  lakeshore daemon rotate-key 5f0c1e2d3b4a59687a6b5c4d --id --json`,
	}, (*opclient.Client).RotateKey, "queued rotate_key on %s (command %s); 'lakeshore daemon show' lists its keys\n")
}

func (a *app) daemonRevokeKeyCmd() *cobra.Command {
	var keyID string
	return daemonVerb(a, onDaemon[operatorapi.RevokeKeyResponse]{
		use:   "revoke-key <daemon> [--key-id K]",
		short: "Revoke a daemon's identity key at once",
		long: `Revoke a daemon's current key, or the one --key-id names. Every request signed
by it is refused from that moment; a long-poll already waiting ends normally
and the next one is refused. To bring the daemon back, delete its key file so
it makes a new key, and give it a fresh token from
'lakeshore token create --enroll': a revoked key is never accepted again.
--json prints {workerId, key: {keyId, createdAt, revokedAt}}.`,
		example: `  lakeshore daemon revoke-key gpu-rig
  lakeshore daemon revoke-key gpu-rig --key-id k_If4x36FUomFia_hUBG_SJw`,
		flags: func(cmd *cobra.Command) {
			cmd.Flags().StringVar(&keyID, "key-id", "", "the key to revoke (default: the daemon's current key)")
		},
		call: func(ctx context.Context, c *opclient.Client, w operatorapi.Worker) (operatorapi.RevokeKeyResponse, error) {
			return c.RevokeKey(ctx, w.ID, keyID)
		},
		text: func(out io.Writer, w operatorapi.Worker, rv operatorapi.RevokeKeyResponse) error {
			_, err := fmt.Fprintf(out, "revoked key %s of %s\n", rv.Key.KeyID, describe(w))
			return err
		},
	})
}
