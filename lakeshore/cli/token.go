package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

func (a *app) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Mint, list and revoke daemon tokens",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRun,
	}
	cmd.AddCommand(a.tokenCreateCmd(), a.tokenListCmd(), a.tokenRevokeCmd())
	return cmd
}

func (a *app) tokenListCmd() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List minted tokens (never their secrets), oldest first",
		Long: `List every token minted with 'lakeshore token create': its id (what 'token
revoke' takes), kind (daemon or enroll), state (active, revoked, expired,
consumed), the worker a daemon token is bound to (WORKER: its worker id,
"fleet" for a fleet token, "-" before its first hello), label and times.
Secrets are never stored, so they are never shown. --json prints
{"tokens": [...]}, each with fleet and workerId.`,
		Example: `  lakeshore token list
  lakeshore token list --json | jq -r '.tokens[] | select(.state == "active") | .id'`,
		Args: noArgs,
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, _ []string) error {
			ts, err := c.ListTokens(ctx)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, operatorapi.TokenList{Tokens: ts})
			}
			if len(ts) == 0 {
				_, err := fmt.Fprintln(a.env.Stdout, "no tokens minted; see `lakeshore token create`")
				return err
			}
			now := a.env.Now()
			tw := newTable(a.env.Stdout)
			fmt.Fprintln(tw, "ID\tKIND\tSTATE\tWORKER\tLABEL\tCREATED\tEXPIRES")
			for _, t := range ts {
				expires := "-"
				if t.ExpiresAt != nil {
					expires = t.ExpiresAt.Local().Format(time.RFC3339)
				}
				worker := orDash(t.WorkerID)
				if t.Fleet {
					worker = "fleet"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Kind, t.State, worker, orDash(t.Label), ago(now, t.CreatedAt), expires)
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

func (a *app) tokenRevokeCmd() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "revoke <token-id>",
		Short: "Revoke a token: the next request made with it is refused",
		Long: `Revoke a daemon or enrollment token by its id (from 'token list', or the id
'token create --json' printed). The control plane checks the token on every
request, so a daemon using it is refused from its next poll on and cannot say
hello again with it; give it a new token to bring it back. Revoking a token
that is already revoked is not an error. --json prints the token as 'token
list --json' shows it.`,
		Example: `  lakeshore token revoke 01J9Z6S4K4X3T8W6Q1M2N3P4R5`,
		Args:    exactArgs(1, "one token id"),
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			t, err := c.RevokeToken(ctx, args[0])
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, t)
			}
			label := ""
			if t.Label != "" {
				label = " (" + t.Label + ")"
			}
			_, err = fmt.Fprintf(a.env.Stdout, "revoked %s token %s%s\n", t.Kind, t.ID, label)
			return err
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

func (a *app) tokenCreateCmd() *cobra.Command {
	var (
		enroll  bool
		fleet   bool
		ttl     string
		label   string
		jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Mint a daemon bearer token (or a one-shot enrollment token)",
		Long: `Mint a token for a daemon and print it on stdout, alone on one line, so it can
be captured by a script. The secret is shown this once.

By default the token is a daemon bearer token for one daemon: put it in the
file that nymph's [server] token_file names. The first hello made with it
binds it to that daemon's worker; from then on the control plane refuses it
for any other worker (another machine_id or label saying hello with it, a
poll or a result naming another worker), and refuses any other token for
that worker until this one is revoked or expires.

--fleet mints a token that is never bound, for many daemons to share (one
file baked into a machine image, say). Its holders can act for each other:
any of them may poll as, and post results for, any worker of the fleet, so
a host that leaks it leaks the whole fleet — unless daemon identity is on
([identity] enabled = true, with 'token create --enroll'), which gives each
daemon its own key and ties its requests to its own worker.

--enroll mints a one-shot enrollment token instead (dle_...): a daemon with
[identity] enabled presents it on its first hello together with its new
public key, and signs every request from then on. --ttl bounds its life
(30m, 12h, 7d). --json prints {token, id, kind, expiresAt, fleet}; the id
is what 'lakeshore token revoke' takes.`,
		Example: `  lakeshore token create > /etc/nymph/token
  lakeshore token create --fleet --label image-2025-06 > fleet-token
  lakeshore token create --enroll --ttl 1h
  lakeshore token create --label gpu-rig --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := operatorapi.TokenRequest{Kind: operatorapi.TokenDaemon, Label: label, Fleet: fleet}
			if enroll {
				if fleet {
					return &usageError{err: fmt.Errorf("--fleet and --enroll exclude each other: an enrollment token is one daemon's, once")}
				}
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
			if tr.Fleet {
				fmt.Fprintln(a.env.Stderr, "fleet token: every daemon holding it can act for the others (unless daemon identity is on)")
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.BoolVar(&enroll, "enroll", false, "mint a one-shot enrollment token for a daemon with an identity key")
	fs.BoolVar(&fleet, "fleet", false, "mint a daemon token several daemons share, never bound to one worker (its holders can act for each other unless daemon identity is on)")
	fs.StringVar(&ttl, "ttl", "", "lifetime of the token, e.g. 30m, 12h, 7d (default: the server's)")
	fs.StringVar(&label, "label", "", "a note stored with the token")
	fs.BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}
