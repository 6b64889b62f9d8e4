package slurm_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/runnertest"
	"nymph/runners/slurm"
	"nymph/test/realparts"
	"nymph/test/wait"
)

func newRunner(t *testing.T, cluster *realparts.Slurm, opts ...slurm.Option) *slurm.Runner {
	return slurm.New(zerolog.New(zerolog.NewTestWriter(t)), append([]slurm.Option{
		slurm.WithEnv(cluster.Env()...),
		slurm.WithSrunArgs("--partition=" + cluster.Partition),
		slurm.WithKillGrace(500 * time.Millisecond)}, opts...)...)
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
	out := runnertest.Outcome(t, newRunner(t, cluster), spec)
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
	out := runnertest.Outcome(t, newRunner(t, cluster), spec)
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

// jobs lists the cluster's jobs as "id|comment" lines.
func jobs(t *testing.T, cluster *realparts.Slurm) []string {
	t.Helper()
	out, err := cluster.Command(context.Background(), "squeue", "--noheader", "--format=%i|%k").CombinedOutput()
	if err != nil {
		t.Fatalf("squeue: %v %s", err, out)
	}
	return strings.Fields(string(out))
}

func TestReapLeftoversCancelsOnlyOwnJobs(t *testing.T) {
	cluster := realparts.StartSlurm(t)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	marker := "nymph-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	r := newRunner(t, cluster, slurm.WithOwner(marker))
	own := marker + "@" + host

	// What a killed daemon leaves: a job its runner started, and one whose
	// srun is gone (a batch job carries the same comment).
	run := runnertest.StartOwned(t, r, marker, runners.Spec{
		InvocationID: "reap-job", ScratchDir: t.TempDir(), Script: "sleep 1000\n",
	})
	// Submitted first: the one-node cluster runs two jobs at a time.
	var q []byte
	if !wait.Until(time.Minute, func() bool {
		var err error
		q, err = cluster.Command(context.Background(), "squeue", "--noheader", "--states=RUNNING",
			"--name="+slurm.JobName("reap-job"), "--format=%k").CombinedOutput()
		if err != nil {
			t.Fatalf("squeue: %v %s", err, q)
		}
		return strings.TrimSpace(string(q)) == own
	}) {
		t.Fatalf("job %s with comment %s not running after a minute (squeue: %q)", slurm.JobName("reap-job"), own, q)
	}

	sbatch := func(comment string) string {
		args := []string{"--parsable", "--job-name=reap-other", "--output=/dev/null", "--wrap=sleep 1000"}
		if comment != "" {
			args = append(args, "--comment="+comment)
		}
		b, err := cluster.Command(context.Background(), "sbatch", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("sbatch: %v %s", err, b)
		}
		return strings.TrimSpace(string(b))
	}
	sbatch(own)
	// Jobs of another daemon on this host, of the same workdir's daemon on
	// another host, and of no daemon.
	others := []string{sbatch(marker + "-other@" + host), sbatch(marker + "@elsewhere"), sbatch("")}

	n, err := r.ReapLeftovers(context.Background(), marker)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("cancelled %d jobs, want 2 (squeue: %v)", n, jobs(t, cluster))
	}
	out, runErr := run.Wait(t, time.Minute, "Run to return after its job was cancelled")
	if runErr != nil || out.State == messages.StateSucceeded {
		t.Fatalf("run of a cancelled job: outcome %+v error %v", out, runErr)
	}
	var listed []string
	if !wait.Until(time.Minute, func() bool {
		listed = jobs(t, cluster)
		return !slices.ContainsFunc(listed, func(l string) bool { return strings.HasSuffix(l, "|"+own) })
	}) {
		t.Fatalf("jobs with comment %s still listed after a minute: %v", own, listed)
	}
	for _, id := range others {
		if !slices.ContainsFunc(listed, func(l string) bool { return strings.HasPrefix(l, id+"|") }) {
			t.Fatalf("job %s of another owner is gone (squeue: %v)", id, listed)
		}
	}
	b, err := cluster.Command(context.Background(), "scancel", others...).CombinedOutput()
	if err != nil {
		t.Fatalf("scancel: %v %s", err, b)
	}
}

func TestReapLeftoversWithoutMarker(t *testing.T) {
	// No mark, no sweep: not even squeue is looked for.
	r := slurm.New(zerolog.Nop(), slurm.WithBinDir("/nonexistent"), slurm.WithOwner(""))
	if n, err := r.ReapLeftovers(context.Background(), ""); n != 0 || err != nil {
		t.Fatalf("ReapLeftovers with no marker = %d, %v", n, err)
	}
}
