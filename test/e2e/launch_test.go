package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
	"nymph/test/realparts"
)

// publishNymph publishes the nymph under test as the release launched
// machines download.
func publishNymph(t *testing.T, cp *harness.ControlPlane) {
	t.Helper()
	if r := cp.CLI(t, "release", "publish", cp.Bins.Nymph, "--version", harness.Version); r.Code != 0 {
		t.Fatalf("release publish: %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

func decodeLaunch(t *testing.T, r harness.Result) cli.LaunchSummary {
	t.Helper()
	var sum cli.LaunchSummary
	if err := json.Unmarshal([]byte(r.Stdout), &sum); err != nil {
		t.Fatalf("launch --json: %v\nstdout: %s\nstderr: %s", err, r.Stdout, r.Stderr)
	}
	return sum
}

// containersOf lists the podman containers (running or not) labelled with
// worker ids of the given ones.
func containersOf(t *testing.T, ids []string) []string {
	t.Helper()
	args := append(realparts.PodmanGlobalArgs(), "ps", "-a", "--format", "{{.Names}}")
	out, err := exec.Command("podman", args...).Output()
	if err != nil {
		t.Fatalf("podman ps: %v", err)
	}
	var found []string
	for _, name := range strings.Fields(string(out)) {
		for _, id := range ids {
			if strings.Contains(name, id) {
				found = append(found, name)
			}
		}
	}
	return found
}

// TestLaunchThroughPodman boots three real daemons from the rendered
// bootstrap, each in a container of a locally built image, and drives
// them: exec on each, their launch logs, kill removing the containers.
func TestLaunchThroughPodman(t *testing.T) {
	image := realparts.PodmanBashImage(t)
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	publishNymph(t, cp)

	args := []string{"provider", "add", "podman", "local", "--image", image, "--cli", realparts.PodmanCLI()}
	for _, a := range realparts.PodmanLimitArgs() {
		args = append(args, "--run-arg", a)
	}
	if r := cp.CLI(t, args...); r.Code != 0 {
		t.Fatalf("provider add: %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}

	r := cp.CLI(t, "daemon", "launch", "--provider", "local", "--name", "boxed", "--count", "3", "--wait", "--wait-timeout", "3m", "--json", "--no-config")
	sum := decodeLaunch(t, r)
	var ids []string
	for _, w := range sum.Launched {
		ids = append(ids, w.ID)
	}
	t.Cleanup(func() {
		// Whatever the test did, no container outlives it.
		for _, name := range containersOf(t, ids) {
			_ = exec.Command("podman", append(realparts.PodmanGlobalArgs(), "rm", "-f", name)...).Run()
		}
	})
	if r.Code != 0 || len(sum.Launched) != 3 || len(sum.Registered) != 3 {
		logs := ""
		for _, id := range ids {
			logs += cp.CLI(t, "daemon", "launch-log", id).Stdout
		}
		t.Fatalf("launch --wait: %d %+v\nstderr: %s\nlaunch logs:\n%s", r.Code, sum, r.Stderr, logs)
	}

	for i, w := range sum.Launched {
		label := "boxed-0" + string(rune('0'+i))
		if w.Label != label {
			t.Fatalf("launched[%d] is %q, want %q", i, w.Label, label)
		}
		res := cp.CLI(t, "daemon", "exec", label, "--", "echo", "hello from "+label)
		if res.Code != 0 || strings.TrimSpace(res.Stdout) != "hello from "+label {
			t.Fatalf("exec on %s: %d %q %q", label, res.Code, res.Stdout, res.Stderr)
		}
		ll := cp.CLI(t, "daemon", "launch-log", label, "--json")
		var log operatorapi.LaunchLog
		if err := json.Unmarshal([]byte(ll.Stdout), &log); err != nil || log.InstanceID != w.InstanceID || !strings.Contains(log.Output, "nymph") {
			t.Fatalf("launch-log of %s: %v %+v\n%s", label, err, log, ll.Stderr)
		}
		show := cp.CLI(t, "daemon", "show", label, "--json")
		var shown operatorapi.Worker
		if err := json.Unmarshal([]byte(show.Stdout), &shown); err != nil || shown.Provider != "local" || shown.InstanceID != w.InstanceID ||
			shown.State != operatorapi.StateActive {
			t.Fatalf("show %s: %v %+v", label, err, shown)
		}
	}
	if got := containersOf(t, ids); len(got) != 3 {
		t.Fatalf("containers before kill: %v", got)
	}
	if r := cp.CLI(t, "daemon", "kill", "--prefix", "boxed", "--yes"); r.Code != 0 || strings.Count(r.Stdout, "terminated") != 3 {
		t.Fatalf("kill --prefix: %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if got := containersOf(t, ids); len(got) != 0 {
		t.Fatalf("containers after kill: %v", got)
	}
}

var launchToken = regexp.MustCompile(`dl[te]_[A-Za-z0-9_-]{43}`)

// TestLaunchThroughEC2 launches through the EC2 API of moto and checks,
// through that API itself, what the control plane asked for.
func TestLaunchThroughEC2(t *testing.T) {
	moto := realparts.StartMoto(t)
	cp := harness.StartControlPlane(t, harness.CPOptions{Env: moto.Env})
	publishNymph(t, cp)

	if r := cp.CLI(t, "provider", "add", "ec2", "aws", "--region", moto.Region, "--endpoint", moto.URL,
		"--image-id", realparts.MotoImageID, "--instance-type", "t3.micro"); r.Code != 0 {
		t.Fatalf("provider add ec2: %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	show := cp.CLI(t, "provider", "show", "aws", "--json")
	if strings.Contains(show.Stdout, "secret") || !strings.Contains(show.Stdout, realparts.MotoImageID) {
		t.Fatalf("provider show: %s", show.Stdout)
	}

	r := cp.CLI(t, "daemon", "launch", "--provider", "aws", "--name", "gpu", "--count", "2",
		"--capacity", `{"instance_type": "t3.large"}`, "--tag", "gpu:h100", "--json", "--no-config")
	sum := decodeLaunch(t, r)
	if r.Code != 0 || len(sum.Launched) != 2 {
		t.Fatalf("launch: %d %+v\n%s", r.Code, sum, r.Stderr)
	}

	cfg, err := awsconfig.LoadDefaultConfig(context.Background(), awsconfig.WithRegion(moto.Region),
		awsconfig.WithCredentialsProvider(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		})))
	if err != nil {
		t.Fatal(err)
	}
	api := ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(moto.URL) })
	ctx := context.Background()
	tokens := map[string]bool{}
	for i, w := range sum.Launched {
		name := "gpu-0" + string(rune('0'+i))
		out, err := api.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{w.InstanceID}})
		if err != nil || len(out.Reservations) != 1 || len(out.Reservations[0].Instances) != 1 {
			t.Fatalf("describe %s: %v %+v", w.InstanceID, err, out)
		}
		inst := out.Reservations[0].Instances[0]
		if inst.InstanceType != ec2types.InstanceTypeT3Large || tagOf(inst.Tags, "Name") != name || tagOf(inst.Tags, "lakeshore:worker-id") != w.ID {
			t.Fatalf("instance %s: type %s, tags %+v; want t3.large, Name %s, worker %s", w.InstanceID, inst.InstanceType, inst.Tags, name, w.ID)
		}
		attr, err := api.DescribeInstanceAttribute(ctx, &ec2.DescribeInstanceAttributeInput{
			InstanceId: aws.String(w.InstanceID), Attribute: ec2types.InstanceAttributeNameUserData})
		if err != nil || attr.UserData == nil {
			t.Fatalf("user data of %s: %v", w.InstanceID, err)
		}
		ud, err := base64.StdEncoding.DecodeString(aws.ToString(attr.UserData.Value))
		if err != nil || !strings.HasPrefix(string(ud), "#!/") || !strings.Contains(string(ud), "/opt/dreamlake/bin/nymph") ||
			!strings.Contains(string(ud), "dreamlake-nymph.service") {
			t.Fatalf("user data of %s is not the bootstrap: %v\n%.300s", w.InstanceID, err, ud)
		}
		found := launchToken.FindAllString(string(ud), -1)
		if len(found) != 1 {
			t.Fatalf("user data of %s carries %d tokens", w.InstanceID, len(found))
		}
		tokens[found[0]] = true
	}
	if len(tokens) != 2 {
		t.Fatalf("%d distinct tokens for 2 instances", len(tokens))
	}

	first, second := sum.Launched[0], sum.Launched[1]
	if ll := cp.CLI(t, "daemon", "launch-log", first.ID, "--json"); ll.Code != 0 {
		t.Fatalf("launch-log: %d %s", ll.Code, ll.Stderr)
	}
	if r := cp.CLI(t, "daemon", "kill", first.ID); r.Code != 0 || !strings.Contains(r.Stdout, "terminated") {
		t.Fatalf("kill: %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := cp.CLI(t, "daemon", "kill", second.ID, "--no-terminate"); r.Code != 0 {
		t.Fatalf("kill --no-terminate: %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	states := map[string]ec2types.InstanceStateName{}
	out, err := api.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{first.InstanceID, second.InstanceID}})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range out.Reservations {
		for _, inst := range res.Instances {
			states[aws.ToString(inst.InstanceId)] = inst.State.Name
		}
	}
	if !slices.Contains([]ec2types.InstanceStateName{ec2types.InstanceStateNameShuttingDown, ec2types.InstanceStateNameTerminated}, states[first.InstanceID]) ||
		states[second.InstanceID] != ec2types.InstanceStateNameRunning {
		t.Fatalf("after kill / kill --no-terminate: %v", states)
	}
	if ws := cp.Workers(t); len(ws) != 0 {
		t.Fatalf("rows after both kills: %+v", ws)
	}

	// A serve process with no AWS credentials: the provider is refused
	// when added, with the fix named, and nothing is stored.
	var bare []string
	for _, kv := range moto.Env {
		if !strings.HasPrefix(kv, "AWS_ACCESS_KEY_ID=") && !strings.HasPrefix(kv, "AWS_SECRET_ACCESS_KEY=") {
			bare = append(bare, kv)
		}
	}
	bare = append(bare, "AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=")
	cp2 := harness.StartControlPlane(t, harness.CPOptions{Env: bare})
	r = cp2.CLI(t, "provider", "add", "ec2", "aws", "--region", moto.Region, "--endpoint", moto.URL, "--image-id", realparts.MotoImageID)
	if r.Code == 0 || !strings.Contains(r.Stderr, "credentials") {
		t.Fatalf("provider add without credentials: %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := cp2.CLI(t, "provider", "list", "--json"); !strings.Contains(r.Stdout, `"providers": []`) {
		t.Fatalf("a refused provider was stored: %s", r.Stdout)
	}
}

func tagOf(tags []ec2types.Tag, key string) string {
	for _, tg := range tags {
		if aws.ToString(tg.Key) == key {
			return aws.ToString(tg.Value)
		}
	}
	return ""
}

// scriptCloud registers the fake cloud of the script provider tests
// (lakeshore/providers/testdata/script/cloud.sh) as provider "cloud" of a
// control plane that gives it a state directory.
func scriptCloud(t *testing.T, extraEnv ...string) (*harness.ControlPlane, string) {
	t.Helper()
	state := t.TempDir()
	cp := harness.StartControlPlane(t, harness.CPOptions{Env: append([]string{"LAUNCHER_STATE=" + state}, extraEnv...)})
	publishNymph(t, cp)
	script := filepath.Join(harness.ModuleRoot(t), "lakeshore", "providers", "testdata", "script", "cloud.sh")
	if r := cp.CLI(t, "provider", "add", "script", "cloud", "--command", script); r.Code != 0 {
		t.Fatalf("provider add script: %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	return cp, state
}

// TestTwentyConcurrentLaunches: twenty `daemon launch` processes at once
// give twenty distinct workers, each with a token of its own.
func TestTwentyConcurrentLaunches(t *testing.T) {
	cp, state := scriptCloud(t)
	const n = 20
	results := make([]harness.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = cp.CLI(t, "daemon", "launch", "--provider", "cloud", "--name", fmt.Sprintf("fleet-%d", i), "--json", "--no-config")
		}()
	}
	wg.Wait()
	ids, tokens := map[string]bool{}, map[string]bool{}
	for i, r := range results {
		sum := decodeLaunch(t, r)
		if r.Code != 0 || len(sum.Launched) != 1 {
			t.Fatalf("launch %d: %d %+v\n%s", i, r.Code, sum, r.Stderr)
		}
		w := sum.Launched[0]
		ids[w.ID] = true
		req, err := os.ReadFile(filepath.Join(state, "instances", w.InstanceID))
		if err != nil {
			t.Fatal(err)
		}
		tokens[launchToken.FindString(string(req))] = true
	}
	if len(ids) != n || len(tokens) != n || len(cp.Workers(t)) != n {
		t.Fatalf("%d ids, %d tokens, %d workers for %d launches", len(ids), len(tokens), len(cp.Workers(t)), n)
	}
}

// TestLaunchReadsDotLakeshore: launched from deep inside a git project,
// `daemon launch` takes its defaults from the project's .lakeshore and
// .lakeshore.local, flags win, and a setup script given as a flag is
// appended to the configured ones.
func TestLaunchReadsDotLakeshore(t *testing.T) {
	cp, state := scriptCloud(t)
	root := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(".git/HEAD", "ref: refs/heads/main\n")
	write("proj/.lakeshore", `daemon:
  provider: cloud
  name: from-file
  tags: [team:infra]
  lanes: [training]
  keep_alive_s: 600
  capacity: { instance_type: g5.2xlarge }
  setup_scripts:
    - ./host-setup/base.sh
  unknown_key: ignored
`)
	write("proj/.lakeshore.local", "daemon:\n  name: from-local\n")
	write("proj/host-setup/base.sh", "echo base\n")
	write("proj/src/deep/extra.sh", "echo extra\n")
	// Above the git root: never read.
	write("../.lakeshore", "daemon:\n  provider: elsewhere\n")

	dir := filepath.Join(root, "proj", "src", "deep")
	r := cp.CLIIn(t, dir, "daemon", "launch", "--tag", "gpu:h100", "--setup-script", "extra.sh", "--json")
	sum := decodeLaunch(t, r)
	if r.Code != 0 || len(sum.Launched) != 1 {
		t.Fatalf("launch from %s: %d %+v\n%s", dir, r.Code, sum, r.Stderr)
	}
	w := sum.Launched[0]
	if w.Label != "from-local" || w.Provider != "cloud" || !slices.Equal(w.Tags, []string{"gpu=h100"}) || !slices.Equal(w.Queues, []string{"training"}) {
		t.Fatalf("launched %+v: want from-local, flag tags replacing the file's, the file's queue", w)
	}
	if len(sum.Config) != 2 || !strings.HasSuffix(sum.Config[1], ".lakeshore.local") {
		t.Fatalf("config files read: %v", sum.Config)
	}
	req, err := os.ReadFile(filepath.Join(state, "instances", w.InstanceID))
	if err != nil || !strings.Contains(string(req), `"instance_type":"g5.2xlarge"`) || !strings.Contains(string(req), "keep_alive_s = 600") {
		t.Fatalf("the machine was asked for: %v\n%.2000s", err, req)
	}
	var cmds []operatorapi.CommandInfo
	if err := cp.GetJSON("/v1/namespaces/default/workers/"+w.ID+"/commands", &cmds); err != nil {
		var wrapped struct {
			Commands []operatorapi.CommandInfo `json:"commands"`
		}
		if err2 := cp.GetJSON("/v1/namespaces/default/workers/"+w.ID+"/commands", &wrapped); err2 != nil {
			t.Fatal(err, err2)
		}
		cmds = wrapped.Commands
	}
	if len(cmds) != 2 || cmds[0].Kind != "setup" || cmds[1].Kind != "setup" {
		t.Fatalf("setup FIFO: %+v, want the file's then the flag's", cmds)
	}

	// --no-setup drops them all; --no-config reads nothing (no provider).
	r = cp.CLIIn(t, dir, "daemon", "launch", "--no-setup", "--name", "bare", "--json")
	if sum := decodeLaunch(t, r); r.Code != 0 || len(sum.Launched) != 1 || sum.Launched[0].SetupPending != 0 {
		t.Fatalf("--no-setup: %d %+v\n%s", r.Code, sum, r.Stderr)
	}
	if r := cp.CLIIn(t, dir, "daemon", "launch", "--no-config"); r.Code != 2 || !strings.Contains(r.Stderr, "--provider") {
		t.Fatalf("--no-config without --provider: %d %s", r.Code, r.Stderr)
	}
	write("proj/.lakeshore.local", "daemon:\n  name: [unclosed\n")
	if r := cp.CLIIn(t, dir, "daemon", "launch"); r.Code == 0 || !strings.Contains(r.Stderr, ".lakeshore.local") || !strings.Contains(r.Stderr, "2") {
		t.Fatalf("malformed .lakeshore.local: %d %s", r.Code, r.Stderr)
	}
}

// TestLaunchWaitNamesTheDaemonsThatNeverRegistered: the fake cloud boots
// nothing, so --wait shows its progress on a terminal, gives up, and
// exits 1 naming the daemon and the launch-log to read.
func TestLaunchWaitNamesTheDaemonsThatNeverRegistered(t *testing.T) {
	cp, _ := scriptCloud(t)
	term := cp.CLIOnTerminal(t, 40, 200, "daemon", "launch", "--provider", "cloud", "--name", "ghost", "--wait", "--wait-timeout", "3s", "--no-config")
	term.WaitFor(t, 0, "0/1 registered")
	res := term.Wait(t)
	text := term.Text()
	if res.Code != 1 || !strings.Contains(text, "never registered") || !strings.Contains(text, "lakeshore daemon launch-log") {
		t.Fatalf("launch --wait of a daemon that never registers: exit %d\n%s", res.Code, text)
	}
}
