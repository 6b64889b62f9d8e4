// Package config owns nymph's TOML configuration file: its sections and
// defaults, validation that reports every problem at once (each naming the
// file, the key and what is wrong), `~` expansion, and the queue override
// from --queue or DREAMLAKE_QUEUE.
//
// The file is decoded by github.com/BurntSushi/toml through the struct tags
// of Config, one key at a time, so a wrong type on one key does not hide the
// problems of the others. Unknown keys (what MetaData.Undecoded lists) are
// not fatal (a newer installer may write keys an older daemon does not
// know); they come back as Warnings for the caller to log.
//
// How each runner kind reaches its backend is set in its own table, all
// optional; every table also takes kill_grace_s (seconds between SIGTERM
// and SIGKILL when a run is stopped, default 5):
//
//	[runners.process]
//	[runners.python]
//	python = "/usr/bin/python3"            # default "python3" from PATH
//	[runners.docker]
//	cli = "podman"                         # any docker-compatible CLI, default "docker"
//	global_args = ["--runtime", "runc"]    # before every subcommand
//	run_args = ["--network=none"]          # extra flags of `run`
//	shell = "/bin/sh"                      # interpreter of scripts in the image
//	[runners.gvisor]
//	runsc = "/usr/bin/runsc"               # default "runsc" from PATH
//	global_args = ["--platform=systrap"]   # runsc flags before `do`
//	state_root = "/var/lib/nymph/runsc"    # per-run runsc state, default the temp dir
//	cli = "podman"                         # container CLI for runs with an image;
//	container_global_args = ["--runtime", "/usr/bin/runsc"]  # unset: image runs are refused
//	container_run_args = ["--network=none"]
//	[runners.slurm]
//	srun_args = ["--partition=debug"]
//	env = ["SLURM_CONF=/etc/slurm/other.conf"]  # KEY=VALUE for srun, scancel, squeue
//	bin_dir = "/opt/slurm/bin"             # where srun, scancel, squeue are; default PATH
//
// Metrics for node_exporter's textfile collector (nymph never listens):
//
//	[metrics]
//	textfile = "/var/lib/node_exporter/textfile/nymph.prom"  # must end in .prom; unset writes none
//	interval_s = 5                          # seconds between two writes, >= 1 (default 5)
//
// Binaries named with a '/' (and state_root, bin_dir) get the same `~` and
// relative-path treatment as other files; a bare name is looked up in PATH
// when a run starts.
package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"nymph/messages"

	"github.com/BurntSushi/toml"
)

// EnvQueue overrides [daemon] queue; --queue overrides both.
const EnvQueue = "DREAMLAKE_QUEUE"

// Config is nymph's whole configuration. The toml tags are the file's
// keys, for decoding here and for whoever writes a file (lakeshore's
// remote install encodes this struct).
type Config struct {
	// Path is the file the configuration was read from.
	Path     string   `toml:"-"`
	Server   Server   `toml:"server"`
	Daemon   Daemon   `toml:"daemon"`
	Poll     Poll     `toml:"poll"`
	Runtime  Runtime  `toml:"runtime"`
	Identity Identity `toml:"identity"`
	Log      Log      `toml:"log"`
	Metrics  Metrics  `toml:"metrics"`
	Runners  Runners  `toml:"runners"`
	// Warnings are non-fatal findings, such as unknown keys.
	Warnings []string `toml:"-"`
}

// Server is the [server] section: where the control plane is and how to
// authenticate to it.
type Server struct {
	URL       string `toml:"url"`
	TokenFile string `toml:"token_file"`
	CAFile    string `toml:"ca_file"`
}

// Daemon is the [daemon] section: how this host presents itself.
type Daemon struct {
	// MachineID "auto" means the hostname.
	MachineID string   `toml:"machine_id"`
	Label     string   `toml:"label"`
	Tags      []string `toml:"tags"`
	Lanes     []string `toml:"lanes"`
	Queue     string   `toml:"queue"`
}

// Poll is the [poll] section, in seconds.
type Poll struct {
	WaitMaxS  float64 `toml:"wait_max_s"`
	RetryMinS float64 `toml:"retry_min_s"`
	RetryMaxS float64 `toml:"retry_max_s"`
}

// Runtime is the [runtime] section.
type Runtime struct {
	// MaxInvocations bounds concurrent execs and runs; 0 is unbounded.
	MaxInvocations int      `toml:"max_invocations"`
	DefaultRunner  string   `toml:"default_runner"`
	Runners        []string `toml:"runners"`
	Workdir        string   `toml:"workdir"`
	// KeepAliveS is the idle policy: -1 never exits on idle, 0 exits after
	// the first job, N exits after N idle seconds.
	KeepAliveS     int     `toml:"keep_alive_s"`
	ShutdownGraceS float64 `toml:"shutdown_grace_s"`
	// AutoUpdate follows the control plane's target_nymph_version: a poll
	// response naming another version installs it from the control plane's
	// own release store, at most once per AutoUpdateCheckIntervalS (tried,
	// not succeeded: a missing release is not retried any sooner).
	AutoUpdate               bool `toml:"auto_update"`
	AutoUpdateCheckIntervalS int  `toml:"auto_update_check_interval_s"`
	// MaxProcs caps the Go runtime's processors (GOMAXPROCS) in the
	// daemon; 0 leaves the runtime's own choice (every CPU it may use).
	// The daemon's own work is small, and the host's CPUs are its jobs':
	// with one processor for each CPU, every hand-off between the daemon's
	// goroutines woke an idle thread, which made a short exec cost the
	// daemon ~40% more CPU, taken from the job. $GOMAXPROCS, when set,
	// wins.
	MaxProcs int `toml:"max_procs"`
	// TimerSlackUS is how late, in microseconds, the kernel may fire the
	// daemon's timers, so that the Go runtime's own wake-ups coalesce
	// (package timerslack; it needs CAP_SYS_NICE). The commands the daemon
	// runs keep the slack it started with. 0 leaves the kernel's.
	TimerSlackUS int `toml:"timer_slack_us"`
}

// Identity is the [identity] section (request signing).
type Identity struct {
	Enabled         bool   `toml:"enabled"`
	KeyFile         string `toml:"key_file"`
	EnrollTokenFile string `toml:"enroll_token_file"`
}

// Runners holds the [runners.<kind>] tables, one field per messages.RunnerKinds
// entry.
type Runners struct {
	Process ProcessRunner `toml:"process"`
	Python  PythonRunner  `toml:"python"`
	Docker  DockerRunner  `toml:"docker"`
	Gvisor  GvisorRunner  `toml:"gvisor"`
	Slurm   SlurmRunner   `toml:"slurm"`
	// Echo has no settings; the field makes [runners.echo] a known table.
	Echo struct{} `toml:"echo"`
}

// ProcessRunner is [runners.process].
type ProcessRunner struct {
	KillGraceS float64 `toml:"kill_grace_s"`
}

// PythonRunner is [runners.python].
type PythonRunner struct {
	// Python is the interpreter: a path or a name looked up in PATH.
	Python     string  `toml:"python"`
	KillGraceS float64 `toml:"kill_grace_s"`
}

// DockerRunner is [runners.docker].
type DockerRunner struct {
	// CLI is the docker-compatible CLI: docker, podman, or a path.
	CLI string `toml:"cli"`
	// GlobalArgs go before every subcommand, RunArgs after `run`.
	GlobalArgs []string `toml:"global_args"`
	RunArgs    []string `toml:"run_args"`
	// Shell runs scripts inside the image.
	Shell      string  `toml:"shell"`
	KillGraceS float64 `toml:"kill_grace_s"`
}

// GvisorRunner is [runners.gvisor].
type GvisorRunner struct {
	Runsc string `toml:"runsc"`
	// GlobalArgs are runsc flags put before `do`.
	GlobalArgs []string `toml:"global_args"`
	// StateRoot is where per-run runsc state directories are made; empty
	// is the system temp dir.
	StateRoot string `toml:"state_root"`
	// CLI, when set, runs invocations that name an image through that
	// container CLI with ContainerGlobalArgs and ContainerRunArgs, which
	// must select runsc as the runtime.
	CLI                 string   `toml:"cli"`
	ContainerGlobalArgs []string `toml:"container_global_args"`
	ContainerRunArgs    []string `toml:"container_run_args"`
	KillGraceS          float64  `toml:"kill_grace_s"`
}

// SlurmRunner is [runners.slurm].
type SlurmRunner struct {
	SrunArgs []string `toml:"srun_args"`
	// Env holds KEY=VALUE entries for every SLURM command.
	Env []string `toml:"env"`
	// BinDir is where srun, scancel and squeue are; empty is PATH.
	BinDir     string  `toml:"bin_dir"`
	KillGraceS float64 `toml:"kill_grace_s"`
}

// DefaultKillGraceS is every runner's default kill_grace_s.
const DefaultKillGraceS = 5

// Log is the [log] section.
type Log struct {
	// Level is trace, debug, info, warn or error.
	Level string `toml:"level"`
	// Format is auto (console on a terminal, JSON otherwise), json or console.
	Format string `toml:"format"`
}

// Metrics is the [metrics] section: nymph never listens, so it writes its
// metrics to a file for node_exporter's textfile collector to read.
type Metrics struct {
	// Textfile is the file written, in the Prometheus text format, every
	// IntervalS seconds and once more at shutdown, replaced atomically; its
	// name must end in ".prom". Empty writes none.
	Textfile  string  `toml:"textfile"`
	IntervalS float64 `toml:"interval_s"`
}

// MetricsSuffix is the ending node_exporter's textfile collector requires.
const MetricsSuffix = ".prom"

// Default returns the configuration of an empty file.
func Default() Config {
	return Config{
		Daemon: Daemon{MachineID: "auto", Tags: []string{}, Lanes: []string{}},
		Poll:   Poll{WaitMaxS: 20, RetryMinS: 1, RetryMaxS: 60},
		Runtime: Runtime{
			MaxInvocations:           0,
			DefaultRunner:            "process",
			Runners:                  []string{"process"},
			Workdir:                  "~/.nymph/work",
			KeepAliveS:               -1,
			ShutdownGraceS:           30,
			AutoUpdateCheckIntervalS: 3600,
			MaxProcs:                 1,
			TimerSlackUS:             1000,
		},
		Identity: Identity{KeyFile: "~/.nymph/identity.key"},
		Log:      Log{Level: "info", Format: "auto"},
		Metrics:  Metrics{IntervalS: 5},
		Runners: Runners{
			Process: ProcessRunner{KillGraceS: DefaultKillGraceS},
			Python:  PythonRunner{Python: "python3", KillGraceS: DefaultKillGraceS},
			Docker:  DockerRunner{CLI: "docker", GlobalArgs: []string{}, RunArgs: []string{}, Shell: "/bin/sh", KillGraceS: DefaultKillGraceS},
			Gvisor: GvisorRunner{Runsc: "runsc", GlobalArgs: []string{}, ContainerGlobalArgs: []string{},
				ContainerRunArgs: []string{}, KillGraceS: DefaultKillGraceS},
			Slurm: SlurmRunner{SrunArgs: []string{}, Env: []string{}, KillGraceS: DefaultKillGraceS},
		},
	}
}

// Load reads and validates the file at path. `~` expands to the current
// user's home directory; relative file paths are taken relative to the
// directory of the file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	home, _ := os.UserHomeDir()
	return Parse(path, data, home)
}

// Parse decodes and validates data as if read from path, expanding `~` to
// home. Every problem found is reported, joined with errors.Join.
func Parse(path string, data []byte, home string) (*Config, error) {
	c := Default()
	c.Path = path
	r := reader{path: path}
	keys := mirror(reflect.TypeFor[Config]())
	md, err := toml.Decode(string(data), keys.Addr().Interface())
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	r.assign(&md, nil, keys, reflect.ValueOf(&c).Elem())
	r.unknown(append(md.Undecoded(), caseVariants(&md)...))
	r.validate(&c)
	if len(r.errs) > 0 {
		return nil, errors.Join(r.errs...)
	}
	base := filepath.Dir(path)
	c.Server.TokenFile = resolvePath(c.Server.TokenFile, home, base)
	c.Server.CAFile = resolvePath(c.Server.CAFile, home, base)
	c.Runtime.Workdir = resolvePath(c.Runtime.Workdir, home, base)
	c.Identity.KeyFile = resolvePath(c.Identity.KeyFile, home, base)
	c.Identity.EnrollTokenFile = resolvePath(c.Identity.EnrollTokenFile, home, base)
	c.Metrics.Textfile = resolvePath(c.Metrics.Textfile, home, base)
	rn := &c.Runners
	rn.Python.Python = resolveBin(rn.Python.Python, home, base)
	rn.Docker.CLI = resolveBin(rn.Docker.CLI, home, base)
	rn.Gvisor.Runsc = resolveBin(rn.Gvisor.Runsc, home, base)
	rn.Gvisor.CLI = resolveBin(rn.Gvisor.CLI, home, base)
	rn.Gvisor.StateRoot = resolvePath(rn.Gvisor.StateRoot, home, base)
	rn.Slurm.BinDir = resolvePath(rn.Slurm.BinDir, home, base)
	r.checkFiles(&c)
	if len(r.errs) > 0 {
		return nil, errors.Join(r.errs...)
	}
	c.Warnings = r.warnings
	return &c, nil
}

// ResolveQueue applies the queue override: a non-empty flag wins, then a
// non-empty environment value, then the file's [daemon] queue.
func (c *Config) ResolveQueue(flag, env string) {
	switch {
	case flag != "":
		c.Daemon.Queue = flag
	case env != "":
		c.Daemon.Queue = env
	}
}

// ExpandHome replaces a leading "~" or "~/" with home.
func ExpandHome(p, home string) string {
	if p == "~" {
		return home
	}
	if strings.HasPrefix(p, "~/") {
		return filepath.Join(home, p[2:])
	}
	return p
}

func resolvePath(p, home, base string) string {
	if p == "" {
		return ""
	}
	p = ExpandHome(p, home)
	if !filepath.IsAbs(p) {
		p = filepath.Join(base, p)
	}
	return filepath.Clean(p)
}

// resolveBin resolves an executable like a file path when it names one (it
// holds a '/' or starts with "~"); a bare name stays for a PATH lookup.
func resolveBin(p, home, base string) string {
	if p == "" || (!strings.Contains(p, "/") && !strings.HasPrefix(p, "~")) {
		return p
	}
	return resolvePath(p, home, base)
}

// reader decodes the file key by key, collecting every problem it meets.
type reader struct {
	path     string
	errs     []error
	warnings []string
}

func (r *reader) fail(key, format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf("config %s: %s: %s", r.path, key, fmt.Sprintf(format, args...)))
}

func (r *reader) warn(key, format string, args ...any) {
	r.warnings = append(r.warnings, fmt.Sprintf("config %s: %s: %s", r.path, key, fmt.Sprintf(format, args...)))
}

// tableName and keyName are how messages name a table and a key in one:
// "[runners.docker]", "[runners.docker] cli".
func tableName(k toml.Key) string { return "[" + strings.Join(k, ".") + "]" }
func keyName(k toml.Key) string   { return tableName(k[:len(k)-1]) + " " + k[len(k)-1] }

// mirror returns a new struct holding a toml.Primitive for each tagged
// field of the struct type t, in key order. Decoding a table into it marks
// only t's keys as decoded (the others stay in MetaData.Undecoded) and
// holds each value back to be decoded on its own.
func mirror(t reflect.Type) reflect.Value {
	var fields []reflect.StructField
	for f := range t.Fields() {
		if f.Tag.Get("toml") != "-" {
			fields = append(fields, reflect.StructField{Name: f.Name, Type: reflect.TypeFor[toml.Primitive](), Tag: f.Tag})
		}
	}
	slices.SortFunc(fields, func(a, b reflect.StructField) int { return strings.Compare(a.Tag.Get("toml"), b.Tag.Get("toml")) })
	return reflect.New(reflect.StructOf(fields)).Elem()
}

// assign decodes every value the file has in keys (a mirror of dst, the
// table at key table) into its field of dst, one at a time, so that a
// wrong type on one key does not hide the problems of the others.
func (r *reader) assign(md *toml.MetaData, table toml.Key, keys, dst reflect.Value) {
	for i := range keys.NumField() {
		k := keys.Type().Field(i)
		if keys.Field(i).IsZero() {
			continue // not in the file
		}
		p := keys.Field(i).Interface().(toml.Primitive)
		key := append(slices.Clip(table), k.Tag.Get("toml"))
		if !md.IsDefined(key...) {
			continue // matched only by a differently cased key: caseVariants reports it
		}
		if v := caseVariantOf(md, key); v != "" {
			// The library filled the field from either spelling, at random.
			r.fail(keyName(key), "given again as %q (keys are case-sensitive): keep one", v)
			continue
		}
		f := dst.FieldByName(k.Name)
		if f.Kind() == reflect.Struct {
			sub := mirror(f.Type())
			if err := md.PrimitiveDecode(p, sub.Addr().Interface()); err != nil {
				what := "a table"
				if f.Type() == reflect.TypeFor[Runners]() {
					what = "a table of [runners.<kind>] tables"
				}
				r.fail(tableName(key), "must be %s, got %s", what, typeName(value(md, p)))
				continue
			}
			r.assign(md, key, sub, f)
			continue
		}
		v := reflect.New(f.Type()).Elem()
		err := md.PrimitiveDecode(p, v.Addr().Interface())
		raw := value(md, p)
		n, isInt := raw.(int64)
		switch {
		case err == nil && v.Kind() == reflect.Int && n != int64(int32(n)):
			r.fail(keyName(key), "%d is out of range", n)
		case err == nil:
			f.Set(v)
		case v.Kind() == reflect.Float64 && isInt:
			// toml refuses integers a float64 cannot hold exactly; nymph
			// has always taken them rounded.
			f.SetFloat(float64(n))
		default:
			r.fail(keyName(key), "%s", mismatch(v.Kind(), raw))
		}
	}
}

// unknown warns of the keys nothing decoded, each named by its outermost
// unknown part: [extra] for a key of [extra.a], [server] sub for one of
// [server.sub].
func (r *reader) unknown(keys []toml.Key) {
	slices.SortFunc(keys, slices.Compare)
	var last toml.Key
	for _, k := range keys {
		t, n := reflect.TypeFor[Config](), 1
		for ; n < len(k); n++ {
			f, ok := fieldByKey(t, k[n-1])
			if !ok || f.Type.Kind() != reflect.Struct {
				break
			}
			t = f.Type
		}
		if k = k[:n]; slices.Equal(k, last) {
			continue
		}
		last = k
		switch t {
		case reflect.TypeFor[Config]():
			r.warn(tableName(k), "unknown section, ignored")
		case reflect.TypeFor[Runners]():
			r.warn(tableName(k), "unknown runner kind (known: %s), ignored", strings.Join(messages.RunnerKinds, ", "))
		default:
			r.warn(keyName(k), "unknown key, ignored")
		}
	}
}

// caseVariants lists the keys of the file that the TOML library matched to a
// field although they are spelled in another case ("URL" for "url"): keys
// are case-sensitive in nymph's config, so such a key is unknown, as it
// always was.
func caseVariants(md *toml.MetaData) []toml.Key {
	var out []toml.Key
	for _, k := range md.Keys() {
		t := reflect.TypeFor[Config]()
		for n, seg := range k {
			f, ok := fieldByKey(t, seg)
			if !ok {
				if slices.ContainsFunc(slices.Collect(t.Fields()), func(f reflect.StructField) bool {
					return strings.EqualFold(f.Tag.Get("toml"), seg)
				}) {
					out = append(out, k[:n+1])
				}
				break
			}
			if f.Type.Kind() != reflect.Struct {
				break
			}
			t = f.Type
		}
	}
	return out
}

// caseVariantOf is a sibling of key in the file spelled like it but for case.
func caseVariantOf(md *toml.MetaData, key toml.Key) string {
	last := key[len(key)-1]
	for _, k := range md.Keys() {
		if len(k) == len(key) && slices.Equal(k[:len(k)-1], key[:len(key)-1]) && k[len(k)-1] != last && strings.EqualFold(k[len(k)-1], last) {
			return k[len(k)-1]
		}
	}
	return ""
}

func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for f := range t.Fields() {
		if f.Tag.Get("toml") == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func (r *reader) validate(c *Config) {
	if c.Server.URL == "" {
		r.fail("[server] url", "is required")
	} else if u, err := url.Parse(c.Server.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		r.fail("[server] url", "must be an http:// or https:// URL with a host, got %q", c.Server.URL)
	}
	if strings.TrimSpace(c.Daemon.MachineID) == "" {
		r.fail("[daemon] machine_id", "must not be empty (use \"auto\" for the hostname)")
	}
	for i, tag := range c.Daemon.Tags {
		if strings.TrimSpace(tag) == "" {
			r.fail("[daemon] tags", "entry %d is empty", i)
		}
	}
	for i, lane := range c.Daemon.Lanes {
		if strings.TrimSpace(lane) == "" {
			r.fail("[daemon] lanes", "entry %d is empty", i)
		}
	}
	if c.Poll.WaitMaxS <= 0 {
		r.fail("[poll] wait_max_s", "must be > 0, got %v", c.Poll.WaitMaxS)
	}
	if c.Poll.RetryMinS <= 0 {
		r.fail("[poll] retry_min_s", "must be > 0, got %v", c.Poll.RetryMinS)
	}
	if c.Poll.RetryMaxS < c.Poll.RetryMinS {
		r.fail("[poll] retry_max_s", "must be >= retry_min_s (%v), got %v", c.Poll.RetryMinS, c.Poll.RetryMaxS)
	}
	if c.Runtime.MaxInvocations < 0 {
		r.fail("[runtime] max_invocations", "must be >= 0 (0 is unbounded), got %d", c.Runtime.MaxInvocations)
	}
	if len(c.Runtime.Runners) == 0 {
		r.fail("[runtime] runners", "must list at least one runner kind")
	}
	for _, k := range c.Runtime.Runners {
		if !slices.Contains(messages.RunnerKinds, k) {
			r.fail("[runtime] runners", "unknown runner kind %q (known: %s)", k, strings.Join(messages.RunnerKinds, ", "))
		}
	}
	if !slices.Contains(messages.RunnerKinds, c.Runtime.DefaultRunner) {
		r.fail("[runtime] default_runner", "unknown runner kind %q (known: %s)", c.Runtime.DefaultRunner, strings.Join(messages.RunnerKinds, ", "))
	} else if !slices.Contains(c.Runtime.Runners, c.Runtime.DefaultRunner) {
		r.fail("[runtime] default_runner", "%q is not in [runtime] runners", c.Runtime.DefaultRunner)
	}
	if strings.TrimSpace(c.Runtime.Workdir) == "" {
		r.fail("[runtime] workdir", "must not be empty")
	}
	if c.Runtime.KeepAliveS < -1 {
		r.fail("[runtime] keep_alive_s", "must be -1 (never exit on idle), 0 (exit after the first job) or a number of seconds, got %d", c.Runtime.KeepAliveS)
	}
	if c.Runtime.MaxProcs < 0 {
		r.fail("[runtime] max_procs", "must be 0 (one per CPU) or a number of processors, got %d", c.Runtime.MaxProcs)
	}
	if c.Runtime.TimerSlackUS < 0 || c.Runtime.TimerSlackUS > 1_000_000 {
		r.fail("[runtime] timer_slack_us", "must be 0 (the kernel's) or a number of microseconds up to 1000000, got %d", c.Runtime.TimerSlackUS)
	}
	if c.Runtime.ShutdownGraceS < 0 {
		r.fail("[runtime] shutdown_grace_s", "must be >= 0, got %v", c.Runtime.ShutdownGraceS)
	}
	if c.Runtime.AutoUpdateCheckIntervalS <= 0 {
		r.fail("[runtime] auto_update_check_interval_s", "must be > 0, got %d", c.Runtime.AutoUpdateCheckIntervalS)
	}
	if c.Identity.Enabled && strings.TrimSpace(c.Identity.KeyFile) == "" {
		r.fail("[identity] key_file", "is required when [identity] enabled = true")
	}
	if !c.Identity.Enabled && c.Identity.EnrollTokenFile != "" {
		r.warnings = append(r.warnings, fmt.Sprintf("config %s: [identity] enroll_token_file: set while [identity] enabled is false; ignored (requests carry the bearer only)", r.path))
	}
	r.validateRunners(&c.Runners)
	if t := c.Metrics.Textfile; t != "" && !strings.HasSuffix(t, MetricsSuffix) {
		r.fail("[metrics] textfile", "must end in %q: node_exporter's textfile collector reads only *%s files, got %q", MetricsSuffix, MetricsSuffix, t)
	} else if t != "" && strings.TrimSuffix(filepath.Base(t), MetricsSuffix) == "" {
		r.fail("[metrics] textfile", "must name a file before %q, got %q", MetricsSuffix, t)
	}
	if c.Metrics.IntervalS < 1 {
		r.fail("[metrics] interval_s", "must be >= 1 second, got %v", c.Metrics.IntervalS)
	}
	if !slices.Contains([]string{"trace", "debug", "info", "warn", "error"}, c.Log.Level) {
		r.fail("[log] level", "must be one of trace, debug, info, warn, error, got %q", c.Log.Level)
	}
	if !slices.Contains([]string{"auto", "json", "console"}, c.Log.Format) {
		r.fail("[log] format", "must be one of auto, json, console, got %q", c.Log.Format)
	}
}

func (r *reader) validateRunners(rn *Runners) {
	for _, g := range []struct {
		kind string
		s    float64
	}{
		{"process", rn.Process.KillGraceS}, {"python", rn.Python.KillGraceS}, {"docker", rn.Docker.KillGraceS},
		{"gvisor", rn.Gvisor.KillGraceS}, {"slurm", rn.Slurm.KillGraceS},
	} {
		if g.s <= 0 || g.s > 3600 {
			r.fail("[runners."+g.kind+"] kill_grace_s", "must be > 0 and <= 3600 seconds, got %v", g.s)
		}
	}
	for _, b := range []struct{ key, v string }{
		{"[runners.python] python", rn.Python.Python},
		{"[runners.docker] cli", rn.Docker.CLI},
		{"[runners.docker] shell", rn.Docker.Shell},
		{"[runners.gvisor] runsc", rn.Gvisor.Runsc},
	} {
		if strings.TrimSpace(b.v) == "" {
			r.fail(b.key, "must not be empty")
		}
	}
	if rn.Gvisor.CLI == "" && (len(rn.Gvisor.ContainerGlobalArgs) > 0 || len(rn.Gvisor.ContainerRunArgs) > 0) {
		r.fail("[runners.gvisor] cli", "is required when container_global_args or container_run_args is set")
	}
	for _, l := range []struct {
		key  string
		args []string
	}{
		{"[runners.docker] global_args", rn.Docker.GlobalArgs},
		{"[runners.docker] run_args", rn.Docker.RunArgs},
		{"[runners.gvisor] global_args", rn.Gvisor.GlobalArgs},
		{"[runners.gvisor] container_global_args", rn.Gvisor.ContainerGlobalArgs},
		{"[runners.gvisor] container_run_args", rn.Gvisor.ContainerRunArgs},
		{"[runners.slurm] srun_args", rn.Slurm.SrunArgs},
	} {
		for i, a := range l.args {
			if a == "" || strings.ContainsRune(a, 0) {
				r.fail(l.key, "entry %d must be a non-empty argument without NUL bytes, got %q", i, a)
			}
		}
	}
	for i, e := range rn.Slurm.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t\n") || strings.ContainsRune(e, 0) {
			r.fail("[runners.slurm] env", "entry %d must be KEY=VALUE, got %q", i, e)
		}
	}
}

// checkFiles reports files that must already exist but cannot be read,
// and paths that must differ but resolve to the same file.
func (r *reader) checkFiles(c *Config) {
	if id := c.Identity; id.Enabled && id.EnrollTokenFile != "" && id.EnrollTokenFile == id.KeyFile {
		r.fail("[identity] enroll_token_file", "must not be the key_file (%s)", id.KeyFile)
	}
	for _, f := range []struct{ key, path string }{
		{"[server] token_file", c.Server.TokenFile},
		{"[server] ca_file", c.Server.CAFile},
	} {
		if f.path == "" {
			continue
		}
		if fh, err := os.Open(f.path); err != nil {
			r.fail(f.key, "cannot read %s: %v", f.path, errors.Unwrap(err))
		} else {
			_ = fh.Close()
		}
	}
}

// value is p as decoded without a destination type, for messages.
func value(md *toml.MetaData, p toml.Primitive) any {
	var v any
	_ = md.PrimitiveDecode(p, &v)
	return v
}

// mismatch says why v did not decode into a field of kind k.
func mismatch(k reflect.Kind, v any) string {
	switch k {
	case reflect.String:
		return "must be a string, got " + typeName(v)
	case reflect.Int:
		return "must be an integer, got " + typeName(v)
	case reflect.Bool:
		return "must be true or false, got " + typeName(v)
	case reflect.Float64:
		return "must be a number, got " + typeName(v)
	}
	list, ok := v.([]any)
	if !ok {
		return "must be a list of strings, got " + typeName(v)
	}
	for i, e := range list {
		if _, ok := e.(string); !ok {
			return fmt.Sprintf("entry %d must be a string, got %s", i, typeName(e))
		}
	}
	return fmt.Sprintf("cannot hold %s", typeName(v))
}

func typeName(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("string %q", v)
	case int64:
		return fmt.Sprintf("integer %d", v)
	case float64:
		return fmt.Sprintf("float %v", v)
	case bool:
		return fmt.Sprintf("boolean %v", v)
	case []any:
		return "a list"
	case map[string]any:
		return "a table"
	default:
		return fmt.Sprintf("%T", v)
	}
}
