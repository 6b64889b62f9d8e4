package controlplane

import (
	"context"
	"fmt"
	"time"
)

// Payload retention: a payload is deleted once it is older than the
// retention and no job holds it — the invocation whose args it is, or the
// invocation or exec it was uploaded for, unfinished or finished within
// the retention. The store records every payload this control plane
// stored or presigned (store.Payloads), indexed by age, so a sweep reads
// only the expired rows and never lists the blob store; every replica
// sweeps, and a delete done twice is harmless. Payloads written before
// that record existed are not swept.

// maxSweepInterval bounds how long an expired payload outlives its
// retention.
const maxSweepInterval = 10 * time.Minute

// startPayloadRetention sweeps every interval (0: a tenth of the
// retention, at most maxSweepInterval).
func (s *Server) startPayloadRetention(interval time.Duration) {
	if s.payloads == nil || s.payloads.retention < 0 {
		return
	}
	if interval <= 0 {
		interval = min(s.payloads.retention/10, maxSweepInterval)
		interval = max(interval, time.Second)
	}
	s.every(interval, max(interval, time.Minute), func(ctx context.Context) {
		n, err := s.sweepPayloads(ctx)
		switch {
		case err != nil:
			s.log.Warn().Err(err).Int("deleted", n).Msg("payload retention")
		case n > 0:
			s.log.Info().Int("deleted", n).Dur("retention", s.payloads.retention).Msg("expired payloads deleted")
		}
	})
}

// sweepPayloads deletes the payloads past their retention, a batch at a
// time, and returns how many it deleted. The blob goes before its
// record, so a crash in between leaves a record to retry, never an
// orphaned blob.
func (s *Server) sweepPayloads(ctx context.Context) (int, error) {
	if s.payloads == nil || s.payloads.retention < 0 {
		return 0, nil
	}
	cutoff := s.now().Add(-s.payloads.retention)
	deleted := 0
	for {
		batch, err := s.st.ExpiredPayloads(ctx, cutoff, expiredBatch)
		if err != nil {
			return deleted, err
		}
		for _, p := range batch {
			if err := s.payloads.st.Delete(ctx, s.payloads.key(p.Namespace, p.Key)); err != nil {
				return deleted, fmt.Errorf("delete payload %s/%s from %s: %w", p.Namespace, p.Key, s.payloads.st, err)
			}
			if err := s.st.ForgetPayload(ctx, p.Namespace, p.Key); err != nil {
				return deleted, err
			}
			deleted++
		}
		if len(batch) < expiredBatch {
			return deleted, nil
		}
	}
}
