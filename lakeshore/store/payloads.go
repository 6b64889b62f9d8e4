package store

import (
	"context"
	"time"
)

// PayloadBlob is one payload the control plane stored or presigned an
// upload for, kept so that retention can find it without listing the blob
// store: JobID is the invocation or exec it was uploaded for ("" none).
type PayloadBlob struct {
	Namespace string
	Key       string
	JobID     string
	CreatedAt time.Time
}

// Payloads records payload blobs for retention.
type Payloads interface {
	// RecordPayload notes a payload blob; recording a key again keeps its
	// first creation time and takes the newer job id when one is given.
	RecordPayload(ctx context.Context, p PayloadBlob) error
	// ExpiredPayloads returns up to limit payloads created before cutoff
	// that no job holds: neither an invocation whose args they are nor the
	// job they were uploaded for is unfinished, or finished at or after
	// cutoff. Oldest first; a deleted job holds nothing.
	ExpiredPayloads(ctx context.Context, cutoff time.Time, limit int) ([]PayloadBlob, error)
	// ForgetPayload drops the record of one payload (its blob is gone).
	ForgetPayload(ctx context.Context, namespace, key string) error
}
