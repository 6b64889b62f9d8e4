package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// TargetVersion implements store.TargetVersions.
func (db *DB) TargetVersion(ctx context.Context, namespace string) (*string, error) {
	var v sql.NullString
	err := db.reader().QueryRow(ctx, `SELECT target_nymph_version FROM namespace_settings WHERE namespace = ?`, namespace).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read target version of %s: %w", namespace, err)
	}
	return nullString(v), nil
}

// SetTargetVersion implements store.TargetVersions.
func (db *DB) SetTargetVersion(ctx context.Context, namespace string, version *string, now time.Time) error {
	_, err := db.writer().Exec(ctx, `INSERT INTO namespace_settings (namespace, target_nymph_version, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (namespace) DO UPDATE SET target_nymph_version = excluded.target_nymph_version, updated_at = excluded.updated_at`,
		namespace, strOrNil(version), ms(now))
	if err != nil {
		return fmt.Errorf("set target version of %s: %w", namespace, err)
	}
	return nil
}

// NamespacesTargeting implements store.TargetVersions.
func (db *DB) NamespacesTargeting(ctx context.Context, version string) ([]string, error) {
	rows, err := db.reader().Query(ctx, `SELECT namespace FROM namespace_settings WHERE target_nymph_version = ? ORDER BY namespace`, version)
	if err != nil {
		return nil, fmt.Errorf("namespaces targeting %s: %w", version, err)
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var ns string
		if err := rows.Scan(&ns); err != nil {
			return nil, fmt.Errorf("namespaces targeting %s: %w", version, err)
		}
		out = append(out, ns)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("namespaces targeting %s: %w", version, err)
	}
	return out, nil
}
