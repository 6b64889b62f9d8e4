package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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
	bin := filepath.Join(t.TempDir(), "lakeshore")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "version")
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
