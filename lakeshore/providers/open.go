package providers

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/rs/zerolog"
)

// Validate checks that s names a kind and carries that kind's settings,
// valid; the error names the flag to fix.
func (s Spec) Validate() error {
	switch s.Kind {
	case KindEC2:
		if s.EC2 == nil {
			return errors.New("ec2 provider without ec2 settings")
		}
		return s.EC2.Validate()
	case KindPodman:
		if s.Podman == nil {
			return errors.New("podman provider without podman settings")
		}
		return s.Podman.Validate()
	case KindScript:
		if s.Script == nil {
			return errors.New("script provider without script settings")
		}
		return s.Script.Validate()
	}
	return fmt.Errorf("unknown provider kind %q: use ec2, podman or script", s.Kind)
}

// Open validates spec and returns its launcher. dir is a private
// directory for the launcher's files ("" makes one under the system's
// temporary directory); it is created 0700 when missing.
func Open(ctx context.Context, spec Spec, dir string, log zerolog.Logger) (Launcher, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	log = log.With().Str("provider", spec.Name).Str("kind", string(spec.Kind)).Logger()
	switch spec.Kind {
	case KindEC2:
		return NewEC2(ctx, spec.Name, *spec.EC2, log)
	case KindPodman:
		if dir == "" {
			d, err := os.MkdirTemp("", "lakeshore-podman-")
			if err != nil {
				return nil, fmt.Errorf("podman provider %q: %w", spec.Name, err)
			}
			dir = d
		} else if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("podman provider %q: %w", spec.Name, err)
		}
		return NewPodman(spec.Name, *spec.Podman, dir, log)
	default:
		return NewScript(spec.Name, *spec.Script, log)
	}
}
