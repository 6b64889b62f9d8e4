package identity_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"nymph/identity"
)

func TestKeyIDIsStable(t *testing.T) {
	// RFC 8032 section 7.1, test 1.
	seed, _ := hex.DecodeString("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
	k, err := identity.NewKeyFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hex.EncodeToString(k.PublicKey()), "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"; got != want {
		t.Fatalf("public key %s, want %s", got, want)
	}
	if got, want := k.ID(), "k_"+base64.RawURLEncoding.EncodeToString(sha256First16(k.PublicKey())); got != want {
		t.Fatalf("KeyID %q, want %q", got, want)
	}
	if got, want := k.ID(), "k_If4x36FUomFia_hUBG_SJw"; got != want {
		t.Fatalf("KeyID changed: %q, was %q", got, want)
	}
	if identity.KeyID(k.PublicKey()) != k.ID() || len(k.ID()) != 24 {
		t.Fatalf("KeyID %q", k.ID())
	}
	if got := k.PublicKeyB64(); got != "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo" {
		t.Fatalf("PublicKeyB64 %q", got)
	}
}

func TestGenerateIsRandom(t *testing.T) {
	a, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	b, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if a.ID() == b.ID() {
		t.Fatal("two generated keys share an id")
	}
}

func TestParsePublicKey(t *testing.T) {
	k := seedKey(t, 7)
	good := k.PublicKeyB64()
	pub, err := identity.ParsePublicKey(good)
	if err != nil || !bytes.Equal(pub, k.PublicKey()) {
		t.Fatalf("round trip: %v", err)
	}
	raw := []byte(k.PublicKey())
	for name, s := range map[string]string{
		"empty":             "",
		"padded":            base64.URLEncoding.EncodeToString(raw),
		"standard alphabet": base64.StdEncoding.WithPadding(base64.NoPadding).EncodeToString(bytes.Repeat([]byte{0xfb}, 32)),
		"31 bytes":          base64.RawURLEncoding.EncodeToString(raw[:31]),
		"33 bytes":          base64.RawURLEncoding.EncodeToString(append(raw, 0)),
		"newline inside":    good[:20] + "\n" + good[21:],
		"trailing newline":  good + "\n",
		"space":             " " + good[1:],
		"non-zero pad bits": good[:42] + string(flipLowBits(good[42])),
		"64 byte key":       base64.RawURLEncoding.EncodeToString(make([]byte, 64)),
	} {
		if _, err := identity.ParsePublicKey(s); err == nil {
			t.Errorf("%s: %q accepted", name, s)
		} else if !strings.Contains(err.Error(), "public_key") {
			t.Errorf("%s: error %q does not name the field", name, err)
		}
	}
}

func flipLowBits(c byte) byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, c)
	return alphabet[i^1]
}

func TestKeyNeverPrintsSeed(t *testing.T) {
	seed := bytes.Repeat([]byte{0xab}, 32)
	k, err := identity.NewKeyFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	out := fmt.Sprintf("%v %+v %#v %s %d %x %q", k, k, k, k, k, k, k)
	for _, leak := range []string{"171", "abab", "q6ur", "AB AB"} {
		if strings.Contains(strings.ToLower(out), strings.ToLower(leak)) {
			t.Fatalf("formatted key %q contains %q", out, leak)
		}
	}
	if !strings.Contains(out, k.ID()) {
		t.Fatalf("formatted key %q does not name its id", out)
	}
}

func TestLoadOrCreate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "identity")
	path := filepath.Join(dir, "key.pem")
	k, created, err := identity.LoadOrCreate(path)
	if err != nil || !created {
		t.Fatalf("create: created=%v err=%v", created, err)
	}
	assertMode(t, path, 0o600)
	assertMode(t, dir, 0o700)
	assertOnlyFile(t, dir, "key.pem")

	again, created, err := identity.LoadOrCreate(path)
	if err != nil || created {
		t.Fatalf("reload: created=%v err=%v", created, err)
	}
	if again.ID() != k.ID() || !bytes.Equal(again.PublicKey(), k.PublicKey()) {
		t.Fatalf("reload gave %s, created %s", again, k)
	}
	loaded, err := identity.Load(path)
	if err != nil || loaded.ID() != k.ID() {
		t.Fatalf("Load: %v, %v", loaded, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, []byte("-----BEGIN NYMPH ED25519 PRIVATE KEY-----\nKey-Id: "+k.ID()+"\n")) {
		t.Fatalf("file format:\n%s", data)
	}
	// A signature made by the reloaded key verifies under the first one.
	msg := []byte("same key")
	if !ed25519.Verify(k.PublicKey(), msg, again.Sign(msg)) {
		t.Fatal("reloaded key signs differently")
	}
}

func TestSaveReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "key.pem")
	if err := os.WriteFile(path, []byte("old and world-readable"), 0o644); err != nil {
		t.Fatal(err)
	}
	k := seedKey(t, 9)
	if err := k.Save(path); err != nil {
		t.Fatal(err)
	}
	assertMode(t, path, 0o600)
	assertOnlyFile(t, dir, "key.pem")
	got, err := identity.Load(path)
	if err != nil || got.ID() != k.ID() {
		t.Fatalf("after Save: %v, %v", got, err)
	}
}

func TestLoadMissing(t *testing.T) {
	_, err := identity.Load(filepath.Join(t.TempDir(), "absent"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got %v, want fs.ErrNotExist", err)
	}
}

func TestCorruptKeyFilesAreRefusedNotReplaced(t *testing.T) {
	good := seedKey(t, 5)
	dir := t.TempDir()
	goodPath := filepath.Join(dir, "good")
	if err := good.Save(goodPath); err != nil {
		t.Fatal(err)
	}
	goodData, err := os.ReadFile(goodPath)
	if err != nil {
		t.Fatal(err)
	}
	seedB64 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{5}, 32))
	block := func(typ, headers, b64 string) string {
		return "-----BEGIN " + typ + "-----\n" + headers + b64 + "\n-----END " + typ + "-----\n"
	}
	cases := map[string]string{
		"empty":            "",
		"garbage":          "not a key\n",
		"wrong block type": block("PRIVATE KEY", "", seedB64),
		"short seed":       block("NYMPH ED25519 PRIVATE KEY", "", base64.StdEncoding.EncodeToString(make([]byte, 31))),
		"64-byte key":      block("NYMPH ED25519 PRIVATE KEY", "", base64.StdEncoding.EncodeToString(make([]byte, 64))),
		"trailing data":    string(goodData) + "extra\n",
		"two blocks":       string(goodData) + string(goodData),
		"key id mismatch":  block("NYMPH ED25519 PRIVATE KEY", "Key-Id: k_AAAAAAAAAAAAAAAAAAAAAA\n\n", seedB64),
		"encrypted":        block("NYMPH ED25519 PRIVATE KEY", "Proc-Type: 4,ENCRYPTED\n\n", seedB64),
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "key.pem")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := identity.Load(path); err == nil || !strings.Contains(err.Error(), path) {
				t.Fatalf("Load: %v", err)
			}
			if _, _, err := identity.LoadOrCreate(path); err == nil {
				t.Fatal("LoadOrCreate accepted a corrupt file")
			}
			after, err := os.ReadFile(path)
			if err != nil || string(after) != content {
				t.Fatalf("file changed: %q, %v", after, err)
			}
		})
	}
	// Without the optional header the seed alone is enough.
	path := filepath.Join(dir, "bare")
	if err := os.WriteFile(path, []byte(block("NYMPH ED25519 PRIVATE KEY", "", seedB64)), 0o600); err != nil {
		t.Fatal(err)
	}
	if k, err := identity.Load(path); err != nil || k.ID() != good.ID() {
		t.Fatalf("bare seed: %v, %v", k, err)
	}
}

func TestConcurrentLoadOrCreateAgree(t *testing.T) {
	const n = 8
	path := filepath.Join(t.TempDir(), "key.pem")
	ids := make([]string, n)
	created := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var k *identity.Key
			k, created[i], errs[i] = identity.LoadOrCreate(path)
			if k != nil {
				ids[i] = k.ID()
			}
		}()
	}
	wg.Wait()
	creators := 0
	for i := 0; i < n; i++ {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if ids[i] != ids[0] {
			t.Fatalf("caller %d got %s, caller 0 got %s", i, ids[i], ids[0])
		}
		if created[i] {
			creators++
		}
	}
	if creators != 1 {
		t.Fatalf("%d callers report creating the key", creators)
	}
	onDisk, err := identity.Load(path)
	if err != nil || onDisk.ID() != ids[0] {
		t.Fatalf("on disk: %v, %v", onDisk, err)
	}
	assertOnlyFile(t, filepath.Dir(path), "key.pem")
}

func assertMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Fatalf("%s has mode %o, want %o", path, got, want)
	}
}

func assertOnlyFile(t *testing.T, dir, name string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != name {
		t.Fatalf("%s holds %v, want only %s (temporary files left behind?)", dir, names, name)
	}
}

func sha256First16(b []byte) []byte {
	sum := sha256.Sum256(b)
	return sum[:16]
}
