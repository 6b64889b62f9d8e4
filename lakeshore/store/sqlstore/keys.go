package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"nymph/lakeshore/store"
)

const keyColumns = `k.key_id, k.worker_id, k.namespace, k.public_key, k.created_at, k.revoked_at, k.replaced_by`

func scanKey(row rowScanner) (store.Key, error) {
	var (
		k        store.Key
		created  int64
		revoked  sql.NullInt64
		replaced sql.NullString
	)
	if err := row.Scan(&k.ID, &k.WorkerID, &k.Namespace, &k.PublicKey, &created, &revoked, &replaced); err != nil {
		return store.Key{}, err
	}
	k.CreatedAt, k.RevokedAt, k.ReplacedBy = fromMs(created), fromNullMs(revoked), replaced.String
	return k, nil
}

func getKey(ctx context.Context, q querier, query string, args ...any) (store.Key, error) {
	k, err := scanKey(q.QueryRow(ctx, `SELECT `+keyColumns+` FROM daemon_keys k `+query, args...))
	if errors.Is(err, sql.ErrNoRows) {
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
// named workers, where the dialect has such a lock. Ids are locked in order
// so that two callers naming the same pair never wait on each other in a
// cycle.
func lockWorkerKeys(ctx context.Context, tx querier, workerIDs ...string) error {
	if tx.d.LockWorkerKeys == "" {
		return nil
	}
	if len(workerIDs) == 2 && workerIDs[1] < workerIDs[0] {
		workerIDs[0], workerIDs[1] = workerIDs[1], workerIDs[0]
	}
	for _, id := range workerIDs {
		if _, err := tx.Exec(ctx, tx.d.LockWorkerKeys, id); err != nil {
			return fmt.Errorf("lock keys of worker %s: %w", id, err)
		}
	}
	return nil
}

// ConsumeToken implements store.Keys. The conditional UPDATE is the whole
// guarantee: a second transaction updating the same row (on another
// replica, or behind the single writer) waits for the first to commit and
// then re-checks consumed_at, so of any number of hosts racing with one
// token exactly one sees its row change.
func (db *DB) ConsumeToken(ctx context.Context, id, by string, now time.Time) error {
	err := db.tx(ctx, func(tx querier) error {
		n, err := tx.affected(ctx, `UPDATE tokens SET consumed_at = ?, consumed_by = ?
			WHERE id = ? AND kind = ? AND consumed_at IS NULL AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)`,
			ms(now), by, id, store.TokenEnroll, ms(now))
		if err != nil {
			return err
		}
		if n == 1 {
			return nil
		}
		var (
			kind              string
			consumed, revoked sql.NullInt64
		)
		err = tx.QueryRow(ctx, `SELECT kind, consumed_at, revoked_at FROM tokens WHERE id = ?`, id).Scan(&kind, &consumed, &revoked)
		switch {
		case errors.Is(err, sql.ErrNoRows), err == nil && (kind != store.TokenEnroll || revoked.Valid):
			return notFound("enrollment token", id)
		case err != nil:
			return err
		case consumed.Valid:
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
	_, err := db.writer().Exec(ctx, `UPDATE tokens SET consumed_at = NULL, consumed_by = NULL WHERE id = ? AND consumed_by = ?`, id, by)
	if err != nil {
		return fmt.Errorf("release token %s: %w", id, err)
	}
	return nil
}

func keyExists(ctx context.Context, tx querier, id string) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM daemon_keys WHERE key_id = ?)`, id).Scan(&exists); err != nil {
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
		VALUES (?, ?, ?, ?, ?)`, k.ID, k.WorkerID, k.Namespace, k.PublicKey, ms(k.CreatedAt))
	if err != nil && tx.d.IsPrimaryKeyViolation != nil && tx.d.IsPrimaryKeyViolation(err, "daemon_keys") {
		return store.ErrKeyExists
	}
	return err
}

// AddKey implements store.Keys.
func (db *DB) AddKey(ctx context.Context, k store.Key) error {
	err := db.tx(ctx, func(tx querier) error { return addKey(ctx, tx, k) })
	if err != nil {
		return fmt.Errorf("add key %s: %w", k.ID, err)
	}
	return nil
}

func addKey(ctx context.Context, tx querier, k store.Key) error {
	if err := lockWorkerKeys(ctx, tx, k.WorkerID); err != nil {
		return err
	}
	if err := keyExists(ctx, tx, k.ID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE daemon_keys SET revoked_at = ? WHERE worker_id = ? AND revoked_at IS NULL`,
		ms(k.CreatedAt), k.WorkerID); err != nil {
		return err
	}
	return insertKey(ctx, tx, k)
}

// helloKey applies Hello.AddKey or Hello.RebindKey to the hello's worker id.
func helloKey(ctx context.Context, tx querier, h store.Hello, id string) error {
	if k := h.AddKey; k != nil {
		key := *k
		key.WorkerID = id
		if err := addKey(ctx, tx, key); err != nil {
			return fmt.Errorf("add key %s: %w", key.ID, err)
		}
	}
	if rb := h.RebindKey; rb != nil && rb.From != id {
		if err := rebindKey(ctx, tx, rb.KeyID, rb.From, id); err != nil {
			return fmt.Errorf("move key %s from worker %s to %s: %w", rb.KeyID, rb.From, id, err)
		}
	}
	return nil
}

// RotateKey implements store.Keys.
func (db *DB) RotateKey(ctx context.Context, oldID string, k store.Key) error {
	err := db.tx(ctx, func(tx querier) error {
		if err := lockWorkerKeys(ctx, tx, k.WorkerID); err != nil {
			return err
		}
		n, err := tx.affected(ctx, `UPDATE daemon_keys SET revoked_at = ?, replaced_by = ?
			WHERE key_id = ? AND worker_id = ? AND revoked_at IS NULL`, ms(k.CreatedAt), k.ID, oldID, k.WorkerID)
		if err != nil {
			return err
		}
		if n != 1 {
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
			out, err = getKey(ctx, tx, `WHERE k.worker_id = ? AND k.revoked_at IS NULL`, workerID)
		} else {
			out, err = getKey(ctx, tx, `WHERE k.key_id = ? AND k.worker_id = ?`, keyID, workerID)
		}
		if err != nil || out.RevokedAt != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE daemon_keys SET revoked_at = ? WHERE key_id = ?`, ms(now), out.ID); err != nil {
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
	err := db.tx(ctx, func(tx querier) error { return rebindKey(ctx, tx, keyID, from, to) })
	if err != nil {
		return fmt.Errorf("move key %s from worker %s to %s: %w", keyID, from, to, err)
	}
	return nil
}

func rebindKey(ctx context.Context, tx querier, keyID, from, to string) error {
	if err := lockWorkerKeys(ctx, tx, from, to); err != nil {
		return err
	}
	var taken bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM daemon_keys WHERE worker_id = ? AND revoked_at IS NULL)`, to).Scan(&taken); err != nil {
		return err
	}
	if taken {
		return store.ErrKeyNotCurrent
	}
	n, err := tx.affected(ctx, `UPDATE daemon_keys SET worker_id = ? WHERE key_id = ? AND worker_id = ? AND revoked_at IS NULL`, to, keyID, from)
	if err != nil {
		return err
	}
	if n != 1 {
		return store.ErrKeyNotCurrent
	}
	return nil
}

// Key implements store.Keys.
func (db *DB) Key(ctx context.Context, id string) (store.Key, error) {
	k, err := getKey(ctx, db.reader(), `WHERE k.key_id = ?`, id)
	if err != nil {
		return store.Key{}, fmt.Errorf("key %q: %w", id, err)
	}
	return k, nil
}

// CurrentKey implements store.Keys.
func (db *DB) CurrentKey(ctx context.Context, workerID string) (store.Key, error) {
	k, err := getKey(ctx, db.reader(), `WHERE k.worker_id = ? AND k.revoked_at IS NULL`, workerID)
	if err != nil {
		return store.Key{}, fmt.Errorf("current key of worker %s: %w", workerID, err)
	}
	return k, nil
}

// CurrentKeyOf implements store.Keys.
func (db *DB) CurrentKeyOf(ctx context.Context, namespace, machineID, helloLabel string) (store.Key, error) {
	k, err := getKey(ctx, db.reader(), `JOIN workers w ON w.id = k.worker_id
		WHERE w.namespace = ? AND w.machine_id = ? AND w.hello_label = ? AND k.revoked_at IS NULL`, namespace, machineID, helloLabel)
	if err != nil {
		return store.Key{}, fmt.Errorf("current key of %s/%s: %w", machineID, helloLabel, err)
	}
	return k, nil
}

// WorkerKeys implements store.Keys.
func (db *DB) WorkerKeys(ctx context.Context, workerID string) ([]store.Key, error) {
	ks, err := listKeys(ctx, db.reader(), `WHERE k.worker_id = ? ORDER BY k.created_at, k.key_id`, workerID)
	if err != nil {
		return nil, fmt.Errorf("keys of worker %s: %w", workerID, err)
	}
	return ks, nil
}

// NamespaceKeys implements store.Keys.
func (db *DB) NamespaceKeys(ctx context.Context, namespace string) ([]store.Key, error) {
	ks, err := listKeys(ctx, db.reader(), `WHERE k.namespace = ? ORDER BY k.created_at, k.key_id`, namespace)
	if err != nil {
		return nil, fmt.Errorf("keys of namespace %s: %w", namespace, err)
	}
	return ks, nil
}
