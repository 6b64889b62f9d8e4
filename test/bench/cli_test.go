//go:build bench

package bench

import (
	"os/exec"
	"path/filepath"
	"testing"

	"nymph/test/harness"
)

// cliStartRows prints what a one-shot verb pays before it reaches the
// network: the start of the operator CLI, and of lakeshore-server (which
// links the control plane), against a bare bash spawn. The CLI's share of
// the `daemon exec` round trip is its start plus about a millisecond.
func cliStartRows(t *testing.T, rep *report, cp *harness.ControlPlane, b base) {
	t.Helper()
	cli := cp.Bins.Lakeshore
	server := filepath.Join(filepath.Dir(cli), "lakeshore-server")
	for _, c := range []struct{ name, bin string }{
		{"lakeshore version (the CLI's start)", cli},
		{"lakeshore-server version", server},
	} {
		d := timeN(t, 100, func() error { return exec.Command(c.bin, "version").Run() })
		rep.add(c.name, ms(d), "bash spawn "+ms(b.bash), float64(d)/float64(b.bash), "", nil)
	}
}
