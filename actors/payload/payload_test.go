package payload_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"nymph/actors/payload"
	"nymph/messages"
)

type store struct {
	data    []byte
	presign error
	ns, url string
}

func (s *store) Presign(_ context.Context, ns string, req *messages.PresignRequest) (*messages.PresignResponse, error) {
	s.ns = ns
	if s.presign != nil {
		return nil, s.presign
	}
	if req.Op != messages.PresignGet || req.Key == nil {
		return nil, errors.New("bad presign request")
	}
	return &messages.PresignResponse{URL: "/blobs/" + *req.Key}, nil
}

func (s *store) Download(_ context.Context, url string, limit int64) ([]byte, error) {
	s.url = url
	if limit != messages.MaxPayload {
		return nil, errors.New("limit is not the 100 MiB max")
	}
	return s.data, nil
}

func TestFetchVerifiesSizeAndSHA256(t *testing.T) {
	data := []byte("payload bytes")
	sum := sha256.Sum256(data)
	good := strings.ToUpper(hex.EncodeToString(sum[:]))
	s := &store{data: data}
	got, err := payload.Fetch(context.Background(), s, "ns1", &messages.PayloadRef{Key: "k", Size: uint64(len(data)), SHA256: &good})
	if err != nil || string(got) != string(data) || s.ns != "ns1" || s.url != "/blobs/k" {
		t.Fatalf("%q %v %s %s", got, err, s.ns, s.url)
	}
	bad := strings.Repeat("ab", 32)
	if _, err := payload.Fetch(context.Background(), s, "ns1", &messages.PayloadRef{Key: "k", SHA256: &bad}); err == nil || !strings.Contains(err.Error(), "sha256 mismatch") {
		t.Fatalf("err = %v", err)
	}
	if _, err := payload.Fetch(context.Background(), s, "ns1", &messages.PayloadRef{Key: "k", Size: 3}); err == nil || !strings.Contains(err.Error(), "size mismatch") {
		t.Fatalf("err = %v", err)
	}
	if _, err := payload.Fetch(context.Background(), s, "ns1", &messages.PayloadRef{Key: "k", Size: messages.MaxPayload + 1}); err == nil {
		t.Fatal("oversized ref accepted")
	}
	if _, err := payload.Fetch(context.Background(), s, "ns1", &messages.PayloadRef{}); err == nil || !strings.Contains(err.Error(), "payload_ref.key") {
		t.Fatalf("err = %v", err)
	}
	s.presign = errors.New("down")
	if _, err := payload.Fetch(context.Background(), s, "ns1", &messages.PayloadRef{Key: "k"}); err == nil || !strings.Contains(err.Error(), "payload presign: down") {
		t.Fatalf("err = %v", err)
	}
}
