package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/spf13/cobra"

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
