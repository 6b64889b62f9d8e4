package realparts

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// SSHD is a private OpenSSH server on 127.0.0.1 that accepts the generated
// client key for every local user (root included) and nothing else.
type SSHD struct {
	// Alias is the Host entry in ConfigPath and MuxConfigPath.
	Alias string
	// ConfigPath is an ssh_config file: `ssh -F ConfigPath Alias true`
	// works without prompts (BatchMode, pinned host key, IdentityFile).
	ConfigPath string
	// MuxConfigPath is ConfigPath plus ControlMaster auto, ControlPersist
	// 60 and a ControlPath in Dir, so repeated commands reuse one
	// connection. Call ControlMaster first: a master that ssh forks by
	// itself (ControlPersist) keeps the first caller's stderr open, and
	// exec.Cmd.Output/CombinedOutput then wait for it to exit.
	MuxConfigPath string
	// Host and Port are where sshd listens.
	Host string
	Port int
	// User is the login user written into the configs (the current user).
	User string
	// IdentityFile is the client private key; KnownHostsFile pins the
	// server's host key under the name Alias.
	IdentityFile   string
	KnownHostsFile string
	// Dir holds keys, configs, sockets and sshd.log.
	Dir string

	fam     *family
	sshPath string

	masterOnce sync.Once
	masterErr  error
}

// StartSSHD starts a private sshd and returns once it answers with an SSH
// banner. It needs root (sshd's privilege separation) and the sshd, ssh
// and ssh-keygen binaries.
func StartSSHD(t testing.TB) *SSHD {
	t.Helper()
	RequireRoot(t)
	tools := RequireTool(t, "sshd", "ssh", "ssh-keygen")
	sshdPath, keygen := tools[0], tools[2]
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatalf("realparts: sshd privilege separation dir: %v", err)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatalf("realparts: current user: %v", err)
	}
	dir := privateDir(t, "sshd")
	s := &SSHD{
		Alias:          "realparts-sshd",
		ConfigPath:     filepath.Join(dir, "ssh_config"),
		MuxConfigPath:  filepath.Join(dir, "ssh_config_mux"),
		Host:           "127.0.0.1",
		User:           me.Username,
		IdentityFile:   filepath.Join(dir, "id_ed25519"),
		KnownHostsFile: filepath.Join(dir, "known_hosts"),
		Dir:            dir,
		fam:            newFamily(t),
		sshPath:        tools[1],
	}
	hostKey := filepath.Join(dir, "host_ed25519")
	for _, key := range []string{hostKey, s.IdentityFile} {
		out, err := exec.Command(keygen, "-q", "-t", "ed25519", "-N", "", "-C", "realparts", "-f", key).CombinedOutput()
		if err != nil {
			t.Fatalf("realparts: ssh-keygen %s: %v: %s", key, err, out)
		}
	}
	hostPub, err := os.ReadFile(hostKey + ".pub")
	if err != nil {
		t.Fatalf("realparts: %v", err)
	}
	clientPub, err := os.ReadFile(s.IdentityFile + ".pub")
	if err != nil {
		t.Fatalf("realparts: %v", err)
	}
	authKeys := filepath.Join(dir, "authorized_keys")
	mustWrite(t, authKeys, string(clientPub), 0o644)
	// HostKeyAlias pins the key to the alias, not to host:port, so the
	// known_hosts entry survives a port retry.
	mustWrite(t, s.KnownHostsFile, s.Alias+" "+string(hostPub), 0o644)

	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("realparts: %v", err)
		}
		s.Port = port
		serverCfg := filepath.Join(dir, "sshd_config")
		mustWrite(t, serverCfg, strings.Join([]string{
			"Port " + strconv.Itoa(port),
			"ListenAddress 127.0.0.1",
			"HostKey " + hostKey,
			"PidFile " + filepath.Join(dir, "sshd.pid"),
			"AuthorizedKeysFile " + authKeys,
			// The keys live in a temp dir whose modes sshd would reject.
			"StrictModes no",
			// No PAM on these hosts; key-only logins, root included.
			"UsePAM no",
			"PermitRootLogin prohibit-password",
			"PubkeyAuthentication yes",
			"PasswordAuthentication no",
			"KbdInteractiveAuthentication no",
			"PrintMotd no",
			"PrintLastLog no",
			"UseDNS no",
			"AcceptEnv NYMPH_* LANG LC_*",
			// Debian's bash sources ~/.bashrc for a top-level shell run by
			// sshd, and root's .bashrc on these machines spends hundreds of
			// milliseconds in pyenv init. Starting the session one level
			// deep skips it, so latency measures ssh, not a dotfile.
			"SetEnv SHLVL=1",
			// Benchmarks open many connections and multiplexed sessions.
			"MaxStartups 200",
			"MaxSessions 200",
			"LogLevel ERROR",
			"Subsystem sftp internal-sftp",
		}, "\n")+"\n", 0o644)
		s.writeClientConfigs(t)

		c, err := s.fam.start("sshd", exec.Command(sshdPath, "-D", "-e", "-f", serverCfg), filepath.Join(dir, "sshd.log"))
		if err != nil {
			t.Fatalf("realparts: %v", err)
		}
		addr := net.JoinHostPort(s.Host, strconv.Itoa(port))
		lastErr = poll(10*time.Second, 10*time.Millisecond, []*child{c}, func() error { return sshBanner(addr) })
		if lastErr == nil {
			return s
		}
		// Most likely the port was taken between freePort and bind.
		s.fam.kill()
	}
	t.Fatalf("realparts: sshd did not start: %v", lastErr)
	return nil
}

func (s *SSHD) writeClientConfigs(t testing.TB) {
	t.Helper()
	base := []string{
		"Host " + s.Alias,
		"  HostName " + s.Host,
		"  Port " + strconv.Itoa(s.Port),
		"  User " + s.User,
		"  IdentityFile " + s.IdentityFile,
		"  IdentitiesOnly yes",
		"  UserKnownHostsFile " + s.KnownHostsFile,
		"  GlobalKnownHostsFile /dev/null",
		"  HostKeyAlias " + s.Alias,
		"  StrictHostKeyChecking yes",
		"  BatchMode yes",
		"  ConnectTimeout 10",
		"  LogLevel ERROR",
	}
	mustWrite(t, s.ConfigPath, strings.Join(base, "\n")+"\n", 0o644)
	mux := append(append([]string(nil), base...),
		"  ControlMaster auto",
		"  ControlPath "+s.controlPath(),
		"  ControlPersist 60",
	)
	mustWrite(t, s.MuxConfigPath, strings.Join(mux, "\n")+"\n", 0o644)
}

// Command returns `ssh -F ConfigPath Alias args...`. Its environment
// carries the instance's marker, so anything it leaves behind is killed
// with the server.
func (s *SSHD) Command(ctx context.Context, args ...string) *exec.Cmd {
	return s.command(ctx, s.ConfigPath, args)
}

// ControlMaster starts (once per instance) a ControlMaster connection
// owned by the instance, waits until it accepts sessions, and returns
// MuxConfigPath. Commands over MuxConfigPath then skip the handshake.
func (s *SSHD) ControlMaster(t testing.TB) string {
	t.Helper()
	s.masterOnce.Do(func() {
		cmd := exec.Command(s.sshPath, "-F", s.MuxConfigPath, "-M", "-N", "-o", "ControlPersist=no", s.Alias)
		c, err := s.fam.start("ssh-master", cmd, filepath.Join(s.Dir, "ssh-master.log"))
		if err != nil {
			s.masterErr = err
			return
		}
		s.masterErr = poll(15*time.Second, 10*time.Millisecond, []*child{c}, func() error {
			check := exec.Command(s.sshPath, "-F", s.MuxConfigPath, "-O", "check", s.Alias)
			if out, err := check.CombinedOutput(); err != nil {
				return fmt.Errorf("%w: ssh -O check: %v: %s", errNotYet, err, out)
			}
			return nil
		})
	})
	if s.masterErr != nil {
		t.Fatalf("realparts: ssh ControlMaster: %v", s.masterErr)
	}
	return s.MuxConfigPath
}

// MuxCommand is Command over MuxConfigPath, for latency benchmarks; call
// ControlMaster first. Without a master it still works, as a plain
// connection, because it never forks a persistent master of its own.
func (s *SSHD) MuxCommand(ctx context.Context, args ...string) *exec.Cmd {
	return s.command(ctx, s.MuxConfigPath, append([]string{"-o", "ControlPersist=no"}, args...))
}

func (s *SSHD) command(ctx context.Context, cfg string, args []string) *exec.Cmd {
	// Options must precede the destination; args may start with -o.
	var opts []string
	for len(args) >= 2 && args[0] == "-o" {
		opts = append(opts, args[0], args[1])
		args = args[2:]
	}
	argv := append(append([]string{"-F", cfg}, opts...), s.Alias)
	cmd := exec.CommandContext(ctx, s.sshPath, append(argv, args...)...)
	cmd.Env = s.fam.env()
	return cmd
}

func (s *SSHD) controlPath() string { return filepath.Join(s.Dir, "cm") }

// sshBanner succeeds once addr accepts a connection and greets with SSH-.
func sshBanner(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return fmt.Errorf("%w: dial %s: %v", errNotYet, addr, err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "SSH-") {
		return fmt.Errorf("%w: banner from %s: %q %v", errNotYet, addr, line, err)
	}
	return nil
}

func mustWrite(t testing.TB, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatalf("realparts: write %s: %v", path, err)
	}
}
