// Package servecli owns the verbs that run the control plane itself:
// `lakeshore serve` and `lakeshore blobs migrate`. They link the stores
// (SQLite, PostgreSQL), the blob stores' SDKs, the dashboard and the
// metrics, which the operator's verbs never need, so they live apart from
// package cli: only lakeshore-server links them (cmd/lakeshore-server),
// and the operator CLI (cmd/lakeshore), which stays small and quick to
// start, hands these verbs to it.
package servecli

import (
	"github.com/spf13/cobra"

	"nymph/lakeshore/cli"
)

// app is one run's view of the CLI around these verbs.
type app struct {
	host cli.Host
	env  cli.Env
}

// Verbs builds serve and blobs for h's run; it is lakeshore-server's
// cli.Env.ServerVerbs.
func Verbs(h cli.Host) []*cobra.Command {
	a := &app{host: h, env: h.Env()}
	return []*cobra.Command{a.serveCmd(), a.blobsCmd()}
}
