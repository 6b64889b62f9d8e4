package releases

import (
	"context"
	"net/http"
	"testing"

	"nymph/lakeshore/blobs"
	"nymph/test/realparts"
)

// localBlobs is a blobs.Local on a fresh directory.
func localBlobs(t testing.TB) blobs.Store {
	t.Helper()
	st, err := blobs.NewLocal(t.TempDir(), blobs.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// s3Blobs is a blobs.S3 on a fresh bucket of a private moto_server.
func s3Blobs(t testing.TB) blobs.Store {
	t.Helper()
	m := realparts.StartMoto(t)
	const bucket = "lakeshore-releases"
	// moto takes an unsigned path-style PUT as CreateBucket.
	req, err := http.NewRequest(http.MethodPut, m.URL+"/"+bucket, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("create bucket %s: %s", bucket, resp.Status)
	}
	m.Setenv(t)
	st, err := blobs.OpenS3(context.Background(), blobs.S3Config{Bucket: bucket, Prefix: "cp", Endpoint: m.URL, Region: m.Region})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}
