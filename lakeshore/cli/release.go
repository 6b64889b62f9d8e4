package cli

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

func (a *app) releaseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "release",
		Aliases: []string{"releases"},
		Short:   "Publish, list and delete the nymph binaries the control plane serves for updates",
		Long: `The control plane keeps nymph binaries in its data directory (releases/) and
serves each one, without a token, at /v1/releases/<version>/<triple> with a
sha256sum sidecar at the same path plus .sha256. 'lakeshore daemon update'
points daemons there.`,
		Example: `  lakeshore release publish ./nymph --version 0.1.10
  lakeshore release list
  lakeshore release delete 0.1.9`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRun,
	}
	cmd.AddCommand(a.releasePublishCmd(), a.releaseListCmd(), a.releaseDeleteCmd())
	return cmd
}

func (a *app) releaseDeleteCmd() *cobra.Command {
	var (
		triple  string
		jsonOut bool
	)
	cmd := &cobra.Command{
		Use:     "delete <version>",
		Aliases: []string{"rm"},
		Short:   "Delete a published release (every triple of the version, or one)",
		Long: `Delete the binaries published for a version: every triple of it, or only
--triple. The control plane refuses to delete a version that a namespace
targets (see 'lakeshore daemon target-version'), since its daemons would be
sent to a binary that is gone. --json prints {"releases": [...]} with what was
deleted.`,
		Example: `  lakeshore release delete 0.1.9
  lakeshore release delete 0.2.0-rc.1 --triple aarch64-unknown-linux-gnu`,
		Args: exactArgs(1, "one version"),
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			version := args[0]
			triples := []string{triple}
			if triple == "" {
				all, err := c.ListReleases(ctx)
				if err != nil {
					return err
				}
				triples = triples[:0]
				for _, r := range all {
					if r.Version == version {
						triples = append(triples, r.Triple)
					}
				}
				if len(triples) == 0 {
					return fmt.Errorf("no release %s is published; see `lakeshore release list`", version)
				}
			}
			deleted := []operatorapi.Release{}
			for _, tr := range triples {
				rel, err := c.DeleteRelease(ctx, version, tr)
				if err != nil {
					return err
				}
				deleted = append(deleted, rel)
				if !jsonOut {
					fmt.Fprintf(a.env.Stdout, "deleted %s for %s\n", rel.Version, rel.Triple)
				}
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, operatorapi.ReleaseList{Releases: deleted})
			}
			return nil
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&triple, "triple", "", "delete only the binary for this target triple")
	fs.BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

func (a *app) releasePublishCmd() *cobra.Command {
	var (
		version, triple string
		jsonOut         bool
	)
	cmd := &cobra.Command{
		Use:   "publish PATH --version V [--triple T]",
		Short: "Upload a nymph binary as a release",
		Long: `Upload the nymph binary at PATH as release --version for --triple. Without
--triple the control plane reads it from the binary's ELF header (an
x86_64 build is x86_64-unknown-linux-gnu, arm64 aarch64-unknown-linux-gnu).
Publishing the same version and triple again replaces the binary.

--version should be what the binary reports (nymph version), so a daemon that
updates to it says hello with that version afterwards.

--json prints {version, triple, sha256, size, publishedAt, url, sidecarUrl}.`,
		Example: `  lakeshore release publish ./bin/nymph --version 0.1.10
  lakeshore release publish ./nymph-arm64 --version 0.1.10 --triple aarch64-unknown-linux-gnu --json`,
		Args: exactArgs(1, "one PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if version == "" {
				return usagef("--version is required")
			}
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return err
			}
			if !st.Mode().IsRegular() {
				return fmt.Errorf("%s is not a regular file", args[0])
			}
			if st.Size() == 0 {
				return fmt.Errorf("%s is empty", args[0])
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			p := startProgress(a.env.Stderr, a.env.StderrTTY, fmt.Sprintf("uploading %s (%s)", args[0], byteSize(st.Size())))
			rel, err := c.PublishRelease(cmd.Context(), f, st.Size(), version, triple)
			p.Stop()
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, rel)
			}
			_, err = fmt.Fprintf(a.env.Stdout, "published nymph %s for %s (%s, sha256 %s)\n  %s\n",
				rel.Version, rel.Triple, byteSize(rel.Size), rel.SHA256, rel.URL)
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&version, "version", "", "the version the binary reports (required)")
	fs.StringVar(&triple, "triple", "", "target triple (default: read from the binary)")
	fs.BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

func (a *app) releaseListCmd() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List published releases, oldest version first",
		Long: `List every published nymph binary: version, triple, size, sha256 and when it
was published. --json prints {"releases": [...]} with each download URL.`,
		Example: `  lakeshore release list
  lakeshore release list --json | jq -r '.releases[-1].version'`,
		Args: noArgs,
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, _ []string) error {
			rels, err := c.ListReleases(ctx)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, operatorapi.ReleaseList{Releases: rels})
			}
			if len(rels) == 0 {
				_, err := fmt.Fprintln(a.env.Stdout, "no releases published; see `lakeshore release publish`")
				return err
			}
			now := a.env.Now()
			tw := newTable(a.env.Stdout)
			fmt.Fprintln(tw, "VERSION\tTRIPLE\tSIZE\tSHA256\tPUBLISHED")
			for _, r := range rels {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Version, r.Triple, byteSize(r.Size), r.SHA256, ago(now, r.PublishedAt))
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

// byteSize renders a size the way ls -h does, to one decimal.
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
