package realparts

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// extraToolDirs are searched after $PATH, because a non-login root shell or
// a developer's PATH often lacks the sbin directories where sshd, slurmd
// and munged live.
var extraToolDirs = []string{"/usr/local/sbin", "/usr/sbin", "/sbin"}

// InCI reports whether the tests run under CI, where an unavailable real
// component is a failure instead of a skip.
func InCI() bool { return os.Getenv("CI") == "true" }

// Unavailable skips the test on a developer machine and fails it under CI.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("%s (CI=true: real components must not be skipped; run test/infra/install.sh)", msg)
	}
	t.Skipf("%s (install with test/infra/install.sh)", msg)
}

// RequireTool resolves each named binary (a bare name searched in $PATH and
// the sbin directories, or an absolute path) and returns their absolute
// paths in the same order. A missing one skips the test, or fails it when
// CI=true.
func RequireTool(t testing.TB, names ...string) []string {
	t.Helper()
	paths := make([]string, 0, len(names))
	var missing []string
	for _, name := range names {
		p, err := lookTool(name)
		if err != nil {
			missing = append(missing, name)
			continue
		}
		paths = append(paths, p)
	}
	if len(missing) > 0 {
		Unavailable(t, "required tools not found: %v", missing)
	}
	return paths
}

// RequireRoot skips the test unless it runs as root, or fails it when
// CI=true.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "test needs root (uid %d)", os.Geteuid())
	}
}

func lookTool(name string) (string, error) {
	if filepath.IsAbs(name) {
		st, err := os.Stat(name)
		if err != nil {
			return "", fmt.Errorf("tool %s: %w", name, err)
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("tool %s: not an executable file", name)
		}
		return name, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return filepath.Abs(p)
	}
	for _, dir := range extraToolDirs {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("tool %s: not found in PATH or %v", name, extraToolDirs)
}
