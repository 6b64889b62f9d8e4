package blobs_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"nymph/lakeshore/blobs"
	"nymph/lakeshore/blobs/blobstest"
	"nymph/test/fakeclock"
	"nymph/test/realparts"
)

var buckets atomic.Int64

// newBucket is a fresh bucket in moto, so no case sees another's blobs.
func newBucket(t *testing.T, m *realparts.Moto) string {
	name := "blobs-" + strconv.FormatInt(buckets.Add(1), 10)
	m.CreateBucket(t, name)
	return name
}

func openS3(t *testing.T, c blobs.S3Config) *blobs.S3 {
	t.Helper()
	s, err := blobs.OpenS3(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestS3Conformance runs the suite against moto. moto 5.2.1 checks
// neither a presigned URL's expiry nor an upload's length or checksum
// against what was signed (its S3 signature check is off unless it
// authenticates, and its put_object stores a declared x-amz-checksum-*
// without computing it: "TODO: AWS computes the provided value and
// verifies"), so the fixture says so and the suite checks the URLs'
// stated expiry and that Open catches bytes that are not what was signed.
func TestS3Conformance(t *testing.T) {
	m := realparts.StartMoto(t)
	m.Setenv(t)
	for _, prefix := range []string{"", "lake/blobs"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			blobstest.Run(t, func(t *testing.T) blobstest.Fixture {
				clock := fakeclock.New(time.Now().UTC().Truncate(time.Second))
				s := openS3(t, blobs.S3Config{Bucket: newBucket(t, m), Prefix: prefix, Endpoint: m.URL, Now: clock.Now})
				if err := s.Check(context.Background()); err != nil {
					t.Fatal(err)
				}
				return blobstest.Fixture{Store: s, Now: clock.Now, Advance: clock.Advance}
			})
		})
	}
}

func TestParseS3URL(t *testing.T) {
	for in, want := range map[string][2]string{
		"s3://bucket":             {"bucket", ""},
		"s3://my.bucket-1/":       {"my.bucket-1", ""},
		"s3://bucket/lake/shore/": {"bucket", "lake/shore"},
		"s3://bucket/releases_v1": {"bucket", "releases_v1"},
	} {
		b, p, err := blobs.ParseS3URL(in)
		if err != nil || b != want[0] || p != want[1] {
			t.Errorf("ParseS3URL(%q) = %q, %q, %v; want %q, %q", in, b, p, err, want[0], want[1])
		}
	}
	for in, says := range map[string]string{
		"bucket/prefix":                   "must start with s3://",
		"https://bucket/prefix":           "must start with s3://",
		"s3://":                           "no bucket name",
		"s3://Bucket":                     "3-63 lowercase",
		"s3://ab":                         "3-63 lowercase",
		"s3://-bucket":                    "3-63 lowercase",
		"s3://" + strings.Repeat("b", 64): "3-63 lowercase",
		"s3://my..bucket":                 "no two dots",
		"s3://192.168.1.1":                "IP address",
		"s3://bucket:9000/x":              "3-63 lowercase",
		"s3://key:secret@bucket":          "no credentials",
		"s3://bucket/x?region=eu":         "no query",
		"s3://bucket/x#frag":              "no query",
		"s3://bucket/a//b":                "prefix",
		"s3://bucket/../b":                "prefix",
	} {
		if _, _, err := blobs.ParseS3URL(in); err == nil || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), in) {
			t.Errorf("ParseS3URL(%q): %v, want an error naming it and saying %q", in, err, says)
		}
	}
}

// TestS3Check: the three faults serve must refuse to start on, each with a
// message that says which and what to do.
func TestS3Check(t *testing.T) {
	ctx := context.Background()
	t.Run("no bucket", func(t *testing.T) {
		m := realparts.StartMoto(t)
		m.Setenv(t)
		err := openS3(t, blobs.S3Config{Bucket: "not-there", Endpoint: m.URL}).Check(ctx)
		want := "bucket not-there does not exist at " + m.URL + ": create it (aws s3 mb s3://not-there) or fix --blobs"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Check: %v, want %q", err, want)
		}
	})
	t.Run("wrong credentials", func(t *testing.T) {
		m := realparts.StartMoto(t, realparts.MotoAuthenticate())
		m.Setenv(t)
		err := openS3(t, blobs.S3Config{Bucket: "any-bucket", Endpoint: m.URL}).Check(ctx)
		if err == nil || !strings.Contains(err.Error(), "the credentials (access key test, from EnvConfigCredentials) were refused by "+m.URL) {
			t.Fatalf("Check: %v, want the credentials refused", err)
		}
	})
	t.Run("endpoint down", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		endpoint := "http://" + l.Addr().String()
		l.Close() // nothing listens there now
		t.Setenv("AWS_ACCESS_KEY_ID", "test")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
		t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
		t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
		t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
		err = openS3(t, blobs.S3Config{Bucket: "any-bucket", Endpoint: endpoint}).Check(ctx)
		if err == nil || !strings.Contains(err.Error(), "endpoint "+endpoint+" does not answer: ") || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("Check: %v, want the endpoint not answering", err)
		}
	})
}
