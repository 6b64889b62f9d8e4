package cli_test

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/localdaemon"
)

// nobodyUID is the account the other user's daemon runs as.
const nobodyUID = 65534

// localNymphs is a program named like no other process on the machine (a
// copy of bash), so `daemon stop` in a test finds only what the test
// started, never the nymphs of anyone else working here.
type localNymphs struct {
	name, bin string
}

func newLocalNymphs(t *testing.T) localNymphs {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("bash not found")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "nymph-stop-" + hex.EncodeToString(b)
	// Another user must be able to run it: a directory of its own, 0755.
	dir, err := os.MkdirTemp("", "nymph-stop-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(bash)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, name)
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return localNymphs{name: name, bin: bin}
}

// start runs one as uid (-1: this process's) and waits until it is ready;
// exited is closed once it has been reaped.
func (l localNymphs) start(t *testing.T, uid int) (pid int, exited <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(l.bin, "-c", "echo ready; read x", "run", "--config", "/etc/nymph/test.toml")
	if uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		// Ends it by closing its input: no signal to a pid that may have
		// been reaped already.
		stdin.Close()
		<-done
	})
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("fake nymph said %q, %v", line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return cmd.Process.Pid, done
}

// `daemon stop` stops the caller's own nymphs and leaves other users'
// alone, naming them; --all stops those too.
func TestStopOnlyYourOwnUnlessAll(t *testing.T) {
	if os.Getuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI runs as root, which this test needs to start another user's process")
		}
		t.Skip("needs root to start a process as another user")
	}
	l := newLocalNymphs(t)
	mine, mineExited := l.start(t, -1)
	theirs, theirsExited := l.start(t, nobodyUID)
	o := runOpts{procName: l.name}

	r := runCLI(t, o, map[string]string{}, "daemon", "stop", "--timeout", "30")
	if r.code != 0 {
		t.Fatalf("stop: %+v", r)
	}
	<-mineExited
	if !strings.Contains(r.stdout, fmt.Sprintf("stopped nymph pid %d", mine)) || strings.Contains(r.stdout, fmt.Sprint(theirs)) {
		t.Fatalf("stop said:\n%s", r.stdout)
	}
	if want := fmt.Sprintf("lakeshore: left running, not yours: pid %d (user nobody); --all stops them too", theirs); !strings.Contains(r.stderr, want) {
		t.Fatalf("stop stderr %q, want %q", r.stderr, want)
	}
	select {
	case <-theirsExited:
		t.Fatal("the other user's nymph was stopped")
	default:
	}

	// Nothing of ours is left: said so, and the other one still named.
	r = runCLI(t, o, map[string]string{}, "daemon", "stop", "--json")
	var res []localdaemon.StopResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 || len(res) != 0 ||
		!strings.Contains(r.stderr, "no nymph of yours running") || !strings.Contains(r.stderr, fmt.Sprintf("pid %d (user nobody)", theirs)) {
		t.Fatalf("second stop: %v %+v", err, r)
	}

	if r := runCLI(t, o, map[string]string{}, "daemon", "stop", "--all", "123"); r.code != cli.ExitUsage {
		t.Fatalf("--all with a pid: %+v", r)
	}
	r = runCLI(t, o, map[string]string{}, "daemon", "stop", "--all", "--timeout", "30")
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("stopped nymph pid %d", theirs)) || strings.Contains(r.stderr, "left running") {
		t.Fatalf("stop --all: %+v", r)
	}
	<-theirsExited
}
