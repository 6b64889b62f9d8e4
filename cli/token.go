package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"nymph/operatorapi"
)

func (a *app) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Mint daemon tokens",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRun,
	}
	cmd.AddCommand(a.tokenCreateCmd())
	return cmd
}

func (a *app) tokenCreateCmd() *cobra.Command {
	var (
		enroll  bool
		ttl     string
		label   string
		jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Mint a daemon bearer token (or a one-shot enrollment token)",
		Long: `Mint a token for a daemon and print it on stdout, alone on one line, so it can
be captured by a script. The secret is shown this once.

By default the token is a daemon bearer token: put it in the file that nymph's
[server] token_file names. --enroll mints a one-shot enrollment token instead
(dle_...): a daemon with [identity] enabled presents it on its first hello
together with its new public key, and signs every request from then on.
--ttl bounds its life (30m, 12h, 7d). --json prints {token, kind, expiresAt}.`,
		Example: `  lakeshore token create > /etc/nymph/token
  lakeshore token create --enroll --ttl 1h
  lakeshore token create --label gpu-rig --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := operatorapi.TokenRequest{Kind: operatorapi.TokenDaemon, Label: label}
			if enroll {
				req.Kind = operatorapi.TokenEnroll
			}
			if ttl != "" {
				secs, err := ParseTTL(ttl)
				if err != nil {
					return &usageError{err: err}
				}
				req.TTLS = secs
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			tr, err := c.CreateToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, tr)
			}
			if _, err := fmt.Fprintln(a.env.Stdout, tr.Token); err != nil {
				return err
			}
			if tr.ExpiresAt != nil {
				fmt.Fprintf(a.env.Stderr, "%s token; expires %s\n", tr.Kind, tr.ExpiresAt.Local().Format(time.RFC3339))
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.BoolVar(&enroll, "enroll", false, "mint a one-shot enrollment token for a daemon with an identity key")
	fs.StringVar(&ttl, "ttl", "", "lifetime of the token, e.g. 30m, 12h, 7d (default: the server's)")
	fs.StringVar(&label, "label", "", "a note stored with the token")
	fs.BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}
