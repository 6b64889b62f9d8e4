package servecli

import (
	"time"

	"github.com/spf13/cobra"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/controlplane"
)

// edgeOpts are the flags of `lakeshore serve` that bound what a client may
// hold of the server: deadlines for slow clients and the connection cap.
type edgeOpts struct {
	limits        controlplane.Limits
	maxConnsPerIP int
}

func (o *edgeOpts) addFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	d := controlplane.DefaultLimits()
	fs.DurationVar(&o.limits.HeaderTimeout, "header-timeout", d.HeaderTimeout, "time a client has to send its request headers and finish a TLS handshake")
	fs.DurationVar(&o.limits.IdleTimeout, "idle-timeout", d.IdleTimeout, "time a kept-alive connection may wait for its next request")
	fs.DurationVar(&o.limits.BodyGrace, "body-grace", d.BodyGrace, "time a request body may take before --body-min-rate applies")
	fs.Int64Var(&o.limits.BodyMinRate, "body-min-rate", d.BodyMinRate, "bytes per second a request body must average after --body-grace")
	fs.DurationVar(&o.limits.BodyTimeout, "body-timeout", d.BodyTimeout, "the most one request body may take, however fast it comes")
	fs.DurationVar(&o.limits.UploadTimeout, "upload-timeout", d.UploadTimeout, "--body-timeout for release publish and payload uploads")
	fs.DurationVar(&o.limits.WriteTimeout, "write-timeout", d.WriteTimeout, "time one write of an answer may wait for the client to read it; a long answer that keeps being read is not cut")
	fs.IntVar(&o.maxConnsPerIP, "max-conns-per-ip", controlplane.DefaultMaxConnsPerIP,
		"connections open at once from one remote address, over which new ones are closed at once (0: no cap); daemons behind one NAT share an address and hold about two each, so raise it for bigger fleets behind one")
}

// apply checks the flags and sets them on cfg.
func (o *edgeOpts) apply(cfg *controlplane.Config) error {
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"--header-timeout", o.limits.HeaderTimeout},
		{"--idle-timeout", o.limits.IdleTimeout},
		{"--body-grace", o.limits.BodyGrace},
		{"--body-timeout", o.limits.BodyTimeout},
		{"--upload-timeout", o.limits.UploadTimeout},
		{"--write-timeout", o.limits.WriteTimeout},
	} {
		if f.v <= 0 {
			return cli.Usagef("%s %v: must be a positive duration, such as 30s", f.name, f.v)
		}
	}
	if o.limits.BodyMinRate <= 0 {
		return cli.Usagef("--body-min-rate %d: must be a positive number of bytes per second", o.limits.BodyMinRate)
	}
	if o.maxConnsPerIP < 0 {
		return cli.Usagef("--max-conns-per-ip %d: must be 0 (no cap) or more", o.maxConnsPerIP)
	}
	cfg.Limits, cfg.MaxConnsPerIP = o.limits, o.maxConnsPerIP
	return nil
}
