package providers

import (
	"context"
	"fmt"
	"os"

	"github.com/rs/zerolog"
)

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
