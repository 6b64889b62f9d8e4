package hostinfo_test

import (
	"context"
	"errors"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"nymph/daemon/hostinfo"
	"nymph/messages"
)

const nvidiaHeader = `+-----------------------------------------------------------------------------+
| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |
`

func fakeHost(missing ...string) *hostinfo.Prober {
	outputs := map[string]string{
		"runsc --version": "runsc version release-20230417.0\nspec: 1.1.0\n",
		"docker version --format {{.Server.Version}}": "24.0.7\n",
		"python3 --version":                           "Python 3.11.2\n",
		"python --version":                            "Python 2.7.18\n",
		"uname -sr":                                   "Linux 6.1.0-18-amd64\n",
		"uname -m":                                    "x86_64\n",
		"nvidia-smi --query-gpu=name,driver_version --format=csv,noheader": "NVIDIA H100 80GB HBM3, 535.104.05\nNVIDIA H100 80GB HBM3, 535.104.05\n",
		"nvidia-smi": nvidiaHeader,
	}
	for _, m := range missing {
		for k := range outputs {
			if strings.HasPrefix(k, m) {
				delete(outputs, k)
			}
		}
	}
	files := map[string]string{
		"/etc/os-release": "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
		"/proc/cpuinfo":   "processor\t: 0\nmodel name\t: AMD EPYC 7763\nprocessor\t: 1\nmodel name\t: AMD EPYC 7763\n",
	}
	return hostinfo.New(
		hostinfo.WithCommander(func(ctx context.Context, name string, args ...string) (string, error) {
			out, ok := outputs[strings.Join(append([]string{name}, args...), " ")]
			if !ok {
				return "", errors.New("not found")
			}
			return out, nil
		}),
		hostinfo.WithReadFile(func(p string) ([]byte, error) {
			s, ok := files[p]
			if !ok {
				return nil, os.ErrNotExist
			}
			return []byte(s), nil
		}),
		hostinfo.WithLookPath(func(b string) (string, error) {
			for _, m := range missing {
				if b == m {
					return "", errors.New("missing")
				}
			}
			return "/usr/bin/" + b, nil
		}),
		hostinfo.WithHostname(func() (string, error) { return "gpu-7\n", nil }),
	)
}

func TestVersionsProbeTable(t *testing.T) {
	v := fakeHost().Versions(context.Background(), "1.4.0")
	cuda := "12.2"
	want := messages.Versions{
		Daemon: ptr("1.4.0"), Protocol: ptr("1"), Runsc: ptr("release-20230417.0"), Docker: ptr("24.0.7"),
		Python: ptr("Python 3.11.2"), Kernel: ptr("Linux 6.1.0-18-amd64"), Distro: ptr("Debian GNU/Linux 12 (bookworm)"),
		Arch: ptr("x86_64"), CPU: &messages.CPUInfo{Model: "AMD EPYC 7763", Cores: 2},
		GPU: []messages.GPU{{Name: "NVIDIA H100 80GB HBM3", Driver: "535.104.05", CUDA: &cuda}, {Name: "NVIDIA H100 80GB HBM3", Driver: "535.104.05", CUDA: &cuda}},
	}
	if !reflect.DeepEqual(v, want) {
		t.Fatalf("got  %s\nwant %s", dump(v), dump(want))
	}
}

func TestVersionsBestEffortNil(t *testing.T) {
	v := fakeHost("runsc", "docker", "python3", "nvidia-smi").Versions(context.Background(), "dev")
	if v.Runsc != nil || v.Docker != nil || v.GPU != nil {
		t.Fatalf("missing tools not nil: %s", dump(v))
	}
	if v.Python == nil || *v.Python != "Python 2.7.18" {
		t.Fatalf("python fallback: %v", v.Python)
	}
	b, err := messages.Marshal(&v)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := messages.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if _, ok := back["gpu"]; !ok || back["gpu"] != nil || back["runsc"] != nil {
		t.Fatalf("nil probes must stay on the wire as nil: %v", back)
	}
}

func TestRealHostProbeDoesNotFail(t *testing.T) {
	v := hostinfo.New().Versions(context.Background(), "dev")
	if v.Kernel == nil || v.Arch == nil || v.CPU == nil || v.CPU.Cores == 0 {
		t.Fatalf("kernel/arch/cpu should resolve on linux: %s", dump(v))
	}
}

func TestMachineIDAndProvisionalID(t *testing.T) {
	p := fakeHost()
	if id, _ := p.MachineID("auto"); id != "gpu-7" {
		t.Fatalf("auto = %q", id)
	}
	if id, _ := p.MachineID("m-1"); id != "m-1" {
		t.Fatalf("explicit = %q", id)
	}
	id := hostinfo.ProvisionalWorkerID("gpu-7")
	if !regexp.MustCompile(`^gpu-7-[0-9A-HJKMNP-TV-Z]{26}$`).MatchString(id) {
		t.Fatalf("provisional id %q", id)
	}
}

func TestTagsMerged(t *testing.T) {
	v := fakeHost().Versions(context.Background(), "dev")
	got := hostinfo.Tags([]string{"zone=a", "gpu:h100"}, v)
	want := []string{"zone=a", "gpu:h100", "arch=x86_64", "os=linux", "cpus=2", "gpu-count=2"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
	noGPU := fakeHost("nvidia-smi").Versions(context.Background(), "dev")
	if got := hostinfo.Tags(nil, noGPU); !reflect.DeepEqual(got, []string{"arch=x86_64", "os=linux", "cpus=2"}) {
		t.Fatalf("no gpu tags: %v", got)
	}
}

func TestCapabilitiesOnlyRunnableKinds(t *testing.T) {
	c := fakeHost("runsc", "srun").Capabilities([]string{"process", "echo", "gvisor", "slurm", "docker"}, 3, "/w")
	if !reflect.DeepEqual(c.Runners, []string{"process", "echo", "docker"}) || c.MaxInvocations != 3 || c.Workdir != "/w" {
		t.Fatalf("caps = %+v", c)
	}
}

func ptr(s string) *string { return &s }

func dump(v messages.Versions) string {
	s := func(p *string) string {
		if p == nil {
			return "nil"
		}
		return *p
	}
	out := []string{s(v.Daemon), s(v.Protocol), s(v.Runsc), s(v.Docker), s(v.Python), s(v.Kernel), s(v.Distro), s(v.Arch)}
	if v.CPU != nil {
		out = append(out, v.CPU.Model)
	}
	for _, g := range v.GPU {
		out = append(out, g.Name+"/"+g.Driver+"/"+s(g.CUDA))
	}
	return strings.Join(out, " | ")
}
