package realparts

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// timed starts a part with start and logs how long that took, then gives
// the test a context that ends after timeout.
func timed[T any](t *testing.T, name string, start func(testing.TB) T, timeout time.Duration) (T, context.Context) {
	t.Helper()
	t.Parallel()
	t0 := time.Now()
	part := start(t)
	t.Logf("%s took %s", name, time.Since(t0))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return part, ctx
}

func TestStartSSHD(t *testing.T) {
	s, ctx := timed(t, "StartSSHD", StartSSHD, 30*time.Second)
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
	s, ctx := timed(t, "StartSlurm", StartSlurm, 60*time.Second)
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
	p, ctx := timed(t, "StartPostgres", StartPostgres, 30*time.Second)
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
	image, ctx := timed(t, "PodmanImage", PodmanImage, 60*time.Second)
	t.Logf("image %s", image)

	args := append(PodmanArgs(), "--rm", image, "echo", "hello from podman")
	out, err := exec.CommandContext(ctx, "podman", args...).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hello from podman" {
		t.Fatalf("podman %v: %q, %v", args, out, err)
	}
}

func TestRunsc(t *testing.T) {
	runsc, ctx := timed(t, "Runsc", Runsc, 60*time.Second)
	out, err := exec.CommandContext(ctx, runsc, "--network=none", "do", "/bin/echo", "hello from gvisor").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hello from gvisor" {
		t.Fatalf("runsc do echo: %q, %v", out, err)
	}
}

// TestSlurmClustersAreIndependentAndCleanedUp runs two clusters at once,
// leaves a job running in one, and checks that the cluster's cleanup
// killed the job's task along with slurmstepd and the daemons.
func TestSlurmClustersAreIndependentAndCleanedUp(t *testing.T) {
	t.Parallel()
	var leftover []int
	var marker string
	t.Run("two clusters", func(t *testing.T) {
		a, b := StartSlurm(t), StartSlurm(t)
		if a.ConfPath == b.ConfPath || a.ClusterName == b.ClusterName {
			t.Fatalf("clusters share a config: %s %s", a.ConfPath, b.ConfPath)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		// Started like code under test would: without the instance's
		// marker, so only slurmstepd's ancestry ties the task to a.
		job := exec.CommandContext(ctx, "srun", "--job-name=left-running", "sleep", "600")
		job.Env = append(os.Environ(), a.Env()...)
		if err := job.Start(); err != nil {
			t.Fatalf("srun sleep: %v", err)
		}
		t.Cleanup(func() { _ = job.Wait() })
		// Cluster b must not see cluster a's job.
		err := poll(30*time.Second, 50*time.Millisecond, nil, func() error {
			out, err := a.Command(ctx, "squeue", "-h", "-t", "RUNNING", "-o", "%j").Output()
			if err != nil || strings.TrimSpace(string(out)) != "left-running" {
				return fmt.Errorf("%w: squeue on a: %q %v", errNotYet, out, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if out, err := b.Command(ctx, "squeue", "-h", "-o", "%j").Output(); err != nil || strings.TrimSpace(string(out)) != "" {
			t.Fatalf("squeue on b: %q, %v (want no jobs)", out, err)
		}
		if out, err := b.Command(ctx, "srun", "true").CombinedOutput(); err != nil {
			t.Fatalf("srun on b while a is busy: %v: %s", err, out)
		}
		leftover = a.fam.members(nil)
		marker = a.fam.marker
		for _, pid := range leftover {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sleep" {
				return
			}
		}
		t.Fatalf("the running job's task is not among the cluster's processes %v", leftover)
	})
	if len(leftover) == 0 {
		return
	}
	for _, pid := range leftover {
		if _, state, ok := procStat(pid); ok && state != 'Z' {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			t.Errorf("process %d (%s) of the cluster outlived its test", pid, strings.TrimSpace(string(comm)))
		}
	}
	if left := (&family{marker: marker}).members(nil); len(left) > 0 {
		t.Errorf("processes carrying the cluster's marker outlived its test: %v", left)
	}
}

func TestStartMoto(t *testing.T) {
	m, ctx := timed(t, "StartMoto", func(t testing.TB) *Moto { return StartMoto(t) }, 30*time.Second)
	// DescribeRegions over the EC2 query protocol, unsigned: moto answers
	// it, which is all StartMoto promises.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.URL+"/", strings.NewReader("Action=DescribeRegions&Version=2016-11-15"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=test/20260101/"+m.Region+"/ec2/aws4_request, SignedHeaders=host, Signature=0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("moto DescribeRegions: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), m.Region) {
		t.Fatalf("moto DescribeRegions: %s: %s", resp.Status, body)
	}
}
