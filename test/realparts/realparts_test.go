package realparts

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestStartSSHD(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := StartSSHD(t)
	t.Logf("StartSSHD took %s", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if out, err := s.Command(ctx, "true").CombinedOutput(); err != nil {
		t.Fatalf("ssh true: %v: %s", err, out)
	}
	out, err := s.Command(ctx, "echo", "hello over ssh").Output()
	if err != nil || strings.TrimSpace(string(out)) != "hello over ssh" {
		t.Fatalf("ssh echo: %q, %v", out, err)
	}
	s.ControlMaster(t)
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		if out, err := s.MuxCommand(ctx, "true").CombinedOutput(); err != nil {
			t.Fatalf("ssh (ControlMaster) true: %v: %s", err, out)
		}
		t.Logf("ssh over ControlMaster, call %d: %s", i, time.Since(t0))
	}
}

func TestStartSlurm(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := StartSlurm(t)
	t.Logf("StartSlurm took %s", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t0 := time.Now()
	out, err := s.Command(ctx, "srun", "hostname").CombinedOutput()
	if err != nil {
		t.Fatalf("srun hostname: %v: %s", err, out)
	}
	t.Logf("srun hostname took %s", time.Since(t0))
	if strings.TrimSpace(string(out)) == "" {
		t.Fatalf("srun hostname printed nothing")
	}
	// The node is the measured host; srun must have run on it.
	if got := strings.TrimSpace(string(out)); got != s.NodeName {
		t.Fatalf("srun hostname = %q, want node %q", got, s.NodeName)
	}
}

func TestStartPostgres(t *testing.T) {
	t.Parallel()
	start := time.Now()
	p := StartPostgres(t)
	t.Logf("StartPostgres took %s", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	out, err := p.Psql(ctx, "-At", "-c", "SELECT 1").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Fatalf("psql SELECT 1: %q, %v", out, err)
	}
	conn, err := pgx.Connect(ctx, p.DSN)
	if err != nil {
		t.Fatalf("pgx connect %s: %v", p.DSN, err)
	}
	defer conn.Close(ctx)
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("pgx SELECT 1: %d, %v", one, err)
	}
}

func TestPodmanImage(t *testing.T) {
	t.Parallel()
	start := time.Now()
	image := PodmanImage(t)
	t.Logf("PodmanImage took %s: %s", time.Since(start), image)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	args := append(PodmanArgs(), "--rm", image, "echo", "hello from podman")
	out, err := exec.CommandContext(ctx, "podman", args...).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hello from podman" {
		t.Fatalf("podman %v: %q, %v", args, out, err)
	}
}

func TestRunsc(t *testing.T) {
	t.Parallel()
	start := time.Now()
	runsc := Runsc(t)
	t.Logf("Runsc took %s", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	out, err := exec.CommandContext(ctx, runsc, "--network=none", "do", "/bin/echo", "hello from gvisor").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hello from gvisor" {
		t.Fatalf("runsc do echo: %q, %v", out, err)
	}
}
