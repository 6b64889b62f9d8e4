package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"nymph/daemon/orphans"
	"nymph/test/harness"
	"nymph/test/wait"
)

// promFile is nymph's metrics textfile as node_exporter's textfile
// collector reads it: with the same parser.
type promFile map[string]*dto.MetricFamily

// readProm parses the file at path; nil while it is missing. A file that
// does not parse, or a family without HELP or TYPE, fails the test.
func readProm(t *testing.T, path string) promFile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s does not parse: %v\n%s", path, err, data)
	}
	for name, mf := range mfs {
		if !bytes.Contains(data, []byte("# HELP "+name+" ")) || !bytes.Contains(data, []byte("# TYPE "+name+" ")) ||
			mf.GetType() == dto.MetricType_UNTYPED {
			t.Fatalf("%s: %s lacks HELP or TYPE:\n%s", path, name, data)
		}
	}
	return mfs
}

// get is the value of family name's series with labels (pairs), or -1.
func (f promFile) get(name string, labels ...string) float64 {
	mf, ok := f[name]
	if !ok {
		return -1
	}
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				continue next
			}
		}
		if m.Counter != nil {
			return m.Counter.GetValue()
		}
		return m.Gauge.GetValue()
	}
	return -1
}

// A real nymph with [metrics] textfile: the file shows who it is, the
// execs an operator ran through a real control plane, the poll errors and
// the backoff while that control plane is down, and the recovery after.
func TestMetricsTextfile(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	dir := t.TempDir()
	path := filepath.Join(dir, "nymph.prom")
	d := cp.StartDaemon(t, harness.DaemonOptions{
		Label:     "metered",
		ExtraTOML: fmt.Sprintf("[metrics]\ntextfile = %q\ninterval_s = 1\n", path),
	})
	w := cp.WaitForWorker(t, "metered")
	var f promFile
	wait.For(t, 30*time.Second, "the file names the registered worker", func() bool {
		f = readProm(t, path)
		return f.get("nymph_daemon_info", "worker_id", w.ID, "label", "metered") == 1
	})
	if f.get("nymph_build_info") != 1 || f.get("nymph_jobs_finished_total", "kind", "exec", "outcome", "exit_zero") != 0 {
		t.Fatalf("a fresh daemon's file:\n%v", f)
	}

	if r := cp.CLI(t, "daemon", "exec", "metered", "echo counted"); r.Code != 0 {
		t.Fatalf("exec: %+v", r)
	}
	if r := cp.CLI(t, "daemon", "exec", "metered", "exit 3"); r.Code != 3 {
		t.Fatalf("exec exit 3: %+v", r)
	}
	wait.For(t, 30*time.Second, "the file shows both execs finished", func() bool {
		f = readProm(t, path)
		return f.get("nymph_jobs_finished_total", "kind", "exec", "outcome", "exit_zero") == 1 &&
			f.get("nymph_jobs_finished_total", "kind", "exec", "outcome", "exit_nonzero") == 1 &&
			f.get("nymph_jobs_running", "kind", "exec") == 0
	})
	if f.get("nymph_last_successful_poll_timestamp_seconds") <= 0 || f.get("nymph_poll_errors_total") != 0 ||
		f.get("nymph_poll_backoff_seconds") != 0 {
		t.Fatalf("a healthy daemon's poll metrics: errors %v, backoff %v, last %v", f.get("nymph_poll_errors_total"),
			f.get("nymph_poll_backoff_seconds"), f.get("nymph_last_successful_poll_timestamp_seconds"))
	}

	cp.Kill()
	wait.For(t, 30*time.Second, "poll errors and a backoff while the control plane is down", func() bool {
		f = readProm(t, path)
		return f.get("nymph_poll_errors_total") >= 2 && f.get("nymph_poll_backoff_seconds") > 0
	})
	lastOK := f.get("nymph_last_successful_poll_timestamp_seconds")

	cp.Restart()
	// The first request that succeeds ends the backoff; an exec answers
	// the held poll at once.
	if r := cp.CLI(t, "daemon", "exec", "metered", "echo back"); r.Code != 0 {
		t.Fatalf("exec after the restart: %+v", r)
	}
	wait.For(t, 60*time.Second, "the backoff over once the control plane is back", func() bool {
		f = readProm(t, path)
		return f.get("nymph_poll_backoff_seconds") == 0 && f.get("nymph_last_successful_poll_timestamp_seconds") > lastOK &&
			f.get("nymph_jobs_finished_total", "kind", "exec", "outcome", "exit_zero") == 2
	})

	d.Signal(syscall.SIGTERM)
	select {
	case <-d.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("nymph did not stop:\n%s", d.Log())
	}
	if code := d.ExitCode(); code != 0 {
		t.Fatalf("nymph exited %d:\n%s", code, d.Log())
	}
	f = readProm(t, path)
	if f.get("nymph_jobs_finished_total", "kind", "exec", "outcome", "exit_zero") != 2 || f.get("nymph_outbox_pending") != 0 {
		t.Fatalf("the file after shutdown:\n%v", f)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("after shutdown the textfile directory holds %v", names)
	}
}

// A textfile whose directory cannot be written is logged once, nymph runs
// on (execs still run), and the file appears once the directory can be
// written: the writer kept trying.
func TestMetricsTextfileUnwritableKeepsRunning(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	// A path under a regular file: no write can succeed, even as root.
	dir := filepath.Join(t.TempDir(), "textfile")
	if err := os.WriteFile(dir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "nymph.prom")
	d := cp.StartDaemon(t, harness.DaemonOptions{
		Label:     "unmetered",
		ExtraTOML: fmt.Sprintf("[metrics]\ntextfile = %q\ninterval_s = 1\n", path),
	})
	const failed, again = "metrics textfile not written", "metrics textfile written again"
	wait.For(t, 30*time.Second, "the write error logged", func() bool { return strings.Contains(d.Log(), failed) })
	for i := range 3 {
		if r := cp.CLI(t, "daemon", "exec", "unmetered", fmt.Sprintf("echo run %d", i)); r.Code != 0 {
			t.Fatalf("exec: %+v", r)
		}
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the file written once the directory is there", func() bool {
		f := readProm(t, path)
		return f != nil && f.get("nymph_jobs_finished_total", "kind", "exec", "outcome", "exit_zero") == 3
	})
	wait.For(t, 10*time.Second, "the recovery logged", func() bool { return strings.Contains(d.Log(), again) })
	if n := strings.Count(d.Log(), failed); n != 1 {
		t.Fatalf("the write error was logged %d times:\n%s", n, d.Log())
	}
}

// An exec the daemon was running when it was SIGKILLed is reported by the
// next start as lost, and that start's file counts it so; its first file
// also says the exec runs while it does.
func TestMetricsTextfileCountsLostJobs(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	path := filepath.Join(t.TempDir(), "nymph.prom")
	d := cp.StartDaemon(t, harness.DaemonOptions{
		Label:     "lossy",
		ExtraTOML: fmt.Sprintf("[metrics]\ntextfile = %q\ninterval_s = 1\n", path),
	})
	t.Cleanup(func() {
		// By pid only while it still carries the daemon's mark.
		left, _ := orphans.WithEnv("/proc", orphans.EnvVar+"="+orphans.Marker(d.Workdir))
		for _, p := range left {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	})
	startExec(t, cp, "lossy", "exec sleep 300")
	wait.For(t, 30*time.Second, "the file shows the exec running", func() bool {
		f := readProm(t, path)
		return f != nil && f.get("nymph_jobs_running", "kind", "exec") == 1
	})
	d.Kill()
	d.Start(d.Bin, nil)
	var f promFile
	wait.For(t, 30*time.Second, "the restarted daemon's file counts the exec lost", func() bool {
		f = readProm(t, path)
		return f.get("nymph_jobs_finished_total", "kind", "exec", "outcome", "lost") == 1
	})
	if f.get("nymph_jobs_running", "kind", "exec") != 0 {
		t.Fatalf("the lost exec still counts as running:\n%v", f)
	}
}
