package servecli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/controlplane"
)

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
	fs.StringVar(&o.tlsCert, "tls-cert", getenv(cli.EnvTLSCert), "serve HTTPS with this PEM certificate (chain) file; needs --tls-key (env "+cli.EnvTLSCert+")")
	fs.StringVar(&o.tlsKey, "tls-key", getenv(cli.EnvTLSKey), "PEM private key of --tls-cert (env "+cli.EnvTLSKey+")")
	fs.BoolVar(&o.requireSignatures, "require-daemon-signatures", false,
		"refuse daemons that do not sign their requests (env "+cli.EnvRequireSignatures+"=1)")
	fs.DurationVar(&o.keyMaxAge, "key-rotation-max-age", 0, "ask daemons to rotate keys older than this, e.g. 720h (default: never)")
	cli.FloatVar(fs, &o.keyRate, "daemon-key-rate", controlplane.DefaultKeyRequestRate,
		"signed requests a second one daemon key may sustain before it is answered 429 (0: no limit)")
	fs.IntVar(&o.keyBurst, "daemon-key-burst", controlplane.DefaultKeyRequestBurst,
		"signed requests one daemon key may send at once on top of --daemon-key-rate")
}

// resolve folds the environment into the flags and checks them.
func (o *identityOpts) resolve(getenv func(string) string) error {
	if v := strings.TrimSpace(getenv(cli.EnvRequireSignatures)); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return cli.UsageError(fmt.Errorf("%s=%q: want 1 or 0", cli.EnvRequireSignatures, v))
		}
		o.requireSignatures = o.requireSignatures || on
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return cli.Usagef("--tls-cert and --tls-key go together")
	}
	if o.keyMaxAge < 0 {
		return cli.Usagef("--key-rotation-max-age %s: want a positive duration", o.keyMaxAge)
	}
	if o.keyRate < 0 || math.IsNaN(o.keyRate) || math.IsInf(o.keyRate, 0) {
		return cli.Usagef("--daemon-key-rate %v: want requests a second, 0 for no limit", o.keyRate)
	}
	if o.keyBurst < 1 {
		return cli.Usagef("--daemon-key-burst %d: want at least 1", o.keyBurst)
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
