package servecli

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"nymph/lakeshore/blobs"
	"nymph/lakeshore/cli"
	"nymph/timerslack"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"nymph/lakeshore/controlplane"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/procs"
	"nymph/lakeshore/providers"
	"nymph/lakeshore/releases"
	"nymph/lakeshore/store/postgres"
	"nymph/lakeshore/store/sqlite"
)

// Defaults of `lakeshore serve`.
const (
	DefaultAddr  = "127.0.0.1:7700"
	EnvAddr      = "LAKESHORE_ADDR"
	EnvPublicURL = "LAKESHORE_PUBLIC_URL"
	EnvDataDir   = "LAKESHORE_DATA"
	EnvStore     = "LAKESHORE_STORE"
	// EnvMetricsToken and EnvMetricsAddr are --metrics-token's and
	// --metrics-addr's.
	EnvMetricsToken = "LAKESHORE_METRICS_TOKEN"
	EnvMetricsAddr  = "LAKESHORE_METRICS_ADDR"
)

type serveOpts struct {
	addr, dataDir, publicURL, daemonToken string
	metricsToken, metricsAddr             string
	store                                 string
	logLevel, logFormat                   string
	noCredentials                         bool
	staleAfter                            time.Duration
	// lostAfter counts only when lostAfterSet; otherwise the control
	// plane's default applies (never shorter than the stale window).
	lostAfter    time.Duration
	lostAfterSet bool
	// procs is --procs: "auto" or a count.
	procs    string
	slack    time.Duration
	identity identityOpts
	edge     edgeOpts
	blobs    blobOpts
}

// blobOpts says where payloads and releases are kept.
type blobOpts struct {
	url, endpoint, region, publicURL string
	retention, urlTTL                time.Duration
}

// Environment of the blob store flags.
const (
	EnvBlobs         = "LAKESHORE_BLOBS"
	EnvBlobsEndpoint = "LAKESHORE_BLOBS_ENDPOINT"
)

// blobCheckTimeout bounds serve's start-up check of a bucket.
const blobCheckTimeout = 20 * time.Second

func (o *blobOpts) addFlags(cmd *cobra.Command, getenv func(string) string) {
	fs := cmd.Flags()
	fs.StringVar(&o.url, "blobs", getenv(EnvBlobs), "where payloads and releases are kept: local (the data dir, the default) or s3://BUCKET/PREFIX, shared by replicas (env "+EnvBlobs+")")
	fs.StringVar(&o.endpoint, "blobs-endpoint", getenv(EnvBlobsEndpoint), "S3-compatible endpoint URL for --blobs s3://... (R2, MinIO; default AWS) (env "+EnvBlobsEndpoint+")")
	fs.StringVar(&o.region, "blobs-region", "", "region of the --blobs bucket (default: the AWS configuration's, else us-east-1)")
	fs.StringVar(&o.publicURL, "blobs-public-url", "", "public URL of the --blobs bucket prefix: release downloads are handed out there instead of as presigned URLs")
	fs.DurationVar(&o.urlTTL, "payload-url-ttl", operatorapi.PayloadTTL, "how long a presigned payload URL stays valid (at least 1s)")
	fs.DurationVar(&o.retention, "payload-retention", controlplane.DefaultPayloadRetention, "how long a payload is kept after its job finished (or after its upload, if no job holds it); 0 keeps them forever")
}

func (a *app) serveCmd() *cobra.Command {
	var o serveOpts
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the control plane",
		Long: `Run the control plane: the daemon routes nymph talks to and the operator API
this CLI talks to, on an embedded SQLite store in --data.

--store (or $LAKESHORE_STORE) postgres://USER@HOST/DB keeps the state in
PostgreSQL instead, so that several control planes — replicas behind one
address, or a standby — share it: each migrates the schema once, claims
work safely against the others, and wakes the long-polls parked on the
others through LISTEN/NOTIFY. Give every replica the same admin token
($LAKESHORE_ADMIN_TOKEN) and daemon token.

Payloads (large run args, uploaded results) and published releases are
kept in --data by default: enough for one control plane, not for replicas,
since a daemon may fetch through one replica what another stored. Give
replicas --blobs s3://BUCKET/PREFIX (the same on each): any S3-compatible
bucket (AWS S3; Cloudflare R2 or MinIO with --blobs-endpoint), with
credentials from the standard AWS chain of this process ($AWS_PROFILE,
$AWS_ACCESS_KEY_ID, an instance role). Payload URLs are then the bucket's
own presigned URLs, so the bytes never pass through the control plane;
release downloads redirect to a short-lived presigned URL, or are handed
out under --blobs-public-url for a public bucket. serve checks the bucket
before it listens. Payloads are deleted --payload-retention (default 7
days) after the job that holds them finished. 'lakeshore blobs migrate'
copies what a data dir holds into a bucket.

The admin token comes from --admin-token or $LAKESHORE_ADMIN_TOKEN; without
one, the control plane generates one on first start, keeps it (mode 0600) in
the data directory and prints it here once. Either way serve writes it, with
this machine's URL, to the credentials file ($LAKESHORE_CREDENTIALS, else
$XDG_CONFIG_HOME/lakeshore/credentials.json, else
~/.config/lakeshore/credentials.json; mode 0600), so the CLI on this machine
needs no flags.

No exec or run stays running forever: one is failed as lost (exec exit_code
-1, run error WorkerLost) when its daemon comes back as a new process without
it, stops reporting it, is removed, or has not been seen for --lost-after
(default ` + controlplane.DefaultLostAfter.String() + `, and no less than the minute after which a daemon
reads back stale). A real outcome the daemon posts later changes nothing.

Daemons authenticate with tokens from 'lakeshore token create' (each bound to
the daemon whose hello first uses it), or with the shared bootstrap token
--daemon-token / $LAKESHORE_DAEMON_TOKEN, which, like a 'token create --fleet'
token, any number of daemons share: its holders can act for each other unless
daemon identity is on. Nothing of a daemon request is read before its
credential is checked, and signed requests are refused when replayed, also
after a restart; one key sending more than --daemon-key-rate is answered 429.
--public-url is the URL daemons are told to use (default: the listen address).
--tls-cert and --tls-key serve HTTPS; a CLI then trusts a private CA through
--ca-file or $LAKESHORE_CA_FILE. --require-daemon-signatures (or
$LAKESHORE_REQUIRE_DAEMON_SIGNATURES=1) turns away daemons that do not sign
their requests with an enrolled key ('lakeshore token create --enroll').

Slow clients are cut off (the answer is 408 where one can still be sent): a
client has --header-timeout to send its headers (and finish a TLS
handshake); a request body has --body-grace, then must keep up an average
of --body-min-rate bytes per second and end within --body-timeout
(--upload-timeout for release publish and payload uploads); each write of an
answer may wait --write-timeout for the client to read it; a kept-alive
connection may idle --idle-timeout. Long-polls are not affected.
--max-conns-per-ip caps the connections open at once from one address.
GET /healthz answers while the process runs; GET /readyz answers 200 while
the store answers with its migrations applied, 503 otherwise and while
shutting down.
An idle daemon costs the control plane no disk: a poll that changes nothing
is answered from memory (its last seen is written every 2 s, with everyone
else's), and tokens, keys and target versions are cached, dropped at once
when changed here and, on replicas, as soon as the change's notification
arrives. Memory grows with the daemons connected (tens of KB each), and
more while they all say hello at once (10,000 daemons booting together:
about 200 MB once they poll, 500-650 MB at the peak); the Go runtime's
$GOMEMLIMIT (e.g. GOMEMLIMIT=350MiB) makes the collector work harder near
that limit instead of growing past it (that boot then peaks under 400 MB
and takes twice as long to register).
Prometheus metrics (README.md, "Metrics", lists them) are served at
GET /metrics, the operator's choice: on this listener to the bearer
--metrics-token ($LAKESHORE_METRICS_TOKEN) or the admin token, and/or
unauthenticated on a listener of their own, --metrics-addr HOST:PORT
($LAKESHORE_METRICS_ADDR), which serve refuses to start without. With
neither, /metrics answers 404 saying so.
SIGINT or SIGTERM stops it cleanly. Logs go to stderr (zerolog).`,
		Example: `  lakeshore serve
  lakeshore serve --addr 0.0.0.0:7700 --data /var/lib/lakeshore --public-url https://cp.example.internal:7700
  LAKESHORE_DAEMON_TOKEN=$(cat daemon-token) lakeshore serve --data ./cp
  lakeshore serve --addr 0.0.0.0:7700 --tls-cert cp.pem --tls-key cp-key.pem --require-daemon-signatures
  lakeshore serve --lost-after 30m     # a flaky network: give silent daemons longer before failing their jobs
  lakeshore serve --max-conns-per-ip 4096 --upload-timeout 3h   # a big fleet behind one NAT, slow uplinks
  lakeshore serve --metrics-addr 10.0.0.5:9770     # Prometheus scrapes http://10.0.0.5:9770/metrics, no token
  LAKESHORE_ADMIN_TOKEN=$(cat admin-token) lakeshore serve --store postgres://lakeshore@db.internal/lakeshore
  LAKESHORE_ADMIN_TOKEN=$(cat admin-token) lakeshore serve --store postgres://lakeshore@db.internal/lakeshore \
      --blobs s3://fleet-blobs/lakeshore --blobs-region eu-west-1     # a replica: state and blobs shared
  lakeshore serve --blobs s3://blobs/cp --blobs-endpoint https://ACCOUNT.r2.cloudflarestorage.com --blobs-region auto`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.lostAfterSet = cmd.Flags().Changed("lost-after")
			return a.serve(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.addr, "addr", envOr(a.env.Getenv, EnvAddr, DefaultAddr), "listen address (env "+EnvAddr+")")
	fs.StringVar(&o.dataDir, "data", a.env.Getenv(EnvDataDir), "data directory (env "+EnvDataDir+"; default $XDG_DATA_HOME/lakeshore or ~/.local/share/lakeshore)")
	fs.StringVar(&o.store, "store", a.env.Getenv(EnvStore), "where state lives: sqlite (the file in --data, the default) or a postgres:// URL shared by replicas (env "+EnvStore+")")
	fs.StringVar(&o.publicURL, "public-url", a.env.Getenv(EnvPublicURL), "URL daemons use to reach this control plane (env "+EnvPublicURL+")")
	fs.StringVar(&o.daemonToken, "daemon-token", "", "shared bootstrap token daemons may present (env "+cli.EnvDaemonToken+")")
	fs.StringVar(&o.metricsToken, "metrics-token", "", "bearer that GET /metrics on the main listener accepts, beside the admin token (env "+EnvMetricsToken+"; unset: /metrics there is 404)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", a.env.Getenv(EnvMetricsAddr), "HOST:PORT of a separate listener serving only GET /metrics, unauthenticated (env "+EnvMetricsAddr+")")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&o.logFormat, "log-format", "auto", "log format: json, console, or auto (console on a terminal)")
	fs.BoolVar(&o.noCredentials, "no-credentials", false, "do not write the credentials file")
	// A shorter stale window lets end-to-end tests see stale workers
	// without waiting a minute; operators have no reason to change it.
	fs.DurationVar(&o.staleAfter, "stale-after", 0, "how long a daemon may go unseen before it reads back stale (default 60s)")
	_ = fs.MarkHidden("stale-after")
	fs.DurationVar(&o.lostAfter, "lost-after", controlplane.DefaultLostAfter,
		"how long a daemon may go unseen before the execs and runs it was running fail as lost (e.g. 10m)")
	fs.StringVar(&o.procs, "procs", "auto", "processors for the Go runtime: auto (one while the load is under one CPU, every CPU above it) or a count; $GOMAXPROCS, when set, wins")
	fs.DurationVar(&o.slack, "timer-slack", time.Millisecond, "how late the kernel may fire this process's timers, so that the Go runtime's wake-ups coalesce (needs CAP_SYS_NICE; 0 leaves the kernel's)")
	o.identity.addFlags(cmd, a.env.Getenv)
	o.edge.addFlags(cmd)
	o.blobs.addFlags(cmd, a.env.Getenv)
	return cmd
}

// checkLostAfter validates --lost-after against the stale window and
// returns what the control plane is to use (0: its default).
func (o serveOpts) checkLostAfter() (time.Duration, error) {
	if o.staleAfter < 0 {
		return 0, cli.Usagef("--stale-after %v: must not be negative", o.staleAfter)
	}
	if !o.lostAfterSet {
		return 0, nil
	}
	stale := o.staleAfter
	if stale == 0 {
		stale = operatorapi.StaleAfter
	}
	switch {
	case o.lostAfter <= 0:
		return 0, cli.Usagef("--lost-after %v: must be a positive duration, such as 10m", o.lostAfter)
	case o.lostAfter < stale:
		return 0, cli.Usagef("--lost-after %v: must be at least %v, the window after which a daemon reads back stale", o.lostAfter, stale)
	}
	return o.lostAfter, nil
}

func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}

func (a *app) serve(ctx context.Context, o serveOpts) error {
	logger, err := newLogger(a.env, o.logLevel, o.logFormat)
	if err != nil {
		return cli.UsageError(err)
	}
	if o.dataDir == "" {
		if o.dataDir, err = defaultDataDir(a.env.Getenv); err != nil {
			return err
		}
	}
	if o.daemonToken == "" {
		o.daemonToken = a.env.Getenv(cli.EnvDaemonToken)
	}
	if o.metricsToken == "" {
		o.metricsToken = a.env.Getenv(EnvMetricsToken)
	}
	if err := o.identity.resolve(a.env.Getenv); err != nil {
		return err
	}
	adminToken := a.host.AdminToken()
	if adminToken == "" {
		adminToken = a.env.Getenv(cli.EnvAdminToken)
	}
	if o.publicURL != "" {
		o.publicURL = strings.TrimRight(cli.WithScheme(o.publicURL), "/")
	}

	lostAfter, err := o.checkLostAfter()
	if err != nil {
		return err
	}
	procCount, err := parseProcs(o.procs)
	if err != nil {
		return err
	}
	if o.slack < 0 {
		return cli.Usagef("--timer-slack %v: want 0 (the kernel's) or a duration such as 1ms", o.slack)
	}

	cfg := controlplane.Config{
		DataDir:      o.dataDir,
		AdminToken:   adminToken,
		DaemonToken:  o.daemonToken,
		Logger:       logger,
		StaleAfter:   o.staleAfter,
		LostAfter:    lostAfter,
		MetricsToken: o.metricsToken,
		OpenProvider: func(ctx context.Context, spec providers.Spec, dir string) (providers.Launcher, error) {
			return providers.Open(ctx, spec, dir, logger)
		},
	}
	if err := o.edge.apply(&cfg); err != nil {
		return err
	}
	// The address first: a second serve on a busy one (a second make run)
	// stops before it opens, migrates or writes anything of the first's.
	ln, err := net.Listen("tcp", o.addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("listen on %s: something is already listening there (another lakeshore serve? GET /healthz answers \"ok\" if so); stop it, or pass another --addr: %w", o.addr, err)
	}
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.addr, err)
	}
	defer ln.Close()
	if o.metricsAddr != "" {
		mln, err := net.Listen("tcp", o.metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-addr %s: cannot listen there (a HOST:PORT that is free on this machine): %w", o.metricsAddr, err)
		}
		defer mln.Close()
		cfg.MetricsListener = mln
	}
	if err := o.blobs.apply(ctx, &cfg); err != nil {
		return err
	}
	if err := OpenStores(ctx, &cfg, o.store); err != nil {
		return err
	}
	local := o.identity.url(localURL(ln.Addr()))
	public := o.publicURL
	if public == "" {
		public = local
	}
	cfg.Addr, cfg.PublicURL = ln.Addr().String(), public
	o.identity.apply(&cfg)
	if limit := debug.SetMemoryLimit(-1); limit < math.MaxInt64 {
		logger.Info().Int64("memory_limit_bytes", limit).Msg("memory limit from GOMEMLIMIT: the collector works harder near it")
	}
	startProcs(ctx, procCount, a.env.Getenv("GOMAXPROCS"), logger)
	coarsenTimers(o.slack, logger)
	srv, err := controlplane.New(ctx, cfg)
	if err != nil {
		cfg.Store.Close()
		return fmt.Errorf("start the control plane: %w", err)
	}
	defer srv.Close()

	credsPath := ""
	if !o.noCredentials {
		credsPath, err = cli.CredentialsPath(a.env.Getenv)
		if err == nil {
			err = cli.WriteCredentials(credsPath, cli.Credentials{URL: local, AdminToken: srv.AdminToken(), PublicURL: public})
		}
		if err != nil {
			return fmt.Errorf("credentials file: %w", err)
		}
	}
	if srv.AdminTokenCreated() {
		fmt.Fprintf(a.env.Stdout, "generated admin token (shown once): %s\n", srv.AdminToken())
		if credsPath != "" {
			fmt.Fprintf(a.env.Stdout, "saved for this machine's CLI in %s\n", credsPath)
		} else {
			fmt.Fprintf(a.env.Stdout, "use it elsewhere with %s=<token>\n", cli.EnvAdminToken)
		}
	}
	if credsPath != "" {
		logger.Info().Str("path", credsPath).Str("url", local).Msg("credentials written for this machine's CLI")
	}

	err = srv.Serve(ctx, ln)
	if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) &&
		!(ctx.Err() != nil && errors.Is(err, context.Canceled)) {
		return fmt.Errorf("serve: %w", err)
	}
	logger.Info().Msg("control plane stopped")
	return nil
}

// parseProcs reads --procs: 0 for auto, else the count.
func parseProcs(v string) (int, error) {
	if v == "auto" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, cli.Usagef("--procs %q: want auto or a number of processors, such as 2", v)
	}
	return n, nil
}

// startProcs sets the runtime's processors for serve: a count as given,
// or (auto) adapted to the load until ctx is done (package procs). An
// explicit $GOMAXPROCS (env) is left as it is.
func startProcs(ctx context.Context, count int, env string, log zerolog.Logger) {
	switch {
	case env != "":
		log.Info().Str("GOMAXPROCS", env).Msg("runtime processors fixed by $GOMAXPROCS")
	case count > 0:
		runtime.GOMAXPROCS(count)
	case runtime.GOMAXPROCS(0) > 1:
		a := &procs.Adapter{Max: runtime.GOMAXPROCS(0), Log: log}
		go a.Run(ctx)
	}
}

// coarsenTimers applies --timer-slack (package timerslack).
func coarsenTimers(d time.Duration, log zerolog.Logger) {
	if n, err := timerslack.Coarsen(d); err != nil {
		log.Info().Err(err).Msg("timer slack left as the kernel's")
	} else if n > 0 {
		log.Debug().Dur("timer_slack", d).Int("threads", n).Msg("timer slack set")
	}
}

// OpenStores chooses the control plane's stores: the database spec (--store)
// names (by default the SQLite file in the data dir), and the payloads and
// releases kept in the data dir. Tests of in-process control planes use it.
func OpenStores(ctx context.Context, cfg *controlplane.Config, spec string) error {
	pg := strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://")
	if !pg && spec != "" && spec != "sqlite" {
		return cli.Usagef("--store %q: want sqlite or a postgres:// URL", redactURL(spec))
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("start the control plane: data dir: %w", err)
	}
	if cfg.Blobs == nil {
		rel, err := releases.Open(filepath.Join(cfg.DataDir, "releases"))
		if err != nil {
			return fmt.Errorf("start the control plane: %w", err)
		}
		cfg.Releases, cfg.Payloads = rel, controlplane.NewPayloadStore(filepath.Join(cfg.DataDir, "payloads"))
	}
	if !pg {
		db, err := sqlite.OpenWith(ctx, filepath.Join(cfg.DataDir, "lakeshore.db"), sqlite.Options{Log: cfg.Logger})
		if err != nil {
			return fmt.Errorf("start the control plane: %w", err)
		}
		cfg.Store = db
		return nil
	}
	db, err := postgres.Open(ctx, spec)
	if err != nil {
		// The error may quote the URL, password and all; say where
		// without it.
		return fmt.Errorf("--store: open PostgreSQL at %s: %w", redactURL(spec), redactErr(err, spec))
	}
	cfg.Store, cfg.Notifier = db, db.Notifier()
	cfg.Logger.Info().Str("store", "postgres").Msg("state in PostgreSQL, shared with any other replica")
	return nil
}

// redactURL drops the password from a URL for messages and logs.
func redactURL(spec string) string {
	u, err := url.Parse(spec)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}

// redactErr replaces the password in err's text, if it appears there.
func redactErr(err error, spec string) error {
	u, perr := url.Parse(spec)
	if perr != nil || u.User == nil {
		return err
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), pw, "[redacted]"))
}

func defaultDataDir(getenv func(string) string) (string, error) {
	if x := getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "lakeshore"), nil
	}
	home := getenv("HOME")
	if home == "" {
		return "", errors.New("--data is required: neither XDG_DATA_HOME nor HOME is set")
	}
	return filepath.Join(home, ".local", "share", "lakeshore"), nil
}

// newLogger builds the one logger serve injects into the control plane.
func newLogger(env cli.Env, level, format string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	var console bool
	switch format {
	case "auto":
		console = env.StderrTTY
	case "console":
		console = true
	case "json":
	default:
		return zerolog.Logger{}, fmt.Errorf("--log-format %q: want json, console or auto", format)
	}
	if console {
		w := zerolog.ConsoleWriter{Out: env.Stderr, TimeFormat: time.TimeOnly}
		return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
	}
	return zerolog.New(env.Stderr).Level(lvl).With().Timestamp().Logger(), nil
}

// apply validates the blob flags and, for a bucket, opens it and proves
// it usable before serve listens: a bucket that does not exist, refused
// credentials or an endpoint that is down stop serve here, not at the
// first upload.
func (o blobOpts) apply(ctx context.Context, cfg *controlplane.Config) error {
	switch {
	case o.retention < 0:
		return cli.Usagef("--payload-retention %v: must not be negative (0 keeps payloads forever)", o.retention)
	case o.retention == 0:
		cfg.PayloadRetention = -1
	default:
		cfg.PayloadRetention = o.retention
	}
	if o.urlTTL < time.Second {
		return cli.Usagef("--payload-url-ttl %v: must be at least 1s", o.urlTTL)
	}
	cfg.PayloadURLTTL = o.urlTTL
	if o.url == "" || o.url == "local" {
		for flag, v := range map[string]string{"--blobs-endpoint": o.endpoint, "--blobs-region": o.region, "--blobs-public-url": o.publicURL} {
			if v != "" {
				return cli.Usagef("%s is for a bucket: give --blobs s3://BUCKET/PREFIX too", flag)
			}
		}
		return nil
	}
	if !strings.HasPrefix(o.url, "s3://") {
		return cli.Usagef("--blobs %q: want local or s3://BUCKET/PREFIX", o.url)
	}
	bucket, prefix, err := blobs.ParseS3URL(o.url)
	if err != nil {
		return cli.Usagef("--blobs: %v", err)
	}
	if o.endpoint != "" {
		if u, err := url.Parse(o.endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return cli.Usagef("--blobs-endpoint %q: want an http(s) URL such as https://ACCOUNT.r2.cloudflarestorage.com", o.endpoint)
		}
	}
	if o.publicURL != "" {
		if u, err := url.Parse(o.publicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return cli.Usagef("--blobs-public-url %q: want an http(s) URL", o.publicURL)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, blobCheckTimeout)
	defer cancel()
	st, err := blobs.OpenS3(cctx, blobs.S3Config{Bucket: bucket, Prefix: prefix, Endpoint: o.endpoint, Region: o.region})
	if err != nil {
		return fmt.Errorf("--blobs %s: %w", o.url, err)
	}
	if err := st.Check(cctx); err != nil {
		return fmt.Errorf("--blobs %s: %w", o.url, err)
	}
	cfg.Blobs, cfg.BlobsPublicURL = st, strings.TrimRight(o.publicURL, "/")
	cfg.Logger.Info().Str("blobs", st.String()).Msg("payloads and releases in a bucket, shared with any other replica")
	return nil
}

// localURL is how a client on this machine reaches a listener at addr:
// an unspecified host (0.0.0.0, ::) becomes the matching loopback address.
func localURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if ip.To4() != nil {
			host = "127.0.0.1"
		} else {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}
