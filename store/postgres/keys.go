package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"nymph/store"
)

const keyColumns = `k.key_id, k.worker_id, k.namespace, k.public_key, k.created_at, k.revoked_at, k.replaced_by`

func scanKey(row rowScanner) (store.Key, error) {
	var (
		k        store.Key
		created  int64
		revoked  *int64
		replaced *string
	)
	if err := row.Scan(&k.ID, &k.WorkerID, &k.Namespace, &k.PublicKey, &created, &revoked, &replaced); err != nil {
		return store.Key{}, err
	}
	k.CreatedAt, k.RevokedAt = fromMs(created), fromNullMs(revoked)
	if replaced != nil {
		k.ReplacedBy = *replaced
	}
	return k, nil
}

func getKey(ctx context.Context, q querier, query string, args ...any) (store.Key, error) {
	k, err := scanKey(q.QueryRow(ctx, `SELECT `+keyColumns+` FROM daemon_keys k `+query, args...))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Key{}, store.ErrNotFound
	}
	return k, err
}

func listKeys(ctx context.Context, q querier, query string, args ...any) ([]store.Key, error) {
	rows, err := q.Query(ctx, `SELECT `+keyColumns+` FROM daemon_keys k `+query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Key{}
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// lockWorkerKeys serialises, until commit, every change to the keys of the
// named workers. Keys outlive worker rows, so the lock is an advisory one on
// the worker id rather than the row's; ids are locked in order so that two
// callers naming the same pair never wait on each other in a cycle.
func lockWorkerKeys(ctx context.Context, tx querier, workerIDs ...string) error {
	if len(workerIDs) == 2 && workerIDs[1] < workerIDs[0] {
		workerIDs[0], workerIDs[1] = workerIDs[1], workerIDs[0]
	}
	for _, id := range workerIDs {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('daemon_keys:' || $1::text, 0))`, id); err != nil {
			return fmt.Errorf("lock keys of worker %s: %w", id, err)
		}
	}
	return nil
}

// ConsumeToken implements store.Keys. The conditional UPDATE is the whole
// guarantee: a second transaction updating the same row waits for the first
// to commit and then re-checks consumed_at, so of any number of replicas
// racing with one token exactly one sees its row change.
func (db *DB) ConsumeToken(ctx context.Context, id, by string, now time.Time) error {
	err := db.tx(ctx, func(tx querier) error {
		tag, err := tx.Exec(ctx, `UPDATE tokens SET consumed_at = $1, consumed_by = $2
			WHERE id = $3 AND kind = $4 AND consumed_at IS NULL AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $1)`,
			ms(now), by, id, store.TokenEnroll)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			return nil
		}
		var (
			kind              string
			consumed, revoked *int64
		)
		err = tx.QueryRow(ctx, `SELECT kind, consumed_at, revoked_at FROM tokens WHERE id = $1`, id).Scan(&kind, &consumed, &revoked)
		switch {
		case errors.Is(err, pgx.ErrNoRows), err == nil && (kind != store.TokenEnroll || revoked != nil):
			return notFound("enrollment token", id)
		case err != nil:
			return err
		case consumed != nil:
			return store.ErrTokenConsumed
		default:
			return store.ErrTokenExpired
		}
	})
	if err != nil {
		return fmt.Errorf("consume token %s: %w", id, err)
	}
	return nil
}

// ReleaseToken implements store.Keys.
func (db *DB) ReleaseToken(ctx context.Context, id, by string) error {
	_, err := db.q.Exec(ctx, `UPDATE tokens SET consumed_at = NULL, consumed_by = NULL WHERE id = $1 AND consumed_by = $2`, id, by)
	if err != nil {
		return fmt.Errorf("release token %s: %w", id, err)
	}
	return nil
}

func keyExists(ctx context.Context, tx querier, id string) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM daemon_keys WHERE key_id = $1)`, id).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return store.ErrKeyExists
	}
	return nil
}

// insertKey stores k; an id stored meanwhile by another transaction (for
// another worker, so not under our lock) is ErrKeyExists all the same.
func insertKey(ctx context.Context, tx querier, k store.Key) error {
	_, err := tx.Exec(ctx, `INSERT INTO daemon_keys (key_id, worker_id, namespace, public_key, created_at)
		VALUES ($1, $2, $3, $4, $5)`, k.ID, k.WorkerID, k.Namespace, k.PublicKey, ms(k.CreatedAt))
	if uniqueViolation(err, "daemon_keys_pkey") {
		return store.ErrKeyExists
	}
	return err
}

// AddKey implements store.Keys.
func (db *DB) AddKey(ctx context.Context, k store.Key) error {
	err := db.tx(ctx, func(tx querier) error {
		if err := lockWorkerKeys(ctx, tx, k.WorkerID); err != nil {
			return err
		}
		if err := keyExists(ctx, tx, k.ID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE daemon_keys SET revoked_at = $1 WHERE worker_id = $2 AND revoked_at IS NULL`,
			ms(k.CreatedAt), k.WorkerID); err != nil {
			return err
		}
		return insertKey(ctx, tx, k)
	})
	if err != nil {
		return fmt.Errorf("add key %s: %w", k.ID, err)
	}
	return nil
}

// RotateKey implements store.Keys.
func (db *DB) RotateKey(ctx context.Context, oldID string, k store.Key) error {
	err := db.tx(ctx, func(tx querier) error {
		if err := lockWorkerKeys(ctx, tx, k.WorkerID); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE daemon_keys SET revoked_at = $1, replaced_by = $2
			WHERE key_id = $3 AND worker_id = $4 AND revoked_at IS NULL`, ms(k.CreatedAt), k.ID, oldID, k.WorkerID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return store.ErrKeyNotCurrent
		}
		if err := keyExists(ctx, tx, k.ID); err != nil {
			return err
		}
		return insertKey(ctx, tx, k)
	})
	if err != nil {
		return fmt.Errorf("rotate key %s to %s: %w", oldID, k.ID, err)
	}
	return nil
}

// RevokeKey implements store.Keys.
func (db *DB) RevokeKey(ctx context.Context, workerID, keyID string, now time.Time) (store.Key, error) {
	var out store.Key
	err := db.tx(ctx, func(tx querier) error {
		if err := lockWorkerKeys(ctx, tx, workerID); err != nil {
			return err
		}
		var err error
		if keyID == "" {
			out, err = getKey(ctx, tx, `WHERE k.worker_id = $1 AND k.revoked_at IS NULL`, workerID)
		} else {
			out, err = getKey(ctx, tx, `WHERE k.key_id = $1 AND k.worker_id = $2`, keyID, workerID)
		}
		if err != nil || out.RevokedAt != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE daemon_keys SET revoked_at = $1 WHERE key_id = $2`, ms(now), out.ID); err != nil {
			return err
		}
		t := fromMs(ms(now))
		out.RevokedAt = &t
		return nil
	})
	if err != nil {
		return store.Key{}, fmt.Errorf("revoke key of worker %s: %w", workerID, err)
	}
	return out, nil
}

// RebindKey implements store.Keys.
func (db *DB) RebindKey(ctx context.Context, keyID, from, to string) error {
	err := db.tx(ctx, func(tx querier) error {
		if err := lockWorkerKeys(ctx, tx, from, to); err != nil {
			return err
		}
		var taken bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM daemon_keys WHERE worker_id = $1 AND revoked_at IS NULL)`, to).Scan(&taken); err != nil {
			return err
		}
		if taken {
			return store.ErrKeyNotCurrent
		}
		tag, err := tx.Exec(ctx, `UPDATE daemon_keys SET worker_id = $1 WHERE key_id = $2 AND worker_id = $3 AND revoked_at IS NULL`, to, keyID, from)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return store.ErrKeyNotCurrent
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("move key %s from worker %s to %s: %w", keyID, from, to, err)
	}
	return nil
}

// Key implements store.Keys.
func (db *DB) Key(ctx context.Context, id string) (store.Key, error) {
	k, err := getKey(ctx, db.q, `WHERE k.key_id = $1`, id)
	if err != nil {
		return store.Key{}, fmt.Errorf("key %q: %w", id, err)
	}
	return k, nil
}

// CurrentKey implements store.Keys.
func (db *DB) CurrentKey(ctx context.Context, workerID string) (store.Key, error) {
	k, err := getKey(ctx, db.q, `WHERE k.worker_id = $1 AND k.revoked_at IS NULL`, workerID)
	if err != nil {
		return store.Key{}, fmt.Errorf("current key of worker %s: %w", workerID, err)
	}
	return k, nil
}

// CurrentKeyOf implements store.Keys.
func (db *DB) CurrentKeyOf(ctx context.Context, namespace, machineID, helloLabel string) (store.Key, error) {
	k, err := getKey(ctx, db.q, `JOIN workers w ON w.id = k.worker_id
		WHERE w.namespace = $1 AND w.machine_id = $2 AND w.hello_label = $3 AND k.revoked_at IS NULL`, namespace, machineID, helloLabel)
	if err != nil {
		return store.Key{}, fmt.Errorf("current key of %s/%s: %w", machineID, helloLabel, err)
	}
	return k, nil
}

// WorkerKeys implements store.Keys.
func (db *DB) WorkerKeys(ctx context.Context, workerID string) ([]store.Key, error) {
	ks, err := listKeys(ctx, db.q, `WHERE k.worker_id = $1 ORDER BY k.created_at, k.key_id`, workerID)
	if err != nil {
		return nil, fmt.Errorf("keys of worker %s: %w", workerID, err)
	}
	return ks, nil
}

// NamespaceKeys implements store.Keys.
func (db *DB) NamespaceKeys(ctx context.Context, namespace string) ([]store.Key, error) {
	ks, err := listKeys(ctx, db.q, `WHERE k.namespace = $1 ORDER BY k.created_at, k.key_id`, namespace)
	if err != nil {
		return nil, fmt.Errorf("keys of namespace %s: %w", namespace, err)
	}
	return ks, nil
}
