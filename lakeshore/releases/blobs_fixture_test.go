package releases

import (
	"testing"

	"nymph/lakeshore/blobs"
)

// localBlobs is a blobs.Local on a fresh directory.
func localBlobs(t *testing.T) blobs.Store {
	t.Helper()
	st, err := blobs.NewLocal(t.TempDir(), blobs.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}
