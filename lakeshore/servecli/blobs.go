package servecli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"nymph/lakeshore/blobs"
	"nymph/lakeshore/cli"
	"nymph/lakeshore/releases"
)

// Where the control plane keeps each kind of blob, in a data directory and
// in a bucket alike.
const (
	payloadsPrefix = "payloads/"
	releasesDir    = "releases"
)

func (a *app) blobsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "blobs",
		Short: "Move the control plane's payloads and releases between blob stores",
		Long: `The control plane keeps invocation payloads and published releases in a blob
store: its data directory (the default, for one control plane) or an
S3-compatible bucket ('lakeshore serve --blobs s3://bucket/prefix', which
replicas behind a load balancer share). 'lakeshore blobs migrate' copies a
data directory's blobs into a bucket before the switch.`,
		Example: `  lakeshore blobs migrate --from local:/var/lib/lakeshore --to s3://lakeshore-blobs/prod`,
		Args:    cobra.ArbitraryArgs,
		RunE:    cli.GroupRun,
	}
	cmd.AddCommand(a.blobsMigrateCmd())
	return cmd
}

type migrateOptions struct {
	from, to, endpoint, region string
	dryRun, jsonOut            bool
}

// migrateCount is what happened to one kind of blob. With --dry-run,
// Copied is what would be copied.
type migrateCount struct {
	Copied  int   `json:"copied"`
	Skipped int   `json:"skipped"`
	Failed  int   `json:"failed"`
	Bytes   int64 `json:"bytes"`
}

type migrateFailure struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

type migrateSummary struct {
	From     string           `json:"from"`
	To       string           `json:"to"`
	DryRun   bool             `json:"dryRun"`
	Payloads migrateCount     `json:"payloads"`
	Releases migrateCount     `json:"releases"`
	Failures []migrateFailure `json:"failures"`
}

func (a *app) blobsMigrateCmd() *cobra.Command {
	var o migrateOptions
	cmd := &cobra.Command{
		Use:   "migrate --from local:DIR --to s3://BUCKET/PREFIX",
		Short: "Copy a data directory's payloads and releases into an S3 bucket, checking every sha256",
		Long: `Copy every payload and every release of a control plane's data directory
(DIR, what 'lakeshore serve --data' names) into an S3-compatible bucket, in
the layout 'lakeshore serve --blobs s3://BUCKET/PREFIX' reads: payloads under
PREFIX/payloads/, releases (binary and .sha256 sidecar) under
PREFIX/releases/.

Every blob is sent with the sha256 the source recorded for it, so the bucket
refuses bytes that do not match; afterwards the copy is looked up again, and
each payload read back in full, to prove it. A blob the bucket already holds
with the same sha256 is skipped, so the command can be run again after a
failure, or before the switch and once more after, and copies only what is
missing. A payload file with no sha256 recorded for it (no metadata) is
reported failed, never copied unchecked. The source's blobs are only read.

Progress goes to stderr, one line per blob; the summary (copied, skipped,
failed, bytes) to stdout, or as JSON with --json. The command exits 1, naming
every blob that failed, if any did.

Credentials come from the standard AWS chain (environment, shared config and
credentials files, instance role). --endpoint points at another S3-compatible
service (MinIO, Cloudflare R2).

` + cli.ExitCodeHelp,
		Example: `  lakeshore blobs migrate --from local:/var/lib/lakeshore --to s3://lakeshore-blobs/prod
  lakeshore blobs migrate --from local:$HOME/.local/share/lakeshore --to s3://blobs --dry-run
  lakeshore blobs migrate --from local:./data --to s3://blobs/cp --endpoint http://127.0.0.1:9000 --region us-east-1 --json`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := migrateSource(o.from)
			if err != nil {
				return err
			}
			cfg, err := migrateTarget(o.to)
			if err != nil {
				return err
			}
			if o.endpoint != "" {
				if u, err := url.Parse(o.endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					return cli.Usagef("--endpoint %q: want the S3 service's http:// or https:// URL, e.g. --endpoint http://127.0.0.1:9000", o.endpoint)
				}
			}
			cfg.Endpoint, cfg.Region = o.endpoint, o.region
			return a.migrate(cmd.Context(), o, dir, cfg)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.from, "from", "", "the data directory to copy from, as local:DIR (required)")
	fs.StringVar(&o.to, "to", "", "the bucket to copy into, as s3://BUCKET[/PREFIX] (required)")
	fs.StringVar(&o.endpoint, "endpoint", "", "S3 endpoint URL of a service other than AWS (MinIO, R2)")
	fs.StringVar(&o.region, "region", "", "the bucket's region (default: the AWS chain's, e.g. $AWS_REGION)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "say what would be copied, copy nothing")
	fs.BoolVar(&o.jsonOut, "json", false, "print the summary as JSON")
	return cmd
}

// migrateSource checks --from and returns the data directory it names.
func migrateSource(from string) (string, error) {
	if from == "" {
		return "", cli.Usagef("--from is required: the data directory to copy, e.g. --from local:/var/lib/lakeshore")
	}
	dir, ok := strings.CutPrefix(from, "local:")
	if !ok || dir == "" {
		return "", cli.Usagef("--from %q: want local:DIR, DIR being the data directory of 'lakeshore serve --data', e.g. --from local:/var/lib/lakeshore", from)
	}
	isDir := func(p string) bool {
		st, err := os.Stat(p)
		return err == nil && st.IsDir()
	}
	if !isDir(filepath.Join(dir, strings.TrimSuffix(payloadsPrefix, "/"))) && !isDir(filepath.Join(dir, releasesDir)) {
		return "", cli.Usagef("--from %q: %s is not a data directory of lakeshore serve (it has neither payloads/ nor releases/); give the directory 'lakeshore serve --data' uses", from, dir)
	}
	return dir, nil
}

// migrateTarget checks --to and returns the bucket it names.
func migrateTarget(to string) (blobs.S3Config, error) {
	if to == "" {
		return blobs.S3Config{}, cli.Usagef("--to is required: the bucket to copy into, e.g. --to s3://lakeshore-blobs/prod")
	}
	if !strings.HasPrefix(to, "s3://") {
		return blobs.S3Config{}, cli.Usagef("--to %q: want s3://BUCKET[/PREFIX], e.g. --to s3://lakeshore-blobs/prod (the value 'lakeshore serve --blobs' will be given)", to)
	}
	bucket, prefix, err := blobs.ParseS3URL(to)
	if err != nil {
		return blobs.S3Config{}, cli.Usagef("--to: %v; e.g. --to s3://lakeshore-blobs/prod", err)
	}
	return blobs.S3Config{Bucket: bucket, Prefix: prefix}, nil
}

// migrator copies one data directory into one bucket and keeps the tally.
type migrator struct {
	a       *app
	dryRun  bool
	jsonOut bool
	src     blobs.Store
	dst     blobs.Store
	summary migrateSummary
}

func (a *app) migrate(ctx context.Context, o migrateOptions, dir string, cfg blobs.S3Config) error {
	src, err := blobs.NewLocal(dir, blobs.LocalOptions{})
	if err != nil {
		return fmt.Errorf("--from %s: %w", o.from, err)
	}
	dst, err := blobs.OpenS3(ctx, cfg)
	if err != nil {
		return fmt.Errorf("--to %s: %w", o.to, err)
	}
	if err := dst.Check(ctx); err != nil {
		return fmt.Errorf("--to %s: %w", o.to, err)
	}
	m := &migrator{a: a, dryRun: o.dryRun, jsonOut: o.jsonOut, src: src, dst: dst,
		summary: migrateSummary{From: src.String(), To: dst.String(), DryRun: o.dryRun, Failures: []migrateFailure{}}}
	if err := m.payloads(ctx, dir); err != nil {
		return err
	}
	if err := m.releases(ctx, filepath.Join(dir, releasesDir)); err != nil {
		return err
	}
	return m.report()
}

func (m *migrator) progress(kind string, i, n int, key, what string) {
	fmt.Fprintf(m.a.env.Stderr, "%s %d/%d %s: %s\n", kind, i, n, key, what)
}

func (m *migrator) fail(c *migrateCount, key string, err error) {
	c.Failed++
	m.summary.Failures = append(m.summary.Failures, migrateFailure{Key: key, Error: err.Error()})
}

// payloads copies every payload key for key.
func (m *migrator) payloads(ctx context.Context, dir string) error {
	var all []blobs.Info
	listed := map[string]bool{}
	if err := m.src.List(ctx, payloadsPrefix, func(in blobs.Info) error {
		all = append(all, in)
		listed[in.Key] = true
		return nil
	}); err != nil {
		return fmt.Errorf("list the payloads of %s: %w", m.src, err)
	}
	c := &m.summary.Payloads
	// The store lists only blobs with metadata; a file without any would
	// otherwise be left behind without a word.
	unlisted, err := unlistedPayloads(dir, listed)
	if err != nil {
		return err
	}
	for _, key := range unlisted {
		m.fail(c, key, errors.New("it has no metadata in .meta/, so there is no sha256 to check it by (a data directory from before that layout: run 'lakeshore serve --data' on it once to move it, then migrate again)"))
		fmt.Fprintf(m.a.env.Stderr, "payloads %s: FAILED: no metadata\n", key)
	}
	for i, in := range all {
		if err := ctx.Err(); err != nil {
			return err
		}
		what, n, err := m.payload(ctx, in)
		if err != nil {
			m.fail(c, in.Key, err)
			m.progress("payloads", i+1, len(all), in.Key, "FAILED: "+err.Error())
			continue
		}
		if n < 0 {
			c.Skipped++
		} else {
			c.Copied++
			c.Bytes += n
		}
		m.progress("payloads", i+1, len(all), in.Key, what)
	}
	return nil
}

// payload copies one payload and proves the copy: the target must hold
// its size and sha256, and read back to the end without a checksum error.
// n is the bytes copied, -1 for a skip.
func (m *migrator) payload(ctx context.Context, in blobs.Info) (what string, n int64, err error) {
	if held, err := m.dst.Stat(ctx, in.Key); err == nil && in.SHA256 != "" && held.SHA256 == in.SHA256 && held.Size == in.Size {
		return "skipped (already there)", -1, nil
	} else if err != nil && !errors.Is(err, blobs.ErrNotFound) {
		return "", 0, fmt.Errorf("look it up in %s: %w", m.dst, err)
	}
	if m.dryRun {
		return "would copy (" + cli.ByteSize(in.Size) + ")", in.Size, nil
	}
	rc, info, err := m.src.Open(ctx, in.Key)
	if err != nil {
		return "", 0, fmt.Errorf("read: %w", err)
	}
	defer rc.Close()
	if info.SHA256 == "" {
		return "", 0, errors.New("the source has no sha256 recorded for it")
	}
	// The declared sha256 makes the target refuse bytes that changed since
	// the source recorded it; the source's reader refuses them too.
	if _, err := m.dst.Put(ctx, in.Key, rc, blobs.PutOptions{Size: info.Size, SHA256: info.SHA256, ContentType: info.ContentType}); err != nil {
		return "", 0, fmt.Errorf("copy: %w", err)
	}
	if err := m.verifyPayload(ctx, info); err != nil {
		// What is there is not what the source holds: leave nothing.
		_ = m.dst.Delete(ctx, in.Key)
		return "", 0, fmt.Errorf("verify the copy: %w", err)
	}
	return "copied (" + cli.ByteSize(info.Size) + ")", info.Size, nil
}

func (m *migrator) verifyPayload(ctx context.Context, want blobs.Info) error {
	if err := m.verifyStat(ctx, want.Key, want.Size, want.SHA256); err != nil {
		return err
	}
	rc, _, err := m.dst.Open(ctx, want.Key)
	if err != nil {
		return err
	}
	defer rc.Close()
	if _, err := io.Copy(io.Discard, rc); err != nil {
		return fmt.Errorf("read it back: %w", err)
	}
	return nil
}

func (m *migrator) verifyStat(ctx context.Context, key string, size int64, sha string) error {
	held, err := m.dst.Stat(ctx, key)
	if err != nil {
		return err
	}
	if held.SHA256 != sha || held.Size != size {
		return fmt.Errorf("%s holds %d bytes of sha256 %s, want %d bytes of sha256 %s: %w", m.dst, held.Size, held.SHA256, size, sha, blobs.ErrChecksum)
	}
	return nil
}

// releases copies every release of the data directory's catalogue.
func (m *migrator) releases(ctx context.Context, dir string) error {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil // a data directory that never had a release
	}
	from, err := releases.Open(dir)
	if err != nil {
		return fmt.Errorf("open the releases of %s: %w", m.src, err)
	}
	all, err := from.ListContext(ctx)
	if err != nil {
		return fmt.Errorf("list the releases of %s: %w", m.src, err)
	}
	to := releases.NewBucket(m.dst, releases.DefaultBucketPrefix)
	c := &m.summary.Releases
	for i, rel := range all {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := rel.Version + "/" + rel.Triple
		what, n, err := m.release(ctx, from, to, rel)
		if err != nil {
			m.fail(c, to.Key(rel.Version, rel.Triple), err)
			m.progress("releases", i+1, len(all), name, "FAILED: "+err.Error())
			continue
		}
		if n < 0 {
			c.Skipped++
		} else {
			c.Copied++
			c.Bytes += n
		}
		m.progress("releases", i+1, len(all), name, what)
	}
	return nil
}

// release copies one release (binary, then sidecar) and proves it: the
// binary is held with the sha256 the source's catalogue names, and the
// bucket's catalogue reads that sha256 back from the sidecar.
func (m *migrator) release(ctx context.Context, from *releases.Store, to *releases.Bucket, rel releases.Release) (string, int64, error) {
	held, err := to.GetContext(ctx, rel.Version, rel.Triple)
	switch {
	case err == nil && held.SHA256 == rel.SHA256 && held.Size == rel.Size:
		if m.verifyStat(ctx, to.Key(rel.Version, rel.Triple), rel.Size, rel.SHA256) == nil {
			return "skipped (already there)", -1, nil
		}
	case err != nil && !errors.Is(err, releases.ErrNotFound):
		return "", 0, fmt.Errorf("look it up in %s: %w", m.dst, err)
	}
	if m.dryRun {
		return "would copy (" + cli.ByteSize(rel.Size) + ")", rel.Size, nil
	}
	rc, rel, err := from.Open(ctx, rel.Version, rel.Triple)
	if err != nil {
		return "", 0, fmt.Errorf("read: %w", err)
	}
	defer rc.Close()
	if _, err := to.Import(ctx, rel, rc); err != nil {
		return "", 0, fmt.Errorf("copy: %w", err)
	}
	if err := m.verifyStat(ctx, to.Key(rel.Version, rel.Triple), rel.Size, rel.SHA256); err != nil {
		return "", 0, fmt.Errorf("verify the copy: %w", err)
	}
	if got, err := to.GetContext(ctx, rel.Version, rel.Triple); err != nil || got.SHA256 != rel.SHA256 {
		return "", 0, fmt.Errorf("verify the copy: the sidecar reads back as %q (%v), want %s", got.SHA256, err, rel.SHA256)
	}
	return "copied (" + cli.ByteSize(rel.Size) + ")", rel.Size, nil
}

// report prints the summary and fails the command, naming every failure,
// if anything failed.
func (m *migrator) report() error {
	s := m.summary
	var err error
	if m.jsonOut {
		err = cli.WriteJSON(m.a.env.Stdout, s)
	} else {
		err = m.printSummary()
	}
	if err != nil {
		return err
	}
	if len(s.Failures) == 0 {
		return nil
	}
	msgs := make([]string, len(s.Failures))
	for i, f := range s.Failures {
		msgs[i] = f.Key + ": " + f.Error
	}
	return cli.ExitWith(cli.ExitError, fmt.Errorf("%d blob(s) failed to migrate to %s, and were not copied:\n  %s", len(s.Failures), s.To, strings.Join(msgs, "\n  ")))
}

func (m *migrator) printSummary() error {
	s := m.summary
	w := m.a.env.Stdout
	verb := "copied"
	if s.DryRun {
		verb = "to copy"
	}
	for _, k := range []struct {
		name string
		c    migrateCount
	}{{"payloads", s.Payloads}, {"releases", s.Releases}} {
		if _, err := fmt.Fprintf(w, "%s: %d %s (%s), %d skipped (already there), %d failed\n", k.name, k.c.Copied, verb, cli.ByteSize(k.c.Bytes), k.c.Skipped, k.c.Failed); err != nil {
			return err
		}
	}
	var err error
	switch {
	case s.DryRun:
		_, err = fmt.Fprintf(w, "dry run: nothing was copied to %s\n", s.To)
	case s.Payloads.Copied+s.Releases.Copied+len(s.Failures) == 0:
		_, err = fmt.Fprintf(w, "nothing to copy: %s already holds every payload and release of %s\n", s.To, s.From)
	case len(s.Failures) == 0:
		_, err = fmt.Fprintf(w, "migrated %s to %s; every sha256 checked\n", s.From, s.To)
	}
	return err
}

// unlistedPayloads walks DIR/payloads for regular files that are no blob
// the store listed (metadata directories and dot-files aside).
func unlistedPayloads(dir string, listed map[string]bool) ([]string, error) {
	root := filepath.Join(dir, strings.TrimSuffix(payloadsPrefix, "/"))
	var out []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == root {
			return filepath.SkipDir
		}
		if err != nil {
			return err
		}
		if p != root && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if key := filepath.ToSlash(rel); !listed[key] {
			out = append(out, key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk %s: %w", root, err)
	}
	return out, nil
}
