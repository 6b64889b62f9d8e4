package main_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// initBudget bounds what one of the module's packages may allocate while
// it initialises. Every run of lakeshore pays for every package's init,
// the one-shot verbs (`daemon exec`, whose round trip is measured against
// ssh) included, so work done there belongs in a sync.Once at first use.
// Bytes are counted, not time: the count is the same on a busy machine.
const initBudget = 32 << 10

var initLine = regexp.MustCompile(`(?m)^init (nymph/\S+) @\S+ ms, \S+ ms clock, (\d+) bytes, (\d+) allocs$`)

func TestPackageInitsStaySmall(t *testing.T) {
	cmd := exec.Command(cliBinary(t), "version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("lakeshore version: %v\n%s", err, out)
	}
	found := initLine.FindAllStringSubmatch(string(out), -1)
	if len(found) == 0 {
		t.Fatalf("no init trace of the module's packages in:\n%s", out)
	}
	for _, m := range found {
		if n, _ := strconv.Atoi(m[2]); n > initBudget {
			t.Errorf("package %s allocates %d bytes (%s allocs) at init, over the %d budget: defer that work to first use",
				m[1], n, m[3], initBudget)
		}
	}
}

// serverOnly are packages only lakeshore-server may link: the control
// plane, its stores and what they pull in. Linked into the CLI, their init
// and their pages are paid by every one-shot verb (a `daemon exec` round
// trip is measured against ssh).
var serverOnly = []string{
	"nymph/lakeshore/servecli",
	"nymph/lakeshore/controlplane",
	"nymph/lakeshore/dashboard",
	"nymph/lakeshore/store",
	"nymph/lakeshore/blobs",
	"nymph/lakeshore/releases",
	"nymph/lakeshore/providers",
	"modernc.org/sqlite",
	"github.com/jackc/pgx",
	"github.com/aws/",
	"github.com/prometheus/",
}

// clipboard is what bubbles' line editor pulls in; the daemon picker has
// a filter line of its own instead.
const clipboard = "github.com/atotto/clipboard"

func TestTheCLILinksNoServerPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "nymph/lakeshore/cli") {
		t.Fatalf("go list -deps names no nymph/lakeshore/cli: %v", deps)
	}
	for _, dep := range deps {
		if dep == clipboard {
			t.Errorf("cmd/lakeshore links %s, whose init looks for a clipboard program in every $PATH directory at every start of lakeshore", dep)
		}
		for _, p := range serverOnly {
			if dep == p || strings.HasPrefix(dep, strings.TrimSuffix(p, "/")+"/") && dep != "nymph/lakeshore/providers/providerspec" {
				t.Errorf("cmd/lakeshore links %s, which only lakeshore-server may (see lakeshore/servecli); `go mod why -m` or `go list -deps` shows the path", dep)
			}
		}
	}
}
