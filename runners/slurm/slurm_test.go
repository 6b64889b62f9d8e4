package slurm_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/runnertest"
	"nymph/runners/slurm"
	"nymph/test/realparts"
)

func newRunner(t *testing.T, cluster *realparts.Slurm) *slurm.Runner {
	return slurm.New(zerolog.New(zerolog.NewTestWriter(t)),
		slurm.WithEnv(cluster.Env()...),
		slurm.WithSrunArgs("--partition="+cluster.Partition),
		slurm.WithKillGrace(500*time.Millisecond))
}

func TestConformance(t *testing.T) {
	cluster := realparts.StartSlurm(t)
	runnertest.Run(t, func(t *testing.T) runners.Runner { return newRunner(t, cluster) },
		// Ten, not twenty: the one-node test cluster runs two jobs at a time and
		// starts queued ones in waves about a second apart.
		runnertest.Caps{Script: true, HostPIDs: true, Concurrency: 10})
}

func TestRunsAsNamedJob(t *testing.T) {
	cluster := realparts.StartSlurm(t)
	spec := runners.Spec{
		InvocationID: "named-job",
		ScratchDir:   t.TempDir(),
		Script:       "printf '%s %s' \"$SLURM_JOB_NAME\" \"$SLURM_JOB_PARTITION\" > \"$NYMPH_RESULT_PATH\"\n",
	}
	out, err := newRunner(t, cluster).Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	want := slurm.JobName("named-job") + " " + cluster.Partition
	if out.State != messages.StateSucceeded || string(out.Result) != want {
		t.Fatalf("outcome %+v result %q, want %q", out, out.Result, want)
	}
}

func TestTimeoutLeavesNoJob(t *testing.T) {
	runTimeout(t, realparts.StartSlurm(t))
}

func runTimeout(t *testing.T, cluster *realparts.Slurm) {
	spec := runners.Spec{
		InvocationID: "timeout-job",
		ScratchDir:   t.TempDir(),
		Script:       "sleep 1000\n",
		Timeout:      time.Second,
	}
	out, err := newRunner(t, cluster).Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != messages.StateKilled || out.Error.Type != runners.ErrorTypeTimeout {
		t.Fatalf("outcome %+v", out)
	}
	q, err := cluster.Command(context.Background(), "squeue", "--noheader", "--name="+slurm.JobName("timeout-job")).CombinedOutput()
	if err != nil {
		t.Fatalf("squeue: %v %s", err, q)
	}
	if strings.TrimSpace(string(q)) != "" {
		t.Fatalf("job still listed: %s", q)
	}
}
