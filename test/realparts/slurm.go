package realparts

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Slurm is a private single-node SLURM cluster: its own munged (own key
// and socket), slurmctld and slurmd on their own loopback ports, with all
// state under Dir. Several can run at once on one machine, so every test
// gets its own cluster and none sees another's jobs.
type Slurm struct {
	// ConfPath is the cluster's slurm.conf; client commands find it
	// through SLURM_CONF (see Env).
	ConfPath string
	// ClusterName, NodeName and Partition name the cluster's one node and
	// its one (default) partition.
	ClusterName string
	NodeName    string
	Partition   string
	// MungeSocket is the private munged socket named in AuthInfo.
	MungeSocket string
	// Dir holds slurm.conf, the state and spool dirs and the logs
	// (slurmctld.log, slurmd.log, munge/munged.log).
	Dir string

	fam   *family // slurmctld, slurmd, slurmstepd and jobs
	sinfo string
}

// StartSlurm starts a private SLURM 22.05 cluster and returns once its
// node is idle (about a second). It needs root and the munge, slurmctld,
// slurmd and slurm-client packages.
func StartSlurm(t testing.TB) *Slurm {
	t.Helper()
	RequireRoot(t)
	tools := RequireTool(t, "munged", "slurmctld", "slurmd", "sinfo", "srun", "runuser")
	munged, slurmctld, slurmd, sinfo, runuser := tools[0], tools[1], tools[2], tools[3], tools[5]
	dir := privateDir(t, "slurm")
	s := &Slurm{
		ConfPath:    filepath.Join(dir, "slurm.conf"),
		ClusterName: "rp" + randomHex(4),
		Partition:   "debug",
		MungeSocket: filepath.Join(dir, "munge", "sock"),
		Dir:         dir,
		sinfo:       sinfo,
	}
	// munged gets its own family, started first so that its cleanup runs
	// last: slurmd and slurmstepd need it until they are gone.
	if err := s.startMunge(newFamily(t), munged, runuser); err != nil {
		t.Fatalf("realparts: munge: %v", err)
	}
	node, err := nodeLine(slurmd)
	if err != nil {
		t.Fatalf("realparts: %v", err)
	}
	s.NodeName = strings.TrimPrefix(strings.Fields(node)[0], "NodeName=")
	host, err := os.Hostname()
	if err != nil {
		t.Fatalf("realparts: hostname: %v", err)
	}
	host, _, _ = strings.Cut(host, ".")
	for _, sub := range []string{"state", "spool"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatalf("realparts: %v", err)
		}
	}

	s.fam = newFamily(t)
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		ctldPort, err1 := freePort()
		dPort, err2 := freePort()
		if err1 != nil || err2 != nil || ctldPort == dPort {
			lastErr = fmt.Errorf("ports: %v %v", err1, err2)
			continue
		}
		mustWrite(t, s.ConfPath, s.conf(host, node, ctldPort, dPort), 0o644)
		lastErr = s.startDaemons(slurmctld, slurmd)
		if lastErr == nil {
			return s
		}
		// Kill this attempt's daemons; munged stays up.
		s.fam.kill()
		s.fam = newFamily(t)
	}
	t.Fatalf("realparts: slurm did not start: %v", lastErr)
	return nil
}

func (s *Slurm) conf(host, node string, ctldPort, dPort int) string {
	lines := []string{
		"ClusterName=" + s.ClusterName,
		fmt.Sprintf("SlurmctldHost=%s(127.0.0.1)", host),
		"SlurmctldPort=" + strconv.Itoa(ctldPort),
		"SlurmdPort=" + strconv.Itoa(dPort),
		"SlurmUser=root",
		"SlurmdUser=root",
		"AuthType=auth/munge",
		"CredType=cred/munge",
		"AuthInfo=socket=" + s.MungeSocket,
		"StateSaveLocation=" + filepath.Join(s.Dir, "state"),
		"SlurmdSpoolDir=" + filepath.Join(s.Dir, "spool"),
		"SlurmctldPidFile=" + filepath.Join(s.Dir, "slurmctld.pid"),
		"SlurmdPidFile=" + filepath.Join(s.Dir, "slurmd.pid"),
		"PlugStackConfig=" + filepath.Join(s.Dir, "plugstack.conf"),
		// No systemd and no cgroup delegation on these hosts.
		"ProctrackType=proctrack/linuxproc",
		"TaskPlugin=task/none",
		"SelectType=select/cons_tres",
		"SelectTypeParameters=CR_CPU",
		"SwitchType=switch/none",
		"MpiDefault=none",
		"JobAcctGatherType=jobacct_gather/none",
		"AccountingStorageType=accounting_storage/none",
		"JobCompType=jobcomp/none",
		"MailProg=/bin/true",
		// Start jobs the moment they are submitted.
		"SchedulerParameters=batch_sched_delay=0",
		"ReturnToService=2",
		// The node line is measured; do not drain it over rounding.
		"SlurmdParameters=config_overrides",
		"InactiveLimit=0",
		"KillWait=2",
		"MinJobAge=30",
		"SlurmctldTimeout=30",
		"SlurmdTimeout=30",
		node + " NodeAddr=127.0.0.1 State=UNKNOWN",
		"PartitionName=" + s.Partition + " Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
	}
	return strings.Join(lines, "\n") + "\n"
}

// startMunge runs munged in the foreground as the munge user, with a
// fresh key and a socket in the private dir.
func (s *Slurm) startMunge(fam *family, munged, runuser string) error {
	mu, err := user.Lookup("munge")
	if err != nil {
		return fmt.Errorf("munge user (package munge creates it): %w", err)
	}
	uid, _ := strconv.Atoi(mu.Uid)
	gid, _ := strconv.Atoi(mu.Gid)
	mdir := filepath.Join(s.Dir, "munge")
	if err := os.Mkdir(mdir, 0o755); err != nil {
		return err
	}
	key := filepath.Join(mdir, "munge.key")
	if err := os.WriteFile(key, []byte(randomHex(512)), 0o600); err != nil {
		return err
	}
	if err := chownTree(mdir, uid, gid); err != nil {
		return err
	}
	cmd := exec.Command(runuser, "-u", "munge", "--", munged, "--foreground",
		"--socket="+s.MungeSocket,
		"--key-file="+key,
		"--pid-file="+filepath.Join(mdir, "munged.pid"),
		"--seed-file="+filepath.Join(mdir, "munged.seed"),
		"--log-file="+filepath.Join(mdir, "munged.log"),
		"--num-threads=4",
	)
	c, err := fam.start("munged", cmd, filepath.Join(s.Dir, "munged.out"))
	if err != nil {
		return err
	}
	return poll(10*time.Second, 5*time.Millisecond, []*child{c}, func() error {
		if _, err := os.Stat(s.MungeSocket); err != nil {
			return fmt.Errorf("%w: %v", errNotYet, err)
		}
		return nil
	})
}

func (s *Slurm) startDaemons(slurmctld, slurmd string) error {
	env := s.fam.env(s.Env()...)
	ctld := exec.Command(slurmctld, "-D", "-i", "-f", s.ConfPath)
	ctld.Env = env
	c1, err := s.fam.start("slurmctld", ctld, filepath.Join(s.Dir, "slurmctld.log"))
	if err != nil {
		return err
	}
	d := exec.Command(slurmd, "-D", "-f", s.ConfPath)
	d.Env = env
	c2, err := s.fam.start("slurmd", d, filepath.Join(s.Dir, "slurmd.log"))
	if err != nil {
		return err
	}
	var state string
	err = poll(30*time.Second, 50*time.Millisecond, []*child{c1, c2}, func() error {
		cmd := exec.Command(s.sinfo, "-h", "-N", "-o", "%T")
		cmd.Env = env
		out, err := cmd.Output()
		state = strings.TrimSpace(string(out))
		if err != nil || state != "idle" {
			return fmt.Errorf("%w: node state %q (%v)", errNotYet, state, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w\n--- slurmctld.log ---\n%s\n--- slurmd.log ---\n%s", err,
			tailFile(c1.logPath, 2000), tailFile(c2.logPath, 2000))
	}
	return nil
}

// Env returns the variables a client process needs to talk to this
// cluster (SLURM_CONF); append them to os.Environ().
func (s *Slurm) Env() []string {
	return []string{"SLURM_CONF=" + s.ConfPath}
}

// Command returns a SLURM client command (srun, sbatch, squeue, scancel,
// ...) aimed at this cluster. Its environment carries the instance's
// marker, so jobs it leaves running are killed with the cluster.
func (s *Slurm) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = s.fam.env(s.Env()...)
	return cmd
}

// nodeLine returns the NodeName line that `slurmd -C` measures here.
func nodeLine(slurmd string) (string, error) {
	out, err := exec.Command(slurmd, "-C").Output()
	if err != nil {
		return "", fmt.Errorf("slurmd -C: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "NodeName=") {
			return line, nil
		}
	}
	return "", fmt.Errorf("slurmd -C printed no NodeName line: %q", out)
}
