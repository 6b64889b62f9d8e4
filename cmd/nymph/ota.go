package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"nymph/actors/ota"
	"nymph/buildinfo"
	"nymph/config"
	"nymph/daemon/selfupdate"
	"nymph/daemon/workdirlock"
	"nymph/dist"
)

// sidecarTimeout bounds reading a release's .sha256 for auto-update.
const sidecarTimeout = 30 * time.Second

// otaWiring builds the updater and the OTA actor's dependencies. Downloads
// trust the server's CA file, and carry the daemon's bearer only to the
// server itself.
func otaWiring(cfg *config.Config, grace time.Duration, log zerolog.Logger) (*selfupdate.Updater, *ota.Deps, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.Server.CAFile != "" {
		pem, err := os.ReadFile(cfg.Server.CAFile)
		if err != nil {
			return nil, nil, fmt.Errorf("[server] ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("[server] ca_file: %s holds no PEM certificate", cfg.Server.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	var bearer string
	if cfg.Server.TokenFile != "" {
		b, err := os.ReadFile(cfg.Server.TokenFile)
		if err != nil {
			return nil, nil, fmt.Errorf("[server] token_file: %w", err)
		}
		bearer = strings.TrimSpace(string(b))
	}
	updater := selfupdate.New(log, selfupdate.Options{HTTPClient: &http.Client{Transport: tr}, Bearer: bearer, ServerURL: cfg.Server.URL})
	// The release triple is this binary's own architecture: that is what an
	// exec of the download must run on.
	triple, err := dist.TripleForArch(runtime.GOARCH)
	if err != nil && cfg.Runtime.AutoUpdate {
		log.Warn().Err(err).Msg("auto_update: no release triple for this machine; it will not update itself")
	}
	sidecars := &http.Client{Transport: tr, Timeout: sidecarTimeout}
	return updater, &ota.Deps{
		Settings: ota.Settings{
			Version:       buildinfo.Version,
			Grace:         grace,
			AutoUpdate:    cfg.Runtime.AutoUpdate,
			CheckInterval: time.Duration(cfg.Runtime.AutoUpdateCheckIntervalS) * time.Second,
			ServerURL:     cfg.Server.URL,
			Triple:        triple,
		},
		Installer: updater,
		Checksum: func(ctx context.Context, binaryURL string) (string, error) {
			return dist.FetchChecksum(ctx, sidecars, binaryURL)
		},
		State: ota.NewState(),
		Log:   log.With().Str("actor", ota.Name).Logger(),
	}, nil
}

// handOff runs once the daemon has drained and the outbox is flushed: when
// the OTA actor installed a new binary for an exec, it replaces this process
// with it (same PID, original arguments) and does not return. A signal
// received meanwhile wins: the operator asked for a stop, so the process
// exits and the new binary runs at the next start. An exec that fails
// returns the error, for the service manager to start the new binary. The
// workdir lock is handed to the new image through the exec, so no other
// daemon can take the workdir in between.
func handOff(updater *selfupdate.Updater, st *ota.State, signalled bool, lock *workdirlock.Lock, log zerolog.Logger) error {
	inst, ok := st.Handoff()
	if !ok {
		return nil
	}
	if signalled {
		log.Info().Str("version", inst.Version).Msg("stopped by a signal while draining for an update; the new binary runs at the next start")
		return nil
	}
	log.Info().Str("version", inst.Version).Str("path", inst.Path).Msg("drained: exec the new binary")
	restore, err := lock.InheritOnExec()
	if err != nil {
		return fmt.Errorf("ota handoff: %w", err)
	}
	err = updater.Exec()
	restore()
	log.Error().Err(err).Msg("exec of the new binary failed; exiting for the service manager to start it")
	return fmt.Errorf("ota handoff: %w", err)
}

var _ ota.Installer = (*selfupdate.Updater)(nil)
