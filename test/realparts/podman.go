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

// PodmanCLI is PodmanGlobalArgs behind "podman": the --cli of a podman
// provider on these machines.
func PodmanCLI() string {
	return strings.Join(append([]string{"podman"}, PodmanGlobalArgs()...), " ")
}

// PodmanRunArgs returns the `podman run` flags that work here: no network
// (none is reachable anyway) and explicit rlimits, because the inherited
// ones are rejected by the runtime.
func PodmanRunArgs() []string {
	return append([]string{"--network=none"}, PodmanLimitArgs()...)
}

// PodmanLimitArgs returns the `podman run` rlimit flags alone, for a
// container that keeps another network (a podman provider's daemons run on
// the host network).
func PodmanLimitArgs() []string {
	return []string{"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}
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
	return podmanImage(t, imageRepo, imageLayout, nil, "/bin/true")
}

// bashImageLayout and bashImageRepo are PodmanBashImage's counterparts of
// imageLayout and imageRepo.
const (
	bashImageLayout = "busybox-bash-v1"
	bashImageRepo   = "localhost/realparts-busybox-bash"
)

// PodmanBashImage returns the name of PodmanImage's busybox root plus the
// host's bash (/bin/bash, which /usr/bin/bash also reaches) and the shared
// libraries ldd names for it, at their host paths: an image that runs a
// rendered bootstrap (bash, busybox wget, sha256sum) without a registry.
// Like PodmanImage it is built once per machine, under the same lock, with
// a tag derived from every file it holds.
func PodmanBashImage(t testing.TB) string {
	t.Helper()
	tools := RequireTool(t, "bash", "ldd")
	bash, ldd := tools[0], tools[1]
	out, err := exec.Command(ldd, bash).Output()
	if err != nil {
		t.Fatalf("realparts: ldd %s: %v", bash, err)
	}
	extra := []rootFile{{name: "bin/bash", host: bash}}
	for _, lib := range lddPaths(string(out)) {
		extra = append(extra, rootFile{name: strings.TrimPrefix(lib, "/"), host: lib})
	}
	return podmanImage(t, bashImageRepo, bashImageLayout, extra, "bash", "-c", "echo ok")
}

// lddPaths returns the absolute library paths in ldd's output: the target
// of each "name => /path (addr)" line and the loader's own "/path (addr)"
// line; the vdso has no file and is skipped.
func lddPaths(out string) []string {
	var paths []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			paths = append(paths, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			paths = append(paths, f[0])
		}
	}
	return paths
}

// rootFile is a host file copied into an image: name is its path in the
// image (no leading slash), host the file read (symlinks followed).
type rootFile struct{ name, host string }

// podmanImage builds (once per machine) and returns repo:tag, the busybox
// root plus extra, proven to run probe.
func podmanImage(t testing.TB, repo, layout string, extra []rootFile, probe ...string) string {
	t.Helper()
	RequireRoot(t)
	tools := RequireTool(t, "podman", "runc", "busybox")
	podman, busybox := tools[0], tools[2]
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatalf("realparts: read busybox: %v", err)
	}
	h := sha256.New()
	h.Write(bb)
	h.Write([]byte(layout))
	for _, f := range extra {
		body, err := os.ReadFile(f.host)
		if err != nil {
			t.Fatalf("realparts: read %s: %v", f.host, err)
		}
		fmt.Fprintf(h, "\x00%s\x00%d\x00", f.name, len(body))
		h.Write(body)
	}
	image := repo + ":" + hex.EncodeToString(h.Sum(nil)[:6])

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
	if err := buildImage(ctx, podman, busybox, image, extra); err != nil {
		t.Fatalf("realparts: build %s: %v", image, err)
	}
	// Prove the image runs with these flags before anyone relies on it.
	args := append(append(PodmanArgs(), "--rm", image), probe...)
	if out, err := exec.CommandContext(ctx, podman, args...).CombinedOutput(); err != nil {
		t.Fatalf("realparts: podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return image
}

func buildImage(ctx context.Context, podman, busybox, image string, extra []rootFile) error {
	applets, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(writeBusyboxTar(pw, busybox, strings.Fields(string(applets)), extra))
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
// applet, the usual empty top-level directories, and extra (each with the
// directories above it that the busybox root lacks).
func writeBusyboxTar(w io.Writer, busybox string, applets []string, extra []rootFile) error {
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
		if a == "bash" && len(extra) > 0 {
			continue // the real bash is among extra
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: mtime}); err != nil {
			return err
		}
	}
	dirs := map[string]bool{"bin": true, "dev": true, "etc": true, "proc": true, "root": true, "sys": true, "tmp": true, "usr": true, "var": true}
	for _, f := range extra {
		if err := writeRootFile(tw, f, dirs, mtime); err != nil {
			return err
		}
	}
	return tw.Close()
}

// writeRootFile adds f to tw, first the directories above it not yet in
// dirs.
func writeRootFile(tw *tar.Writer, f rootFile, dirs map[string]bool, mtime time.Time) error {
	parts := strings.Split(filepath.Dir(f.name), "/")
	for i := range parts {
		d := strings.Join(parts[:i+1], "/")
		if d == "." || dirs[d] {
			continue
		}
		dirs[d] = true
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime}); err != nil {
			return err
		}
	}
	body, err := os.ReadFile(f.host)
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o755, Size: int64(len(body)), ModTime: mtime}); err != nil {
		return err
	}
	_, err = tw.Write(body)
	return err
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
