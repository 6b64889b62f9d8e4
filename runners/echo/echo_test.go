package echo_test

import (
	"testing"

	"nymph/runners"
	"nymph/runners/echo"
	"nymph/runners/runnertest"
)

func TestConformance(t *testing.T) {
	runnertest.Run(t, func(*testing.T) runners.Runner { return echo.New() }, runnertest.Caps{Echo: true})
}
