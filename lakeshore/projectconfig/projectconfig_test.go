package projectconfig

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// tree writes files (path relative to root -> content) under a new
// temporary root; a path ending in "/" is a directory.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, body := range files {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func ptr[T any](v T) *T { return &v }

const project = `# the project's defaults
daemon:
  provider: my-ec2-pro
  name: rig
  runners: [docker, gvisor]
  tags: [example:docker-gvisor]
  queues: [training]
  keep_alive_s: 1800
  capacity: { instance_type: g5.2xlarge, disk: { size_gb: 200 } }
  bootstrap_script: ./host-setup/base.sh
  setup_scripts:
    - ./host-setup/docker.sh
    - host-setup/gvisor.sh
  some_future_key: { anything: [1, 2] }
other_tool:
  ignored: true
`

const local = `daemon:
  tags: [gpu:h100, me:local]
  keep_alive_s: 0
  capacity:
    instance_type: g5.xlarge
`

func TestDiscoveryAndPrecedenceFromANestedDirectory(t *testing.T) {
	root := tree(t, map[string]string{
		".git/":                 "",
		Name:                    project,
		Local:                   local,
		"host-setup/base.sh":    "echo base\n",
		"host-setup/docker.sh":  "echo docker\n",
		"host-setup/gvisor.sh":  "echo gvisor\n",
		"src/deep/er/mine.sh":   "echo mine\n",
		"src/deep/er/other.txt": "",
	})
	cwd := filepath.Join(root, "src/deep/er")

	got, err := Resolve(cwd, Flags{})
	if err != nil {
		t.Fatal(err)
	}
	want := Launch{
		Provider:        "my-ec2-pro",
		Name:            "rig",
		Runners:         []string{"docker", "gvisor"},
		Tags:            []string{"gpu:h100", "me:local"}, // .lakeshore.local's list replaces
		Queues:          []string{"training"},
		KeepAliveS:      ptr(0),
		Capacity:        json.RawMessage(`{"instance_type":"g5.xlarge"}`), // replaced whole, not merged
		BootstrapScript: &Script{Path: filepath.Join(root, "host-setup/base.sh"), Text: "echo base\n"},
		SetupScripts: []Script{
			{Path: filepath.Join(root, "host-setup/docker.sh"), Text: "echo docker\n"},
			{Path: filepath.Join(root, "host-setup/gvisor.sh"), Text: "echo gvisor\n"},
		},
		Files: []string{filepath.Join(root, Name), filepath.Join(root, Local)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("from the files:\n got %+v\nwant %+v", got, want)
	}

	// Flags win; their lists replace, except setup scripts, which append;
	// their paths are relative to the working directory.
	got, err = Resolve(cwd, Flags{
		Provider:        ptr("local"),
		Tags:            []string{"flag:tag"},
		Queues:          []string{},
		KeepAliveS:      ptr(-1),
		Capacity:        json.RawMessage(`{"cpus": 2}`),
		BootstrapScript: ptr("mine.sh"),
		SetupScripts:    []string{"mine.sh", filepath.Join(root, "host-setup/base.sh")},
	})
	if err != nil {
		t.Fatal(err)
	}
	want.Provider, want.Tags, want.Queues, want.KeepAliveS = "local", []string{"flag:tag"}, []string{}, ptr(-1)
	want.Capacity = json.RawMessage(`{"cpus": 2}`)
	mine := Script{Path: filepath.Join(cwd, "mine.sh"), Text: "echo mine\n"}
	want.BootstrapScript = &mine
	want.SetupScripts = append(want.SetupScripts, mine, Script{Path: filepath.Join(root, "host-setup/base.sh"), Text: "echo base\n"})
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("with flags:\n got %+v\nwant %+v", got, want)
	}

	// --no-config: the flags alone.
	got, err = Resolve(cwd, Flags{NoConfig: true, Name: ptr("solo"), SetupScripts: []string{"mine.sh"}})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, Launch{Name: "solo", SetupScripts: []Script{mine}}) {
		t.Fatalf("--no-config: %+v", got)
	}
}

func TestDiscoveryStopsAtTheGitRoot(t *testing.T) {
	root := tree(t, map[string]string{
		Name:                      "daemon: { provider: above-the-project }\n",
		"proj/.git/":              "",
		"proj/a/b/":               "",
		"wt/.git":                 "gitdir: /somewhere/else\n", // a worktree's .git is a file
		"wt/c/":                   "",
		"plain/d/e/":              "",
		"proj/a/.lakeshore.local": "daemon: { provider: nested }\n",
		"proj/a/b/c/":             "",
	})
	for _, dir := range []string{"proj", "wt/c"} {
		got, err := Resolve(filepath.Join(root, dir), Flags{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, Launch{}) {
			t.Errorf("from %s, inside a git project: read %+v, want nothing from above its root", dir, got)
		}
	}
	// Without a git root the walk goes on up.
	got, err := Resolve(filepath.Join(root, "plain/d/e"), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Provider != "above-the-project" {
		t.Errorf("outside any git project: provider %q, want the file above", got.Provider)
	}
	// The first level holding either file wins alone: proj/a has only
	// .lakeshore.local, and nothing above it is layered under it.
	got, err = Resolve(filepath.Join(root, "proj/a/b/c"), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Provider != "nested" || !slices.Equal(got.Files, []string{filepath.Join(root, "proj/a", Local)}) {
		t.Errorf("nearest level: %+v", got)
	}
}

func TestLanesIsQueues(t *testing.T) {
	root := tree(t, map[string]string{".git/": "", Name: "daemon:\n  lanes: [old-style]\n"})
	got, err := Resolve(root, Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Queues, []string{"old-style"}) {
		t.Fatalf("queues from lanes: %q", got.Queues)
	}
	root = tree(t, map[string]string{".git/": "", Name: "daemon:\n  queues: [a]\n  lanes: [b]\n"})
	_, err = Resolve(root, Flags{})
	if err == nil || !strings.Contains(err.Error(), "line 3: daemon.lanes: given again (first at line 2)") {
		t.Fatalf("queues and lanes together: %v", err)
	}
}

func TestMalformedFilesNameFileAndLine(t *testing.T) {
	for _, c := range []struct {
		body, want string
	}{
		{"daemon:\n  provider: x\n  tags: [a, b\n", "line 3"},
		{"daemon:\n  provider: x\n\tname: tabbed\n", "line 3: found character '\t' that cannot start any token"},
		{"daemon:\n  tags: [a]\n  tags: [b]\n", `line 3: mapping key "tags" already defined at [2:3]`},
		{"# only a comment\ndaemon:\n  setup_scripts: [a.sh, 7]\n", "line 3: daemon.setup_scripts[1]: must be a non-empty string"},
		{"daemon:\n  tags: gpu:h100\n", "line 2: daemon.tags: must be a list of strings"},
		{"daemon:\n  runners: [docker, [nested]]\n", "line 2: daemon.runners[1]: must be a non-empty string"},
		{"daemon:\n  keep_alive_s: soon\n", "line 2: daemon.keep_alive_s: must be an integer"},
		{"daemon:\n  capacity: g5.xlarge\n", "line 2: daemon.capacity: must be a mapping"},
		{"daemon:\n  provider: [a]\n", "line 2: daemon.provider: must be a string"},
		{"daemon: [1]\n", "line 1: daemon: must be a mapping"},
		{"- daemon\n", "line 1: must be a mapping with a daemon: section"},
	} {
		root := tree(t, map[string]string{".git/": "", Local: c.body})
		_, err := Resolve(root, Flags{})
		path := filepath.Join(root, Local)
		if err == nil || !strings.Contains(err.Error(), path+": ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want an error naming %s and %q", c.body, err, path, c.want)
		}
	}
}

func TestScriptsResolveAgainstTheirFile(t *testing.T) {
	root := tree(t, map[string]string{
		".git/":        "",
		"sub/" + Name:  "daemon:\n  setup_scripts: [../scripts/a.sh, missing.sh]\n",
		"scripts/a.sh": "echo a\n",
		"sub/x/":       "",
	})
	_, err := Resolve(filepath.Join(root, "sub/x"), Flags{})
	want := filepath.Join(root, "sub", Name) + ": line 2: daemon.setup_scripts[1]: open " + filepath.Join(root, "sub/missing.sh")
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("missing script: got %v, want %q", err, want)
	}
	// --no-setup drops every setup script, unread, from files and flags.
	got, err := Resolve(filepath.Join(root, "sub/x"), Flags{NoSetup: true, SetupScripts: []string{"also-missing.sh"}})
	if err != nil {
		t.Fatal(err)
	}
	if got.SetupScripts != nil {
		t.Fatalf("--no-setup kept %+v", got.SetupScripts)
	}
	// A script overridden by a higher layer is never read.
	root = tree(t, map[string]string{
		".git/": "", Name: "daemon:\n  bootstrap_script: gone.sh\n",
		Local: "daemon:\n  bootstrap_script: here.sh\n", "here.sh": "echo here\n",
	})
	got, err = Resolve(root, Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if got.BootstrapScript == nil || got.BootstrapScript.Text != "echo here\n" {
		t.Fatalf("bootstrap script: %+v", got.BootstrapScript)
	}
	_, err = Resolve(root, Flags{BootstrapScript: ptr("nope.sh")})
	if err == nil || !strings.HasPrefix(err.Error(), "--bootstrap-script nope.sh: open "+filepath.Join(root, "nope.sh")) {
		t.Fatalf("missing flag script: %v", err)
	}
}

func TestBadCapacityFlag(t *testing.T) {
	for _, c := range []string{`[1]`, `{"a":`, `null`, `"x"`} {
		if _, err := Resolve(t.TempDir(), Flags{NoConfig: true, Capacity: json.RawMessage(c)}); err == nil || !strings.Contains(err.Error(), "--capacity: must be a JSON object") {
			t.Errorf("--capacity %s: %v", c, err)
		}
	}
}

func TestEmptyFilesSetNothing(t *testing.T) {
	root := tree(t, map[string]string{".git/": "", Name: "# nothing yet\n", Local: "daemon:\n"})
	got, err := Resolve(root, Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Launch{Files: []string{filepath.Join(root, Name), filepath.Join(root, Local)}}); !reflect.DeepEqual(got, want) {
		t.Fatalf("empty files: %+v", got)
	}
}

func TestCapacityIsAnyMappingAsJSON(t *testing.T) {
	root := tree(t, map[string]string{".git/": "", Name: project,
		"host-setup/base.sh": "", "host-setup/docker.sh": "", "host-setup/gvisor.sh": ""})
	got, err := Resolve(root, Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"disk":{"size_gb":200},"instance_type":"g5.2xlarge"}`; string(got.Capacity) != want {
		t.Fatalf("capacity %s, want %s", got.Capacity, want)
	}
}
