package providers

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// awsModulePrefix is where the AWS SDK's packages (and smithy's) live.
const awsModulePrefix = "github.com/aws/"

// TestAWSSDKStaysInTheEC2Launcher keeps the AWS SDK behind two
// interfaces: only this package's ec2*.go files (the Launcher) and
// lakeshore/blobs' s3*.go files (the blob Store) import it (tests
// anywhere may, to inspect an emulator through its API), so every other
// kind of provider, the control plane and the daemon stay free of it, and
// another cloud's SDK could sit beside it the same way.
func TestAWSSDKStaysInTheEC2Launcher(t *testing.T) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
			(filepath.Dir(rel) == filepath.Join("lakeshore", "providers") && strings.HasPrefix(d.Name(), "ec2")) ||
			(filepath.Dir(rel) == filepath.Join("lakeshore", "blobs") && strings.HasPrefix(d.Name(), "s3")) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, awsModulePrefix) {
				t.Errorf("%s imports %s: the AWS SDK belongs in lakeshore/providers/ec2*.go and lakeshore/blobs/s3*.go only", rel, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking the module: %v", err)
	}

	// The daemon never launches anything: its binary must not carry the
	// SDK in, not even through a package of ours.
	deps, err := exec.Command("go", "list", "-deps", "nymph/cmd/nymph").Output()
	if err != nil {
		t.Fatalf("go list -deps nymph/cmd/nymph: %v", err)
	}
	for _, dep := range strings.Fields(string(deps)) {
		if strings.HasPrefix(dep, awsModulePrefix) {
			t.Errorf("the nymph daemon depends on %s", dep)
		}
	}
}
