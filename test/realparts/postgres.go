package realparts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// pgBinDirs are where Debian and upstream packages keep initdb and pg_ctl,
// which are not on $PATH on Debian.
var pgBinDirs = []string{"/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin"}

// Postgres is a private PostgreSQL server on 127.0.0.1 with trust
// authentication, owned by the postgres OS user, with fsync off (the data
// is thrown away with the test).
type Postgres struct {
	// DSN is postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable,
	// usable by pgx and psql.
	DSN  string
	Host string
	Port int
	// User and Database are the superuser and the default database.
	User     string
	Database string
	// SocketDir holds the unix socket; DataDir the cluster; Dir also holds
	// postgres.log.
	SocketDir string
	DataDir   string
	Dir       string

	binDir string
}

// StartPostgres initialises and starts a private PostgreSQL server and
// returns once it accepts connections (about a second). It needs root
// (initdb refuses root, so it runs as the postgres user via runuser).
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	RequireRoot(t)
	runuser := RequireTool(t, "runuser")[0]
	binDir := ""
	for _, d := range pgBinDirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			binDir = d
			break
		}
	}
	if binDir == "" {
		Unavailable(t, "PostgreSQL server binaries not found in %v", pgBinDirs)
		return nil
	}
	pgUser, err := user.Lookup("postgres")
	if err != nil {
		Unavailable(t, "postgres OS user: %v", err)
		return nil
	}
	uid, _ := strconv.Atoi(pgUser.Uid)
	gid, _ := strconv.Atoi(pgUser.Gid)

	dir := privateDir(t, "pg")
	p := &Postgres{
		Host:      "127.0.0.1",
		User:      "postgres",
		Database:  "postgres",
		SocketDir: filepath.Join(dir, "sock"),
		DataDir:   filepath.Join(dir, "data"),
		Dir:       dir,
		binDir:    binDir,
	}
	if err := os.Mkdir(p.SocketDir, 0o755); err != nil {
		t.Fatalf("realparts: %v", err)
	}
	if err := chownTree(dir, uid, gid); err != nil {
		t.Fatalf("realparts: chown %s: %v", dir, err)
	}
	fam := newFamily(t)
	asPostgres := func(ctx context.Context, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, runuser, append([]string{"-u", "postgres", "--"}, args...)...)
		cmd.Env = fam.env()
		cmd.Dir = dir
		return cmd
	}
	initCtx, cancelInit := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelInit()
	template, err := pgTemplate(initCtx, asPostgres, binDir, uid, gid)
	if err != nil {
		t.Fatalf("realparts: %v", err)
	}
	if out, err := exec.CommandContext(initCtx, "cp", "-a", template, p.DataDir).CombinedOutput(); err != nil {
		t.Fatalf("realparts: copy template cluster: %v\n%s", err, out)
	}
	// Registered after newFamily, so it runs before the family's kill: a
	// clean stop releases the server's shared memory.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = asPostgres(ctx, filepath.Join(binDir, "pg_ctl"), "-D", p.DataDir, "-m", "immediate", "-w", "-t", "10", "stop").Run()
	})

	logPath := filepath.Join(dir, "postgres.log")
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("realparts: %v", err)
		}
		opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", port, p.SocketDir)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		out, err := asPostgres(ctx, filepath.Join(binDir, "pg_ctl"), "-D", p.DataDir, "-l", logPath, "-o", opts, "-w", "-t", "60", "start").CombinedOutput()
		cancel()
		if err == nil {
			p.Port = port
			p.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
			return p
		}
		lastErr = fmt.Errorf("pg_ctl start: %v: %s\n--- postgres.log ---\n%s", err, out, tailFile(logPath, 2000))
	}
	t.Fatalf("realparts: postgres did not start: %v", lastErr)
	return nil
}

// Psql returns a psql command connected to the server as the superuser,
// with -X (no ~/.psqlrc) and ON_ERROR_STOP.
func (p *Postgres) Psql(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "psql", append([]string{"-X", "-v", "ON_ERROR_STOP=1", p.DSN}, args...)...)
}

// pgTemplate returns a freshly initialised data directory to copy, made
// once per machine and PostgreSQL build: initdb costs a second or more
// per test, a copy tens of milliseconds.
func pgTemplate(ctx context.Context, asPostgres func(context.Context, ...string) *exec.Cmd, binDir string, uid, gid int) (string, error) {
	initdb := filepath.Join(binDir, "initdb")
	st, err := os.Stat(initdb)
	if err != nil {
		return "", fmt.Errorf("initdb: %w", err)
	}
	args := []string{"-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"}
	key := sha256.Sum256(fmt.Appendf(nil, "%s %d %d %v", initdb, st.Size(), st.ModTime().UnixNano(), args))
	base := os.TempDir()
	dir := filepath.Join(base, "realparts-pgdata-"+hex.EncodeToString(key[:6]))
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		return dir, nil
	}
	unlock, err := lockFile(filepath.Join(base, "realparts-pgdata.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		return dir, nil // made by another test binary while we waited
	}
	work, err := os.MkdirTemp(base, "realparts-pgdata-new")
	if err != nil {
		return "", fmt.Errorf("template cluster: %w", err)
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o755); err != nil {
		return "", fmt.Errorf("template cluster: %w", err)
	}
	if err := os.Chown(work, uid, gid); err != nil {
		return "", fmt.Errorf("template cluster: %w", err)
	}
	data := filepath.Join(work, "data")
	if out, err := asPostgres(ctx, append([]string{initdb, "-D", data}, args...)...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %w\n%s", err, out)
	}
	// Rename is atomic: readers see a complete cluster or none.
	if err := os.Rename(data, dir); err != nil {
		return "", fmt.Errorf("template cluster: %w", err)
	}
	return dir, nil
}
