package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TargetVersion implements store.TargetVersions.
func (db *DB) TargetVersion(ctx context.Context, namespace string) (*string, error) {
	var v *string
	err := db.q.QueryRow(ctx, `SELECT target_nymph_version FROM namespace_settings WHERE namespace = $1`, namespace).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read target version of %s: %w", namespace, err)
	}
	return v, nil
}

// SetTargetVersion implements store.TargetVersions.
func (db *DB) SetTargetVersion(ctx context.Context, namespace string, version *string, now time.Time) error {
	_, err := db.q.Exec(ctx, `INSERT INTO namespace_settings (namespace, target_nymph_version, updated_at) VALUES ($1, $2, $3)
		ON CONFLICT (namespace) DO UPDATE SET target_nymph_version = excluded.target_nymph_version, updated_at = excluded.updated_at`,
		namespace, version, ms(now))
	if err != nil {
		return fmt.Errorf("set target version of %s: %w", namespace, err)
	}
	return nil
}
