package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"nymph/actors"
	"nymph/actors/poller"
	"nymph/buildinfo"
	"nymph/config"
	"nymph/hostinfo"
	"nymph/identity"
	"nymph/messages"
	"nymph/outbox"
	"nymph/runners"
	"nymph/runners/docker"
	"nymph/runners/echo"
	"nymph/runners/gvisor"
	"nymph/runners/process"
	"nymph/runners/python"
	"nymph/runners/slurm"
	"nymph/uplink"
)

// outboxFlush bounds the last attempt to post pending results at exit;
// what is left stays in the workdir for the next start.
const outboxFlush = 10 * time.Second

func runDaemon(ctx context.Context, configPath, queueFlag string) error {
	cfg, err := config.Load(configPath)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	cfg.ResolveQueue(queueFlag, os.Getenv(config.EnvQueue))
	log := newLogger(cfg.Log.Level, cfg.Log.Format, os.Stderr)
	for _, w := range cfg.Warnings {
		log.Warn().Msg(w)
	}
	if err := os.MkdirAll(cfg.Runtime.Workdir, 0o755); err != nil {
		return &exitError{code: exitUsage, err: fmt.Errorf("[runtime] workdir: %w", err)}
	}

	probe := hostinfo.New()
	machineID, err := probe.MachineID(cfg.Daemon.MachineID)
	if err != nil {
		return &exitError{code: exitFailed, err: err}
	}
	registry := runnerRegistry(cfg.Runtime.Runners, log)
	kinds := slices.Sorted(maps.Keys(registry))
	reprobe := func(context.Context) messages.Capabilities {
		return probe.Capabilities(ordered(cfg.Runtime.Runners, kinds), cfg.Runtime.MaxInvocations, cfg.Runtime.Workdir)
	}
	versions := probe.Versions(ctx, buildinfo.Version)
	hello := messages.HelloRequest{
		MachineID:    machineID,
		Label:        cfg.Daemon.Label,
		Tags:         hostinfo.Tags(cfg.Daemon.Tags, versions),
		Lanes:        cfg.Daemon.Lanes,
		Capabilities: reprobe(ctx),
		Versions:     versions,
	}

	opts := []uplink.Option{}
	if cfg.Server.TokenFile != "" {
		opts = append(opts, uplink.WithTokenFile(cfg.Server.TokenFile))
	}
	if cfg.Server.CAFile != "" {
		opts = append(opts, uplink.WithCAFile(cfg.Server.CAFile))
	}
	if cfg.Identity.Enabled {
		key, created, err := identity.LoadOrCreate(cfg.Identity.KeyFile)
		if err != nil {
			return &exitError{code: exitUsage, err: fmt.Errorf("[identity] key_file: %w", err)}
		}
		log.Info().Str("key_id", key.ID()).Bool("created", created).Msg("identity key loaded")
		hello.PublicKey = key.PublicKeyB64()
		opts = append(opts, uplink.WithSigner(key))
		if cfg.Identity.EnrollTokenFile != "" {
			if tok, err := os.ReadFile(cfg.Identity.EnrollTokenFile); err == nil {
				opts = append(opts, uplink.WithHelloToken(string(tok)))
			} else if !errors.Is(err, os.ErrNotExist) {
				return &exitError{code: exitUsage, err: fmt.Errorf("[identity] enroll_token_file: %w", err)}
			}
		}
	}
	client, err := uplink.New(cfg.Server.URL, opts...)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	box, err := outbox.Open(filepath.Join(cfg.Runtime.Workdir, "outbox"), client, log)
	if err != nil {
		return &exitError{code: exitFailed, err: err}
	}

	keepAlive := time.Duration(cfg.Runtime.KeepAliveS) * time.Second
	if cfg.Runtime.KeepAliveS < 0 {
		keepAlive = -1
	}
	settings := actors.Settings{
		Poll: poller.Settings{
			Hello:          hello,
			ProvisionalID:  hostinfo.ProvisionalWorkerID(machineID),
			Queue:          cfg.Daemon.Queue,
			WaitMax:        seconds(cfg.Poll.WaitMaxS),
			MaxInvocations: cfg.Runtime.MaxInvocations,
			KeepAlive:      keepAlive,
		},
		RetryMin:      seconds(cfg.Poll.RetryMinS),
		RetryMax:      seconds(cfg.Poll.RetryMaxS),
		Workdir:       cfg.Runtime.Workdir,
		DefaultRunner: cfg.Runtime.DefaultRunner,
	}
	d, err := actors.New(settings, actors.Deps{
		Server: client, Results: box, Runners: registry, Reprobe: reprobe, Log: log,
	})
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	log.Info().Str("version", buildinfo.Version).Str("server", cfg.Server.URL).Str("machine_id", machineID).
		Str("queue", cfg.Daemon.Queue).Strs("runners", hello.Capabilities.Runners).Msg("nymph starting")
	grace := seconds(cfg.Runtime.ShutdownGraceS)
	sigs := make(chan os.Signal, 3)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	if err := d.Start(); err != nil {
		return &exitError{code: exitFailed, err: err}
	}

	go func() {
		n := 0
		for {
			select {
			case s := <-sigs:
				n++
				switch n {
				case 1:
					log.Info().Str("signal", s.String()).Dur("grace", grace).Msg("stopping: running work gets the shutdown grace")
					d.Shutdown(grace)
				case 2:
					log.Warn().Str("signal", s.String()).Msg("second signal: stopping now")
					d.StopNow()
				default:
					log.Error().Str("signal", s.String()).Msg("third signal: exiting without reporting")
					os.Exit(exitFailed)
				}
			case <-d.Done():
				return
			}
		}
	}()

	runErr := d.Wait(context.Background())
	flushCtx, cancel := context.WithTimeout(context.Background(), outboxFlush)
	defer cancel()
	if err := box.Close(flushCtx); err != nil {
		log.Warn().Err(err).Msg("results left for the next start")
	}
	var rej *actors.RejectError
	switch {
	case errors.As(runErr, &rej):
		log.Error().Str("code", rej.Code).Str("message", rej.Message).Msg("the control plane rejected this daemon")
		return &exitError{code: exitRejected, err: runErr}
	case runErr != nil:
		log.Error().Err(runErr).Msg("daemon failed")
		return &exitError{code: exitFailed, err: runErr}
	}
	log.Info().Msg("nymph stopped")
	return nil
}

// runnerRegistry builds the configured runners this binary has.
func runnerRegistry(kinds []string, log zerolog.Logger) map[string]runners.Runner {
	out := map[string]runners.Runner{}
	for _, k := range kinds {
		switch k {
		case process.Kind:
			out[k] = process.New(log)
		case echo.Kind:
			out[k] = echo.New()
		case python.Kind:
			out[k] = python.New(log)
		case docker.Kind:
			out[k] = docker.New(log)
		case gvisor.Kind:
			out[k] = gvisor.New(log)
		case slurm.Kind:
			out[k] = slurm.New(log)
		}
	}
	// Setup scripts always run through the process runner.
	if _, ok := out[process.Kind]; !ok {
		out[process.Kind] = process.New(log)
	}
	return out
}

// ordered keeps the config's order of the kinds the registry has.
func ordered(configured, have []string) []string {
	var out []string
	for _, k := range configured {
		if slices.Contains(have, k) {
			out = append(out, k)
		}
	}
	return out
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// The implementations chosen here satisfy what the tree declares it needs.
var (
	_ actors.Server  = (*uplink.Client)(nil)
	_ actors.Results = (*outbox.Outbox)(nil)
	_ outbox.Poster  = (*uplink.Client)(nil)
	_ uplink.Signer  = (*identity.Key)(nil)
)
