package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"nymph/actors"
	"nymph/actors/keys"
	"nymph/config"
	"nymph/daemon/uplink"
	"nymph/identity"
	"nymph/messages"
)

// enrollTokenPrefix starts every enrollment token the control plane mints
// (lakeshore token create --enroll).
const enrollTokenPrefix = "dle_"

// identityWiring loads the daemon's key — or creates it on the first start
// — and returns the holder every request is signed through, with the
// uplink options that sign and enroll. Without [identity] enabled it
// returns nothing: requests then carry the bearer alone.
func identityWiring(cfg *config.Config, log zerolog.Logger) (*keys.Holder, []uplink.Option, error) {
	if !cfg.Identity.Enabled {
		return nil, nil, nil
	}
	key, created, err := identity.LoadOrCreate(cfg.Identity.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("[identity] key_file: %w", err)
	}
	msg := "identity key loaded"
	if created {
		msg = "identity key created"
	}
	log.Info().Str("key_id", key.ID()).Str("key_file", cfg.Identity.KeyFile).Msg(msg)
	holder := keys.NewHolder(key)
	opts := []uplink.Option{uplink.WithSigner(holder)}
	tok, err := readEnrollToken(cfg.Identity.EnrollTokenFile)
	if err != nil {
		return nil, nil, err
	}
	if tok != "" {
		// A key made just now cannot be enrolled: its first hello carries
		// the token. A loaded one most likely is, and says hello with its
		// signature alone, presenting the token only if that is refused.
		opts = append(opts, uplink.WithEnrollToken(tok, created))
	}
	return holder, opts, nil
}

// readEnrollToken reads [identity] enroll_token_file. A missing or empty
// file is no token: a daemon whose key is enrolled needs none.
func readEnrollToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("[identity] enroll_token_file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok != "" && !strings.HasPrefix(tok, enrollTokenPrefix) {
		return "", fmt.Errorf("[identity] enroll_token_file: %s does not hold an enrollment token (%s…); mint one with 'lakeshore token create --enroll'", path, enrollTokenPrefix)
	}
	return tok, nil
}

// keysChild adds the keys actor (rotate_key) to the tree, its rotations
// counted in jobs. Rotation retries with the poll's backoff bounds.
func keysChild(holder *keys.Holder, client *uplink.Client, cfg *config.Config, workerID func() string, jobs *sync.WaitGroup, log zerolog.Logger) actors.Option {
	d := &keys.Deps{
		Holder:    holder,
		KeyFile:   cfg.Identity.KeyFile,
		WorkerID:  workerID,
		Jobs:      jobs,
		Log:       log.With().Str("actor", keys.Name).Logger(),
		Retryable: uplink.Retryable,
		RetryMin:  seconds(cfg.Poll.RetryMinS),
		RetryMax:  seconds(cfg.Poll.RetryMaxS),
	}
	if holder != nil {
		d.Server = client
	}
	return actors.WithChild(keys.Name, keys.Props(d), messages.KindRotateKey)
}

// loggingServer is the uplink client with a log line for an enrollment,
// which only hello's answer tells.
type loggingServer struct {
	*uplink.Client
	log zerolog.Logger
}

func (s loggingServer) Hello(ctx context.Context, req *messages.HelloRequest) (*messages.HelloResponse, error) {
	resp, err := s.Client.Hello(ctx, req)
	if err == nil && resp.Reject == nil && resp.KeyID != nil {
		s.log.Info().Str("key_id", *resp.KeyID).Msg("identity key enrolled")
	}
	return resp, err
}

var (
	_ uplink.RotatingSigner = (*keys.Holder)(nil)
	_ keys.Server           = (*uplink.Client)(nil)
	_ actors.Server         = loggingServer{}
)
