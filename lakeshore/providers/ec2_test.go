package providers

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/rs/zerolog"

	"nymph/test/realparts"
)

// The tests against moto set the AWS environment of the test process
// (t.Setenv), because that is where NewEC2 reads credentials from, as the
// serve process does; so none of them is parallel.

func TestEC2SpecValidate(t *testing.T) {
	good := EC2Spec{Region: "us-east-1", ImageID: "ami-12c6146b"}
	if err := good.Validate(); err != nil {
		t.Fatalf("minimal spec: %v", err)
	}
	full := EC2Spec{
		Region: "eu-west-3", Endpoint: "https://ec2.example.test:8443", Profile: "fleet",
		ImageID: "ami-0123456789abcdef0", InstanceType: "g5.xlarge", SubnetID: "subnet-0123456789abcdef0",
		SecurityGroupIDs: []string{"sg-01234567", "sg-0123456789abcdef0"}, KeyName: "ops key",
		IAMInstanceProfile: "arn:aws:iam::123456789012:instance-profile/lakeshore/worker",
	}
	if err := full.Validate(); err != nil {
		t.Fatalf("full spec: %v", err)
	}
	for _, tc := range []struct {
		spec EC2Spec
		want []string
	}{
		{EC2Spec{}, []string{"--region: required", "--image-id: required"}},
		{EC2Spec{Region: "us east 1", ImageID: "ami-12c6146b"}, []string{"--region:"}},
		{EC2Spec{Region: "us-east-1", ImageID: "12c6146b"}, []string{"--image-id:", "not an AMI id"}},
		{EC2Spec{Region: "us-east-1", ImageID: "ami-12c6146b", Endpoint: "localhost:5000"}, []string{"--endpoint:"}},
		{EC2Spec{Region: "us-east-1", ImageID: "ami-12c6146b", Profile: " dev"}, []string{"--profile:"}},
		{EC2Spec{Region: "us-east-1", ImageID: "ami-12c6146b", InstanceType: "large"}, []string{"--instance-type:"}},
		{EC2Spec{Region: "us-east-1", ImageID: "ami-12c6146b", SubnetID: "sn-1"}, []string{"--subnet-id:"}},
		{EC2Spec{Region: "us-east-1", ImageID: "ami-12c6146b", SecurityGroupIDs: []string{"sg-01234567", "default"}}, []string{"--security-group-id:", `"default"`}},
		{EC2Spec{Region: "us-east-1", ImageID: "ami-12c6146b", KeyName: "k\n"}, []string{"--key-name:"}},
		{EC2Spec{Region: "us-east-1", ImageID: "ami-12c6146b", IAMInstanceProfile: "role with spaces"}, []string{"--iam-instance-profile:"}},
	} {
		err := tc.spec.Validate()
		if err == nil {
			t.Errorf("%+v: accepted", tc.spec)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %q does not say %q", tc.spec, err, w)
			}
		}
	}
	if _, err := NewEC2(context.Background(), "p", EC2Spec{Region: "us-east-1"}, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "--image-id: required") {
		t.Fatalf("NewEC2 with an invalid spec: %v", err)
	}
}

// motoEC2 is a moto server with the test process's AWS environment set to
// its credentials, and an SDK client of the test's own to inspect what it
// holds.
type motoEC2 struct {
	moto *realparts.Moto
	raw  *ec2.Client
}

func startMotoEC2(t *testing.T, opts ...realparts.MotoOption) *motoEC2 {
	t.Helper()
	m := realparts.StartMoto(t, opts...)
	m.Setenv(t)
	raw := ec2.New(ec2.Options{
		Region:       m.Region,
		BaseEndpoint: aws.String(m.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
	return &motoEC2{moto: m, raw: raw}
}

func (m *motoEC2) spec() EC2Spec {
	return EC2Spec{Region: m.moto.Region, Endpoint: m.moto.URL, ImageID: realparts.MotoImageID}
}

func (m *motoEC2) launcher(t *testing.T, spec EC2Spec) *EC2 {
	t.Helper()
	e, err := NewEC2(testCtx(t), "moto", spec, zerolog.Nop())
	if err != nil {
		t.Fatalf("NewEC2: %v", err)
	}
	return e
}

// instance returns what moto holds for id.
func (m *motoEC2) instance(t *testing.T, id string) types.Instance {
	t.Helper()
	out, err := m.raw.DescribeInstances(testCtx(t), &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		t.Fatalf("DescribeInstances %s: %v", id, err)
	}
	if len(out.Reservations) != 1 || len(out.Reservations[0].Instances) != 1 {
		t.Fatalf("DescribeInstances %s: %d reservations", id, len(out.Reservations))
	}
	return out.Reservations[0].Instances[0]
}

// workerInstances returns the ids of the instances tagged with workerID.
func (m *motoEC2) workerInstances(t *testing.T, workerID string) []string {
	t.Helper()
	out, err := m.raw.DescribeInstances(testCtx(t), &ec2.DescribeInstancesInput{Filters: []types.Filter{
		{Name: aws.String("tag:" + EC2TagWorkerID), Values: []string{workerID}},
	}})
	if err != nil {
		t.Fatalf("DescribeInstances worker %s: %v", workerID, err)
	}
	var ids []string
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			ids = append(ids, aws.ToString(in.InstanceId))
		}
	}
	return ids
}

func (m *motoEC2) userData(t *testing.T, id string) string {
	t.Helper()
	out, err := m.raw.DescribeInstanceAttribute(testCtx(t), &ec2.DescribeInstanceAttributeInput{
		InstanceId: aws.String(id), Attribute: types.InstanceAttributeNameUserData,
	})
	if err != nil {
		t.Fatalf("DescribeInstanceAttribute userData %s: %v", id, err)
	}
	if out.UserData == nil {
		t.Fatalf("instance %s has no user data", id)
	}
	b, err := base64.StdEncoding.DecodeString(aws.ToString(out.UserData.Value))
	if err != nil {
		t.Fatalf("user data of %s is not base64: %v", id, err)
	}
	return string(b)
}

func tagsOf(in types.Instance) map[string]string {
	tags := map[string]string{}
	for _, tg := range in.Tags {
		tags[aws.ToString(tg.Key)] = aws.ToString(tg.Value)
	}
	return tags
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestEC2AgainstMoto runs the launcher against one moto server: its EC2
// loads its data on the first call, which costs seconds per server.
func TestEC2AgainstMoto(t *testing.T) {
	m := startMotoEC2(t)
	for _, tc := range []struct {
		name string
		test func(*testing.T, *motoEC2)
	}{
		{"launch", testEC2LaunchAgainstMoto},
		{"subnet, groups and key", testEC2LaunchNetworkAndKey},
		{"throttled launch is retried", testEC2ThrottledLaunchIsRetried},
		{"bad capacity refused before any call", testEC2BadCapacityRefusedBeforeAnyCall},
		{"terminate", testEC2Terminate},
		{"console log", testEC2ConsoleLog},
		{"check fails clearly", testEC2CheckFailsClearly},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, m) })
	}
}

const testBootstrap = "#!/usr/bin/env bash\nset -euo pipefail\necho 'bootstrap of a test daemon'\n"

func testEC2LaunchAgainstMoto(t *testing.T, m *motoEC2) {
	e := m.launcher(t, m.spec())
	ctx := testCtx(t)
	if err := e.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}

	inst, err := e.Launch(ctx, LaunchRequest{WorkerID: "wkr-launch-0", Name: "gpu-00", Bootstrap: testBootstrap})
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	got := m.instance(t, inst.ID)
	if got.InstanceType != DefaultEC2InstanceType {
		t.Errorf("instance type %q, want the default %q", got.InstanceType, DefaultEC2InstanceType)
	}
	if aws.ToString(got.ImageId) != realparts.MotoImageID {
		t.Errorf("image %q, want %q", aws.ToString(got.ImageId), realparts.MotoImageID)
	}
	if tags := tagsOf(got); tags[EC2TagName] != "gpu-00" || tags[EC2TagWorkerID] != "wkr-launch-0" {
		t.Errorf("tags %v, want Name=gpu-00 and %s=wkr-launch-0", tags, EC2TagWorkerID)
	}
	if ud := m.userData(t, inst.ID); ud != testBootstrap {
		t.Errorf("user data decodes to %q, want the bootstrap %q", ud, testBootstrap)
	}

	// The provider's type is the default of its launches; a launch's
	// capacity overrides it and adds tags.
	spec := m.spec()
	spec.InstanceType = "m5.large"
	e2 := m.launcher(t, spec)
	inst2, err := e2.Launch(ctx, LaunchRequest{WorkerID: "wkr-launch-1", Name: "gpu-01", Bootstrap: testBootstrap})
	if err != nil {
		t.Fatalf("Launch with the provider's type: %v", err)
	}
	if got := m.instance(t, inst2.ID).InstanceType; got != "m5.large" {
		t.Errorf("instance type %q, want the provider's m5.large", got)
	}
	capacity := json.RawMessage(`{"instance_type": "c5.xlarge", "tags": {"team": "vision"}, "availability_zone": "us-east-1b", "spot": true}`)
	inst3, err := e2.Launch(ctx, LaunchRequest{WorkerID: "wkr-launch-2", Name: "gpu-02", Bootstrap: testBootstrap, Capacity: capacity})
	if err != nil {
		t.Fatalf("Launch with capacity: %v", err)
	}
	got3 := m.instance(t, inst3.ID)
	if got3.InstanceType != "c5.xlarge" {
		t.Errorf("instance type %q, want the capacity's c5.xlarge", got3.InstanceType)
	}
	if tags := tagsOf(got3); tags["team"] != "vision" || tags[EC2TagName] != "gpu-02" {
		t.Errorf("tags %v, want team=vision beside Name=gpu-02", tags)
	}
	if az := aws.ToString(got3.Placement.AvailabilityZone); az != "us-east-1b" {
		t.Errorf("availability zone %q, want the capacity's us-east-1b", az)
	}
	if got3.InstanceLifecycle != types.InstanceLifecycleTypeSpot {
		t.Errorf("lifecycle %q, want spot", got3.InstanceLifecycle)
	}
	if got.InstanceLifecycle == types.InstanceLifecycleTypeSpot {
		t.Errorf("a launch without spot in its capacity is a spot instance")
	}
	if inst.ID == inst2.ID || inst2.ID == inst3.ID {
		t.Fatalf("three workers gave instances %s %s %s", inst.ID, inst2.ID, inst3.ID)
	}
}

// testEC2LaunchNetworkAndKey launches into a subnet, security groups and
// a key pair that moto holds: first the provider's, then the capacity's.
func testEC2LaunchNetworkAndKey(t *testing.T, m *motoEC2) {
	ctx := testCtx(t)
	vpc, err := m.raw.CreateVpc(ctx, &ec2.CreateVpcInput{CidrBlock: aws.String("10.20.0.0/16")})
	if err != nil {
		t.Fatalf("CreateVpc: %v", err)
	}
	vpcID := vpc.Vpc.VpcId
	var subnets []string
	for _, cidr := range []string{"10.20.1.0/24", "10.20.2.0/24"} {
		sn, err := m.raw.CreateSubnet(ctx, &ec2.CreateSubnetInput{VpcId: vpcID, CidrBlock: aws.String(cidr)})
		if err != nil {
			t.Fatalf("CreateSubnet: %v", err)
		}
		subnets = append(subnets, aws.ToString(sn.Subnet.SubnetId))
	}
	var groups []string
	for _, name := range []string{"workers", "gpu-workers"} {
		g, err := m.raw.CreateSecurityGroup(ctx, &ec2.CreateSecurityGroupInput{GroupName: aws.String(name), Description: aws.String(name), VpcId: vpcID})
		if err != nil {
			t.Fatalf("CreateSecurityGroup: %v", err)
		}
		groups = append(groups, aws.ToString(g.GroupId))
	}
	for _, k := range []string{"ops", "ml-ops"} {
		if _, err := m.raw.CreateKeyPair(ctx, &ec2.CreateKeyPairInput{KeyName: aws.String(k)}); err != nil {
			t.Fatalf("CreateKeyPair: %v", err)
		}
	}
	spec := m.spec()
	spec.SubnetID = subnets[0]
	spec.SecurityGroupIDs = groups[:1]
	spec.KeyName = "ops"
	e := m.launcher(t, spec)
	check := func(id, subnet, group, key string) {
		t.Helper()
		in := m.instance(t, id)
		if got := aws.ToString(in.SubnetId); got != subnet {
			t.Errorf("%s: subnet %s, want %s", id, got, subnet)
		}
		if len(in.SecurityGroups) != 1 || aws.ToString(in.SecurityGroups[0].GroupId) != group {
			t.Errorf("%s: security groups %+v, want just %s", id, in.SecurityGroups, group)
		}
		if got := aws.ToString(in.KeyName); got != key {
			t.Errorf("%s: key %q, want %q", id, got, key)
		}
	}
	a, err := e.Launch(ctx, LaunchRequest{WorkerID: "wkr-net-0", Name: "net-0", Bootstrap: testBootstrap})
	if err != nil {
		t.Fatalf("Launch into the provider's subnet: %v", err)
	}
	check(a.ID, subnets[0], groups[0], "ops")
	capacity := fmt.Sprintf(`{"subnet_id": %q, "security_group_ids": [%q], "key_name": "ml-ops"}`, subnets[1], groups[1])
	b, err := e.Launch(ctx, LaunchRequest{WorkerID: "wkr-net-1", Name: "net-1", Bootstrap: testBootstrap, Capacity: json.RawMessage(capacity)})
	if err != nil {
		t.Fatalf("Launch with the capacity's subnet: %v", err)
	}
	check(b.ID, subnets[1], groups[1], "ml-ops")

	// An instance profile is passed by name or by ARN; moto's IAM holds
	// none, so both are refused, naming the flag and what was sent.
	for _, profile := range []string{"nobody", "arn:aws:iam::123456789012:instance-profile/nobody"} {
		_, err = e.Launch(ctx, LaunchRequest{WorkerID: "wkr-net-3", Name: "net-3", Bootstrap: testBootstrap, Capacity: json.RawMessage(fmt.Sprintf(`{"iam_instance_profile": %q}`, profile))})
		t.Logf("Launch with an unknown instance profile: %v", err)
		if err == nil || !strings.Contains(err.Error(), "--iam-instance-profile") || !strings.Contains(err.Error(), profile) {
			t.Errorf("Launch with instance profile %s that moto does not hold: %v", profile, err)
		}
	}

	// A subnet the region does not hold is named by its flag.
	_, err = e.Launch(ctx, LaunchRequest{WorkerID: "wkr-net-2", Name: "net-2", Bootstrap: testBootstrap, Capacity: json.RawMessage(`{"subnet_id": "subnet-0123456789abcdef0"}`)})
	t.Logf("Launch into an unknown subnet: %v", err)
	if err == nil || !strings.Contains(err.Error(), "--subnet-id") {
		t.Errorf("Launch into a subnet moto does not hold: %v", err)
	}
}

// ec2Proxy is a reverse proxy in front of moto that counts the EC2
// actions it forwards and can answer the way AWS does where moto does
// not: the first throttle RunInstances with RequestLimitExceeded, and,
// with noLatest, a GetConsoleOutput of Latest=true with the
// UnsupportedOperation of an instance type that keeps no latest output.
type ec2Proxy struct {
	URL string

	mu       sync.Mutex
	actions  map[string]int
	tokens   []string // the ClientToken of every RunInstances
	latest   []string // the Latest of every GetConsoleOutput
	throttle int
	noLatest bool
}

func startEC2Proxy(t *testing.T, target string) *ec2Proxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &ec2Proxy{actions: map[string]int{}}
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		form, _ := url.ParseQuery(string(body))
		action := form.Get("Action")
		p.mu.Lock()
		p.actions[action]++
		if action == "RunInstances" {
			p.tokens = append(p.tokens, form.Get("ClientToken"))
		}
		if action == "GetConsoleOutput" {
			p.latest = append(p.latest, form.Get("Latest"))
		}
		throttled := action == "RunInstances" && p.throttle > 0
		if throttled {
			p.throttle--
		}
		unsupported := action == "GetConsoleOutput" && p.noLatest && form.Get("Latest") == "true"
		p.mu.Unlock()
		switch {
		case throttled:
			ec2ErrorAnswer(w, http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.")
			return
		case unsupported:
			ec2ErrorAnswer(w, http.StatusBadRequest, "UnsupportedOperation", "This instance type does not support retrieving the latest console output.")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

// ec2ErrorAnswer writes an error in the EC2 query protocol's shape.
func ec2ErrorAnswer(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>`+
		`<Response><Errors><Error><Code>`+code+`</Code><Message>`+message+`</Message></Error></Errors>`+
		`<RequestID>answered-by-the-test</RequestID></Response>`)
}

func (p *ec2Proxy) count(action string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.actions[action]
}

func (p *ec2Proxy) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.actions {
		n += c
	}
	return n
}

func testEC2ThrottledLaunchIsRetried(t *testing.T, m *motoEC2) {
	proxy := startEC2Proxy(t, m.moto.URL)
	proxy.throttle = 2
	spec := m.spec()
	spec.Endpoint = proxy.URL
	e := m.launcher(t, spec)
	inst, err := e.Launch(testCtx(t), LaunchRequest{WorkerID: "wkr-throttled", Name: "throttled", Bootstrap: testBootstrap})
	if err != nil {
		t.Fatalf("Launch throttled twice: %v", err)
	}
	if n := proxy.count("RunInstances"); n != 3 {
		t.Errorf("RunInstances sent %d times, want 3 (two throttled, one through)", n)
	}
	if ids := m.workerInstances(t, "wkr-throttled"); len(ids) != 1 || ids[0] != inst.ID {
		t.Errorf("moto holds %v for the worker, want just %s", ids, inst.ID)
	}
	// Every attempt carries the worker's id as its idempotency token, so
	// EC2 starts one instance even when a retried call had gone through
	// (moto does not implement the token; AWS does).
	proxy.mu.Lock()
	defer proxy.mu.Unlock()
	for i, tok := range proxy.tokens {
		if tok != "wkr-throttled" {
			t.Errorf("RunInstances attempt %d has ClientToken %q, want the worker id", i, tok)
		}
	}
}

func testEC2BadCapacityRefusedBeforeAnyCall(t *testing.T, m *motoEC2) {
	proxy := startEC2Proxy(t, m.moto.URL)
	spec := m.spec()
	spec.Endpoint = proxy.URL
	e := m.launcher(t, spec)
	ctx := testCtx(t)
	for _, tc := range []struct{ capacity, want string }{
		{`{"instance_tipe": "c5.large"}`, `unknown key "instance_tipe"`},
		{`{"instance_type": 5}`, "instance_type: want a string"},
		{`{"instance_type": "huge"}`, "instance_type:"},
		{`{"security_group_ids": "sg-01234567"}`, "security_group_ids: want an array"},
		{`{"security_group_ids": ["default"]}`, "security_group_ids:"},
		{`{"spot": "yes"}`, "spot: want true or false"},
		{`{"image_id": "ubuntu"}`, "image_id:"},
		{`{"tags": {"Name": "x"}}`, "tags:"},
		{`["c5.large"]`, "--capacity: not a JSON object"},
		{`{"instance_type": `, "--capacity: not a JSON object"},
	} {
		_, err := e.Launch(ctx, LaunchRequest{WorkerID: "wkr-bad", Name: "bad", Bootstrap: testBootstrap, Capacity: json.RawMessage(tc.capacity)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("capacity %s: error %v, want one saying %q", tc.capacity, err, tc.want)
		}
	}
	_, err := e.Launch(ctx, LaunchRequest{WorkerID: "wkr-big", Name: "big", Bootstrap: strings.Repeat("#", ec2MaxUserData+1)})
	if err == nil || !strings.Contains(err.Error(), "user data holds at most") {
		t.Errorf("an oversized bootstrap: %v", err)
	}
	if n := proxy.total(); n != 0 {
		t.Errorf("refused launches still sent %d requests to EC2", n)
	}
}

func testEC2Terminate(t *testing.T, m *motoEC2) {
	e := m.launcher(t, m.spec())
	ctx := testCtx(t)
	inst, err := e.Launch(ctx, LaunchRequest{WorkerID: "wkr-term", Name: "term", Bootstrap: testBootstrap})
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	if err := e.Terminate(ctx, inst.ID); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	if st := m.instance(t, inst.ID).State; st == nil || st.Name != types.InstanceStateNameTerminated {
		t.Fatalf("after Terminate the instance is %+v, want terminated", st)
	}
	if err := e.Terminate(ctx, inst.ID); err != nil {
		t.Fatalf("Terminate twice: %v", err)
	}
	if err := e.Terminate(ctx, "i-0123456789abcdef0"); err != nil {
		t.Fatalf("Terminate of an instance EC2 never had: %v", err)
	}
	if err := e.Terminate(ctx, "vm-1"); err == nil || !strings.Contains(err.Error(), "not an instance id") {
		t.Fatalf("Terminate of a malformed id: %v", err)
	}
}

func testEC2ConsoleLog(t *testing.T, m *motoEC2) {
	e := m.launcher(t, m.spec())
	ctx := testCtx(t)
	inst, err := e.Launch(ctx, LaunchRequest{WorkerID: "wkr-console", Name: "console", Bootstrap: testBootstrap})
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	for _, latest := range []bool{true, false} {
		out, err := e.ConsoleLog(ctx, inst.ID, latest)
		if err != nil {
			t.Fatalf("ConsoleLog(latest=%v): %v", latest, err)
		}
		// moto answers a fixed kernel log; what matters is that it was
		// decoded, not passed on as base64.
		if strings.TrimSpace(out) == "" {
			t.Fatalf("ConsoleLog(latest=%v) is empty", latest)
		}
		if _, err := base64.StdEncoding.DecodeString(strings.TrimSpace(out)); err == nil {
			t.Fatalf("ConsoleLog(latest=%v) is still base64: %q", latest, out)
		}
	}
	_, err = e.ConsoleLog(ctx, "i-0123456789abcdef0", true)
	if !errors.Is(err, ErrInstanceGone) {
		t.Fatalf("ConsoleLog of an unknown instance: %v, want ErrInstanceGone", err)
	}

	// An instance type without the latest output: Latest=true is refused,
	// and the launcher reads the buffer EC2 captured instead.
	proxy := startEC2Proxy(t, m.moto.URL)
	proxy.noLatest = true
	spec := m.spec()
	spec.Endpoint = proxy.URL
	out, err := m.launcher(t, spec).ConsoleLog(ctx, inst.ID, true)
	if err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("ConsoleLog(latest) of an instance without the latest output: %q, %v", out, err)
	}
	proxy.mu.Lock()
	defer proxy.mu.Unlock()
	if want := []string{"true", ""}; !slices.Equal(proxy.latest, want) {
		t.Errorf("GetConsoleOutput sent Latest %q, want %q", proxy.latest, want)
	}
}

// noAWSCredentials leaves the test process no credential source at all:
// no keys in the environment, empty shared files, no instance metadata.
func noAWSCredentials(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// The SDK takes an empty variable for an unset one.
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
		"AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI"} {
		t.Setenv(k, "")
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", empty)
	t.Setenv("AWS_CONFIG_FILE", empty)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

func testEC2CheckFailsClearly(t *testing.T, m *motoEC2) {

	t.Run("no credentials", func(t *testing.T) {
		noAWSCredentials(t)
		proxy := startEC2Proxy(t, m.moto.URL)
		spec := m.spec()
		spec.Endpoint = proxy.URL
		e := m.launcher(t, spec)
		err := e.Check(testCtx(t))
		t.Logf("Check: %v", err)
		if err == nil {
			t.Fatal("Check without credentials passed")
		}
		for _, w := range []string{"no AWS credentials for the serve process", "AWS_ACCESS_KEY_ID", "--profile"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Check error %q does not say %q", err, w)
			}
		}
		_, err = e.Launch(testCtx(t), LaunchRequest{WorkerID: "wkr-nocreds", Name: "nocreds", Bootstrap: testBootstrap})
		if err == nil || !strings.Contains(err.Error(), "no AWS credentials for the serve process") {
			t.Errorf("Launch without credentials: %v", err)
		}
		if n := proxy.total(); n != 0 {
			t.Errorf("%d unsigned requests reached EC2", n)
		}
	})

	t.Run("missing profile", func(t *testing.T) {
		noAWSCredentials(t)
		spec := m.spec()
		spec.Profile = "fleet"
		_, err := NewEC2(testCtx(t), "moto", spec, zerolog.Nop())
		if err == nil || !strings.Contains(err.Error(), `--profile: profile "fleet" is not in`) {
			t.Fatalf("NewEC2 with a profile that does not exist: %v", err)
		}
	})

	t.Run("profile from the shared credentials file", func(t *testing.T) {
		noAWSCredentials(t)
		creds := filepath.Join(t.TempDir(), "credentials")
		if err := os.WriteFile(creds, []byte("[fleet]\naws_access_key_id = test\naws_secret_access_key = test\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
		spec := m.spec()
		spec.Profile = "fleet"
		if err := m.launcher(t, spec).Check(testCtx(t)); err != nil {
			t.Fatalf("Check with --profile fleet: %v", err)
		}
	})

	t.Run("unknown image", func(t *testing.T) {
		spec := m.spec()
		spec.ImageID = "ami-0123456789abcdef0"
		err := m.launcher(t, spec).Check(testCtx(t))
		t.Logf("Check: %v", err)
		if err == nil || !strings.Contains(err.Error(), "--image-id: image ami-0123456789abcdef0 not found in region us-east-1") {
			t.Fatalf("Check of an unknown image: %v", err)
		}
	})

	t.Run("unreachable endpoint", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closed := "http://" + l.Addr().String()
		l.Close()
		spec := m.spec()
		spec.Endpoint = closed
		err = m.launcher(t, spec).Check(testCtx(t))
		t.Logf("Check: %v", err)
		if err == nil || !strings.Contains(err.Error(), "cannot reach the EC2 API at "+closed) || !strings.Contains(err.Error(), "--endpoint") {
			t.Fatalf("Check of an unreachable endpoint: %v", err)
		}
	})
}

func TestEC2CheckRefusedCredentials(t *testing.T) {
	m := startMotoEC2(t, realparts.MotoAuthenticate())
	e := m.launcher(t, m.spec())
	err := e.Check(testCtx(t))
	t.Logf("Check: %v", err)
	if err == nil {
		t.Fatal("Check with credentials the server does not know passed")
	}
	for _, w := range []string{"credentials of the serve process were refused", "AWS_ACCESS_KEY_ID", "AuthFailure"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Check error %q does not say %q", err, w)
		}
	}
}
