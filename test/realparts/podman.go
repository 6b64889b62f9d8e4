package realparts

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// imageLayout is part of the image tag: change it whenever the layout
// written by writeBusyboxTar changes, so machines rebuild.
const imageLayout = "busybox-root-v1"

// imageRepo is the local-only name of the test image; nothing is pulled.
const imageRepo = "localhost/realparts-busybox"

// PodmanGlobalArgs returns the podman flags that work on these machines,
// to put before the subcommand: runc (crun fails here on hybrid cgroups
// and rlimits) with the cgroupfs manager (there is no systemd).
func PodmanGlobalArgs() []string {
	return []string{"--runtime", "runc", "--cgroup-manager", "cgroupfs"}
}

// PodmanRunArgs returns the `podman run` flags that work here: no network
// (none is reachable anyway) and explicit rlimits, because the inherited
// ones are rejected by the runtime.
func PodmanRunArgs() []string {
	return []string{"--network=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}
}

// PodmanArgs returns PodmanGlobalArgs, "run", PodmanRunArgs: append
// "--rm", the image and the command.
func PodmanArgs() []string {
	args := append(PodmanGlobalArgs(), "run")
	return append(args, PodmanRunArgs()...)
}

// PodmanImage returns the name of a tiny local image (busybox-static
// installed as /bin/sh and every applet under /bin) for `podman run`.
// It is built with `podman import` from a tarball on first use and
// reused afterwards on the whole machine: the tag is derived from the
// busybox binary and the layout, and a file lock serialises builders.
func PodmanImage(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	tools := RequireTool(t, "podman", "runc", "busybox")
	podman, busybox := tools[0], tools[2]
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatalf("realparts: read busybox: %v", err)
	}
	sum := sha256.Sum256(append(bb, imageLayout...))
	image := imageRepo + ":" + hex.EncodeToString(sum[:6])

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if exec.CommandContext(ctx, podman, "image", "exists", image).Run() == nil {
		return image
	}
	unlock, err := lockFile(filepath.Join(os.TempDir(), "realparts-podman-image.lock"))
	if err != nil {
		t.Fatalf("realparts: %v", err)
	}
	defer unlock()
	if exec.CommandContext(ctx, podman, "image", "exists", image).Run() == nil {
		return image // another test binary built it while we waited
	}
	if err := buildImage(ctx, podman, busybox, image); err != nil {
		t.Fatalf("realparts: build %s: %v", image, err)
	}
	// Prove the image runs with these flags before anyone relies on it.
	args := append(PodmanArgs(), "--rm", image, "/bin/true")
	if out, err := exec.CommandContext(ctx, podman, args...).CombinedOutput(); err != nil {
		t.Fatalf("realparts: podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return image
}

func buildImage(ctx context.Context, podman, busybox, image string) error {
	applets, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(writeBusyboxTar(pw, busybox, strings.Fields(string(applets))))
	}()
	cmd := exec.CommandContext(ctx, podman, "import",
		"--change", "ENV PATH=/bin:/usr/bin:/sbin:/usr/sbin",
		"--change", `CMD ["/bin/sh"]`,
		"-", image)
	cmd.Stdin = pr
	out, err := cmd.CombinedOutput()
	pr.Close()
	if err != nil {
		return fmt.Errorf("podman import: %w: %s", err, out)
	}
	return nil
}

// writeBusyboxTar writes a root filesystem: /bin/busybox, a symlink per
// applet, and the usual empty top-level directories.
func writeBusyboxTar(w io.Writer, busybox string, applets []string) error {
	tw := tar.NewWriter(w)
	mtime := time.Unix(0, 0)
	for _, d := range []string{"bin/", "dev/", "etc/", "proc/", "root/", "sys/", "tmp/", "usr/", "var/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: mtime}); err != nil {
			return err
		}
	}
	for _, l := range [][2]string{{"usr/bin", "../bin"}, {"sbin", "bin"}, {"usr/sbin", "../bin"}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: l[0], Linkname: l[1], Mode: 0o777, ModTime: mtime}); err != nil {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
	}
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: mtime}); err != nil {
			return err
		}
		if _, err := io.WriteString(tw, body); err != nil {
			return err
		}
	}
	f, err := os.Open(busybox)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: st.Size(), ModTime: mtime}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return err
	}
	for _, a := range applets {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: mtime}); err != nil {
			return err
		}
	}
	return tw.Close()
}

// lockFile takes an exclusive flock on path, shared by every process on
// the machine, and returns its release.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// Podman runs a podman subcommand with the flags that work here and returns
// its trimmed output; a failure fails t.
func Podman(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("podman", append(PodmanGlobalArgs(), args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}
