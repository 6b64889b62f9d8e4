// Package payload owns the resolution of a payload_ref: presign a "get" for
// its key on the control plane, download the returned URL within the spec's
// 60 s and 100 MiB, and check size and sha256 over the raw bytes as
// received, before anything is spawned with them.
package payload

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"nymph/messages"
)

// FetchTimeout bounds presign plus download.
const FetchTimeout = messages.PresignFetchTimeoutS * time.Second

// Store is the part of the control plane client that resolves payloads.
type Store interface {
	Presign(ctx context.Context, namespace string, req *messages.PresignRequest) (*messages.PresignResponse, error)
	Download(ctx context.Context, rawURL string, limit int64) ([]byte, error)
}

// Fetch resolves ref in namespace and returns the verified bytes.
func Fetch(ctx context.Context, s Store, namespace string, ref *messages.PayloadRef) ([]byte, error) {
	if ref.Key == "" {
		return nil, fmt.Errorf("payload_ref.key: missing")
	}
	if ref.Size > messages.MaxPayload {
		return nil, fmt.Errorf("payload_ref.size: %d bytes is over the %d byte limit", ref.Size, messages.MaxPayload)
	}
	ctx, cancel := context.WithTimeout(ctx, FetchTimeout)
	defer cancel()
	key := ref.Key
	p, err := s.Presign(ctx, namespace, &messages.PresignRequest{Op: messages.PresignGet, Key: &key})
	if err != nil {
		return nil, fmt.Errorf("payload presign: %w", err)
	}
	if p.URL == "" {
		return nil, fmt.Errorf("payload presign: empty url")
	}
	data, err := s.Download(ctx, p.URL, messages.MaxPayload)
	if err != nil {
		return nil, fmt.Errorf("payload download: %w", err)
	}
	if err := Verify(data, ref); err != nil {
		return nil, err
	}
	return data, nil
}

// Verify checks data against the size and sha256 a ref declares.
func Verify(data []byte, ref *messages.PayloadRef) error {
	if ref.Size != 0 && uint64(len(data)) != ref.Size {
		return fmt.Errorf("payload size mismatch: want %d bytes, got %d", ref.Size, len(data))
	}
	if ref.SHA256 != nil && *ref.SHA256 != "" {
		sum := sha256.Sum256(data)
		got := hex.EncodeToString(sum[:])
		if !strings.EqualFold(got, *ref.SHA256) {
			return fmt.Errorf("payload sha256 mismatch: want %s, got %s", strings.ToLower(*ref.SHA256), got)
		}
	}
	return nil
}
