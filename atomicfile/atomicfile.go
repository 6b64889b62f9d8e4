// Package atomicfile is the one way this module replaces a file on disk: a
// temporary file in the same directory, written, fsynced, renamed over the
// target, and the directory fsynced, so that after a crash a reader finds
// the old content or the new, never a torn file, and a rename that was
// reported done survives a power cut. It wraps github.com/google/renameio
// and adds the directory sync renameio leaves out.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/google/renameio/v2"
)

// Write replaces path with data, with mode perm exactly (no umask; an
// existing file's mode is not kept).
func Write(path string, data []byte, perm os.FileMode) error {
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Commit()
}

// File is a pending replacement of one path: write to it, then Commit to put
// it in place, or Cleanup to drop it. Cleanup after Commit does nothing, so
// `defer f.Cleanup()` is always right. A File is not safe for concurrent use.
type File struct {
	*renameio.PendingFile
	path string
}

// Create starts a replacement of path, a temporary file beside it with mode
// perm exactly (no umask), so a reader never sees a file with looser
// permissions than meant.
func Create(path string, perm os.FileMode) (*File, error) {
	pf, err := renameio.NewPendingFile(path,
		renameio.WithTempDir(filepath.Dir(path)),
		renameio.WithStaticPermissions(perm))
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	return &File{PendingFile: pf, path: path}, nil
}

// Commit fsyncs the file, renames it over the target and fsyncs the
// directory.
func (f *File) Commit() error {
	if err := f.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("replace %s: %w", f.path, err)
	}
	return SyncDir(filepath.Dir(f.path))
}

// SyncDir fsyncs a directory, so that renames and removals in it are
// durable. Filesystems that cannot sync a directory (EINVAL) are taken as
// having nothing to sync.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
