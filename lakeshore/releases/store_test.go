package releases

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"nymph/dist"
	"nymph/lakeshore/blobs"
	"nymph/test/fakeelf"
	"nymph/test/realparts"
)

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func openStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "releases"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func assertNoTemps(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// Temporary files are dot-files: the publish upload's .publish-*.tmp
		// and atomicfile's .<name><random>.
		if base := filepath.Base(p); strings.HasPrefix(base, ".") && base != indexName && base != lockName {
			t.Errorf("temporary file left behind: %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestPublishListGet(t *testing.T) {
	eachCatalogue(t, func(t *testing.T, f fixture) {
		ctx := context.Background()
		const gnu, arm = "x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"
		bins := map[string][]byte{}
		for _, p := range []struct{ v, tr string }{{"0.1.10", gnu}, {"0.1.9", gnu}, {"0.1.10", arm}, {"0.2.0-rc.1", gnu}, {"0.2.0", gnu}} {
			b := randomBytes(t, 4096)
			bins[p.v+"/"+p.tr] = b
			rel := publish(t, f.cat, b, p.v, p.tr)
			if rel.SHA256 != hexSum(b) || rel.Size != 4096 || rel.Version != p.v || rel.Triple != p.tr || rel.PublishedAt.IsZero() {
				t.Fatalf("Publish returned %+v", rel)
			}
			bin, side := f.stored(t, p.v, p.tr)
			if !bytes.Equal(bin, b) {
				t.Fatal("stored bytes differ from the published ones")
			}
			if want := hexSum(b) + "  nymph-" + p.tr + "\n"; string(side) != want || string(side) != rel.Sidecar() {
				t.Fatalf("sidecar %q, want %q", side, want)
			}
			if f.store == nil {
				if rel.Path != "" {
					t.Fatalf("a bucket release has Path %q", rel.Path)
				}
				continue
			}
			if rel.Path != filepath.Join(f.store.Dir(), p.v, "nymph-"+p.tr) {
				t.Fatalf("Path %s", rel.Path)
			}
			st, err := os.Stat(rel.Path)
			if err != nil || st.Mode().Perm() != 0o755 {
				t.Fatalf("binary %s: %v %v", rel.Path, st, err)
			}
		}

		all := list(t, f.cat)
		want := "0.1.9/" + gnu + " 0.1.10/" + arm + " 0.1.10/" + gnu + " 0.2.0-rc.1/" + gnu + " 0.2.0/" + gnu
		if got := names(all); got != want {
			t.Fatalf("List order\n got %v\nwant %v", got, want)
		}
		for _, r := range all {
			if r.SHA256 != hexSum(bins[r.Version+"/"+r.Triple]) || r.Size != 4096 || r.PublishedAt.IsZero() {
				t.Fatalf("listed %+v", r)
			}
		}

		rel, err := f.cat.GetContext(ctx, "0.1.10", arm)
		if err != nil || rel.SHA256 != hexSum(bins["0.1.10/"+arm]) || rel.Size != 4096 {
			t.Fatalf("Get: %+v %v", rel, err)
		}
		rc, orel, err := f.cat.Open(ctx, "0.1.10", arm)
		if err != nil || orel.SHA256 != rel.SHA256 {
			t.Fatalf("Open: %+v %v", orel, err)
		}
		opened, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(opened, bins["0.1.10/"+arm]) {
			t.Fatalf("Open read %d bytes, %v", len(opened), err)
		}
		if _, err := f.cat.GetContext(ctx, "0.1.11", gnu); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get of a missing version: %v, want ErrNotFound", err)
		}
		if _, err := f.cat.GetContext(ctx, "0.1.9", arm); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get of a missing triple: %v, want ErrNotFound", err)
		}
		if _, _, err := f.cat.Open(ctx, "0.1.9", arm); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Open of a missing triple: %v, want ErrNotFound", err)
		}
		if l, err := f.cat.LatestContext(ctx, gnu); err != nil || l.Version != "0.2.0" {
			t.Fatalf("Latest(gnu) = %+v, %v", l, err)
		}
		if _, err := f.cat.LatestContext(ctx, "riscv64gc-unknown-linux-gnu"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Latest of an unpublished triple: %v", err)
		}

		// A second catalogue over the same storage (another process or
		// replica) sees it all.
		if all2 := list(t, f.again(t)); names(all2) != want {
			t.Fatalf("reopened catalogue lists %v, want %v", names(all2), want)
		}
		if f.store != nil {
			assertNoTemps(t, f.store.Dir())
		}
	})
}

func TestSidecarIsSha256sumFormat(t *testing.T) {
	s := openStore(t)
	body := randomBytes(t, 10000)
	rel := publish(t, s, body, "1.2.3", "x86_64-unknown-linux-gnu")
	side, err := os.ReadFile(rel.Path + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	if want := hexSum(body) + "  nymph-x86_64-unknown-linux-gnu\n"; string(side) != want {
		t.Fatalf("sidecar %q, want %q", side, want)
	}
	sha256sum, err := exec.LookPath("sha256sum")
	if err != nil {
		realparts.Unavailable(t, "sha256sum not found")
	}
	cmd := exec.Command(sha256sum, "-c", filepath.Base(rel.Path)+".sha256")
	cmd.Dir = filepath.Dir(rel.Path)
	if check, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c: %v: %s", err, check)
	}
	// sha256sum prints the name as given, so run it where the sidecar lives.
	cmd = exec.Command(sha256sum, filepath.Base(rel.Path))
	cmd.Dir = filepath.Dir(rel.Path)
	if out, err := cmd.Output(); err != nil || string(out) != string(side) {
		t.Fatalf("sha256sum prints %q, the sidecar is %q (%v)", out, side, err)
	}
}

func TestRepublishReplaces(t *testing.T) {
	eachCatalogue(t, func(t *testing.T, f fixture) {
		first := publish(t, f.cat, randomBytes(t, 2000), "0.3.0", "")
		secondBody := randomBytes(t, 3000)
		second := publish(t, f.cat, secondBody, "0.3.0", "")
		if first.Triple != second.Triple {
			t.Fatalf("triples %s and %s", first.Triple, second.Triple)
		}
		all := list(t, f.cat)
		if len(all) != 1 {
			t.Fatalf("List: %v, want one release", all)
		}
		if all[0].SHA256 != hexSum(secondBody) || all[0].Size != 3000 {
			t.Fatalf("the catalogue still describes the first binary: %+v", all[0])
		}
		bin, side := f.stored(t, "0.3.0", second.Triple)
		if !bytes.Equal(bin, secondBody) || string(side) != second.Sidecar() {
			t.Fatal("binary or sidecar not replaced")
		}
		if f.store != nil {
			assertNoTemps(t, f.store.Dir())
		}
	})
}

func TestTripleDetectedFromELF(t *testing.T) {
	eachCatalogue(t, func(t *testing.T, f fixture) {
		s := f.cat
		if rel := publish(t, s, fakeelf.New(t, elf.EM_AARCH64, 4096), "1.0.0", ""); rel.Triple != "aarch64-unknown-linux-gnu" {
			t.Fatalf("aarch64 ELF published as %s", rel.Triple)
		}
		if rel := publish(t, s, fakeelf.New(t, elf.EM_X86_64, 4096), "1.0.0", ""); rel.Triple != "x86_64-unknown-linux-gnu" {
			t.Fatalf("x86_64 ELF published as %s", rel.Triple)
		}
		if rel := publish(t, s, []byte("#!/bin/sh\n"), "1.0.1", ""); rel.Triple != dist.DefaultTriple() {
			t.Fatalf("a non-ELF file published as %s, want dist.DefaultTriple %s", rel.Triple, dist.DefaultTriple())
		}
		if rel := publish(t, s, fakeelf.New(t, elf.EM_AARCH64, 4096), "1.0.2", "aarch64-unknown-linux-musl"); rel.Triple != "aarch64-unknown-linux-musl" {
			t.Fatalf("explicit triple overridden: %s", rel.Triple)
		}
	})
}

func TestPublishRejectsBadInput(t *testing.T) {
	eachCatalogue(t, func(t *testing.T, f fixture) {
		s := f.cat
		ctx := context.Background()
		body := []byte("binary")
		for _, v := range []string{"", ".hidden", "../etc", "a/b", "1 0", "-1", "1.0\n", strings.Repeat("9", 129), "ü1"} {
			_, err := s.Publish(ctx, bytes.NewReader(body), v, "")
			if err == nil || !strings.Contains(err.Error(), "field version") {
				t.Errorf("version %q: %v, want an error naming the field", v, err)
			}
		}
		for _, tr := range []string{"X86_64-unknown-linux-gnu", "linux", "x86_64/unknown-linux", "x86_64-unknown-linux-gnu.sha256", "a-b-c-d-e-f", "x86_64--gnu"} {
			_, err := s.Publish(ctx, bytes.NewReader(body), "1.0.0", tr)
			if err == nil || !strings.Contains(err.Error(), "field triple") {
				t.Errorf("triple %q: %v, want an error naming the field", tr, err)
			}
		}
		if _, err := s.Publish(ctx, bytes.NewReader(nil), "1.0.0", ""); err == nil || !strings.Contains(err.Error(), "empty") {
			t.Errorf("empty binary: %v", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.Publish(cctx, bytes.NewReader(body), "1.0.0", ""); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled publish: %v", err)
		}
		if _, err := s.GetContext(ctx, "../x", "x86_64-unknown-linux-gnu"); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("Get with a bad version: %v, want a validation error", err)
		}
		if all := list(t, s); len(all) != 0 {
			t.Fatalf("after only bad input the catalogue lists %v", all)
		}
		if left := f.leftovers(t); len(left) != 0 {
			t.Errorf("left behind: %v", left)
		}
	})
}

func TestOpenRefusesCorruptIndex(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ".index.json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("Open over a corrupt index: %v", err)
	}
}

// TestConcurrentPublish races writers on two catalogues over one storage
// (as two processes or replicas would) and checks every surviving entry
// describes the bytes stored and its sidecar.
func TestConcurrentPublish(t *testing.T) {
	eachCatalogue(t, func(t *testing.T, f fixture) {
		a, b := f.cat, f.again(t)
		const triple = "x86_64-unknown-linux-gnu"
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for i := range 16 {
			s := a
			if i%2 == 1 {
				s = b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Half the writers fight over one version; the rest get their own.
				version := "0.9.0"
				if i%4 != 0 {
					version = fmt.Sprintf("0.9.%d", i+1)
				}
				body := make([]byte, 32<<10)
				_, _ = rand.Read(body)
				if _, err := s.Publish(context.Background(), bytes.NewReader(body), version, triple); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		all := list(t, a)
		if len(all) != 13 { // 0.9.0 plus twelve distinct versions
			t.Fatalf("List has %d releases, want 13", len(all))
		}
		for _, r := range all {
			bin, side := f.stored(t, r.Version, r.Triple)
			if r.Version == "0.9.0" && f.store == nil {
				// Four replicas wrote 0.9.0's two objects with no lock
				// between them, so its sidecar may name another writer's
				// binary; Open refuses such a pair, and the next publish
				// of the version mends it.
				rc, _, err := a.Open(context.Background(), r.Version, r.Triple)
				if errors.Is(err, blobs.ErrChecksum) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || hexSum(got) != r.SHA256 {
					t.Errorf("Open of the raced version gave bytes of sha256 %s (%v), its sidecar says %s", hexSum(got), err, r.SHA256)
				}
				continue
			}
			if hexSum(bin) != r.SHA256 || string(side) != r.Sidecar() {
				t.Errorf("%s: catalogue %s, binary %s, sidecar %q", r.Version, r.SHA256, hexSum(bin), side)
			}
		}
		if f.store != nil {
			assertNoTemps(t, f.store.Dir())
		}
	})
}

func TestCompareVersions(t *testing.T) {
	ordered := []string{"0.1.0", "0.1.2", "0.1.9", "0.1.10", "v0.2.0-alpha", "0.2.0-rc.1", "0.2.0-rc.2", "0.2.0-rc.10", "0.2.0", "0.10.0", "1.0.0"}
	for i := range ordered {
		for j := range ordered {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := CompareVersions(ordered[i], ordered[j]); got != want {
				t.Errorf("CompareVersions(%s, %s) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
	if CompareVersions("1.0.0+build.1", "1.0.0+build.2") != 0 {
		t.Error("build metadata must not order versions")
	}
}

func TestTripleForArch(t *testing.T) {
	for arch, want := range map[string]string{"x86_64": "x86_64-unknown-linux-gnu", "amd64": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu", "arm64": "aarch64-unknown-linux-gnu", " AArch64\n": "aarch64-unknown-linux-gnu"} {
		if got, err := dist.TripleForArch(arch); err != nil || got != want {
			t.Errorf("dist.TripleForArch(%q) = %q, %v; want %q", arch, got, err, want)
		}
	}
	if _, err := dist.TripleForArch("vax"); err == nil {
		t.Error("dist.TripleForArch(vax) succeeded")
	}
	if err := ValidateTriple(dist.DefaultTriple()); err != nil {
		t.Errorf("dist.DefaultTriple %q is not a valid triple: %v", dist.DefaultTriple(), err)
	}
}

func TestDelete(t *testing.T) {
	eachCatalogue(t, func(t *testing.T, f fixture) {
		s := f.cat
		ctx := context.Background()
		const gnu, arm = "x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"
		gone := publish(t, s, randomBytes(t, 1024), "0.3.0", gnu)
		kept := publish(t, s, randomBytes(t, 1024), "0.3.0", arm)
		only := publish(t, s, randomBytes(t, 1024), "0.4.0", gnu)

		rel, err := s.DeleteContext(ctx, "0.3.0", gnu)
		if err != nil || rel.SHA256 != gone.SHA256 {
			t.Fatalf("Delete: %+v %v", rel, err)
		}
		if bin, side := f.stored(t, "0.3.0", gnu); bin != nil || side != nil {
			t.Fatalf("after Delete the binary (%d bytes) or sidecar %q is still there", len(bin), side)
		}
		if _, err := s.GetContext(ctx, "0.3.0", gnu); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get after Delete: %v", err)
		}
		if _, err := s.GetContext(ctx, "0.3.0", arm); err != nil {
			t.Fatalf("the other triple of the version went too: %v", err)
		}
		if bin, _ := f.stored(t, "0.3.0", arm); hexSum(bin) != kept.SHA256 {
			t.Fatal("the other triple's binary went too")
		}
		if _, err := s.DeleteContext(ctx, "0.4.0", gnu); err != nil {
			t.Fatal(err)
		}
		if f.store != nil {
			// The last triple of a version takes its directory with it.
			if _, err := os.Stat(filepath.Dir(only.Path)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("empty version directory left: %v", err)
			}
		}
		if _, err := s.DeleteContext(ctx, "0.4.0", gnu); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Delete twice: %v", err)
		}
		if _, err := s.DeleteContext(ctx, "9.9.9", arm); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Delete of a release never published: %v", err)
		}
		if _, err := s.DeleteContext(ctx, "../x", gnu); err == nil || errors.Is(err, ErrNotFound) {
			t.Fatalf("bad version: %v", err)
		}
		// A reopened catalogue agrees.
		if all := list(t, f.again(t)); len(all) != 1 || all[0].Triple != arm {
			t.Fatalf("after reopen: %+v", all)
		}
		if f.store != nil {
			assertNoTemps(t, f.store.Dir())
		}
	})
}
