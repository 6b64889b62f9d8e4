package identity

import (
	"bytes"
	"crypto/ed25519"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"nymph/atomicfile"
)

const (
	pemType        = "NYMPH ED25519 PRIVATE KEY"
	pemKeyIDHeader = "Key-Id"
	// maxKeyFileSize bounds what Load reads; a real key file is ~150 bytes.
	maxKeyFileSize = 64 << 10
)

// errExists reports that a no-clobber write found the destination taken.
var errExists = errors.New("key file already exists")

// Load reads a key file (format in the package doc). A missing file yields
// an error matching fs.ErrNotExist.
func Load(path string) (*Key, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("identity: read key file %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("identity: read key file %s: %w", path, err)
	}
	if len(data) > maxKeyFileSize {
		return nil, fmt.Errorf("identity: key file %s: larger than %d bytes, not a key file", path, maxKeyFileSize)
	}
	k, err := parseKeyFile(data)
	if err != nil {
		return nil, fmt.Errorf("identity: key file %s: %w", path, err)
	}
	return k, nil
}

// LoadOrCreate loads the key at path, or, when no file exists there, creates
// one (and its directory, mode 0700). created reports which happened. An
// existing file that cannot be parsed is an error and is never replaced:
// silently minting a new identity would orphan the enrolled one. Two
// processes racing to create the same path end up with the same key.
func LoadOrCreate(path string) (k *Key, created bool, err error) {
	k, err = Load(path)
	if err == nil {
		return k, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	k, err = Generate()
	if err != nil {
		return nil, false, err
	}
	err = writeFileAtomic(path, k.marshal(), true)
	if errors.Is(err, errExists) {
		k, err = Load(path)
		return k, false, err
	}
	if err != nil {
		return nil, false, fmt.Errorf("identity: create key file %s: %w", path, err)
	}
	return k, true, nil
}

// Save writes the key to path with mode 0600, atomically replacing any file
// already there, and creates the directory (mode 0700) if needed.
func (k *Key) Save(path string) error {
	if err := writeFileAtomic(path, k.marshal(), false); err != nil {
		return fmt.Errorf("identity: save key file %s: %w", path, err)
	}
	return nil
}

func (k *Key) marshal() []byte {
	return pem.EncodeToMemory(&pem.Block{
		Type:    pemType,
		Headers: map[string]string{pemKeyIDHeader: k.id},
		Bytes:   k.priv.Seed(),
	})
}

func parseKeyFile(data []byte) (*Key, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("no PEM block %q found", pemType)
	}
	if block.Type != pemType {
		return nil, fmt.Errorf("PEM block is %q, want %q", block.Type, pemType)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("unexpected data after the PEM block")
	}
	for name := range block.Headers {
		if name != pemKeyIDHeader {
			return nil, fmt.Errorf("unsupported PEM header %q", name)
		}
	}
	if len(block.Bytes) != ed25519.SeedSize {
		return nil, fmt.Errorf("seed is %d bytes, want %d", len(block.Bytes), ed25519.SeedSize)
	}
	k, err := NewKeyFromSeed(block.Bytes)
	if err != nil {
		return nil, err
	}
	if id, ok := block.Headers[pemKeyIDHeader]; ok && id != k.id {
		return nil, fmt.Errorf("%s header %q does not match the seed's key id %q (corrupt file?)", pemKeyIDHeader, id, k.id)
	}
	return k, nil
}

// writeFileAtomic writes data to a 0600 file at path through atomicfile,
// creating the directory (0700) if needed. With noClobber the move is a hard
// link, which fails instead of replacing a file another process put there
// first; the result is then errExists.
func writeFileAtomic(path string, data []byte, noClobber bool) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := atomicfile.Create(path, 0o600)
	if err != nil {
		return err
	}
	// After a link the temporary name is redundant; after a failure it is
	// litter. After a commit Cleanup does nothing.
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if !noClobber {
		return f.Commit()
	}
	if err := f.Sync(); err != nil {
		return err
	}
	err = os.Link(f.Name(), path)
	switch {
	case err == nil:
		return atomicfile.SyncDir(filepath.Dir(path))
	case errors.Is(err, fs.ErrExist):
		return errExists
	}
	// The filesystem cannot hard-link: narrow the race with a check, then
	// fall back to rename.
	if _, statErr := os.Lstat(path); statErr == nil {
		return errExists
	}
	return f.Commit()
}
