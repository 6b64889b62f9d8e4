package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// CreateProvider implements store.Providers.
func (db *DB) CreateProvider(ctx context.Context, p store.Provider) error {
	n, err := db.writer().affected(ctx, `INSERT INTO providers (name, kind, spec, created_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (name) DO NOTHING`, p.Name, p.Kind, string(p.Spec), ms(p.CreatedAt))
	if err != nil {
		return fmt.Errorf("create provider %q: %w", p.Name, err)
	}
	if n == 0 {
		return fmt.Errorf("provider %q: %w", p.Name, store.ErrExists)
	}
	return nil
}

// Provider implements store.Providers.
func (db *DB) Provider(ctx context.Context, name string) (store.Provider, error) {
	var (
		p       store.Provider
		spec    string
		created int64
	)
	err := db.reader().QueryRow(ctx, `SELECT name, kind, spec, created_at FROM providers WHERE name = ?`, name).
		Scan(&p.Name, &p.Kind, &spec, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Provider{}, notFound("provider", name)
	}
	if err != nil {
		return store.Provider{}, fmt.Errorf("read provider %q: %w", name, err)
	}
	p.Spec, p.CreatedAt = []byte(spec), fromMs(created)
	return p, nil
}

// ListProviders implements store.Providers.
func (db *DB) ListProviders(ctx context.Context) ([]store.Provider, error) {
	rows, err := db.reader().Query(ctx, `SELECT name, kind, spec, created_at FROM providers ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list providers: %w", err)
	}
	defer rows.Close()
	out := []store.Provider{}
	for rows.Next() {
		var (
			p       store.Provider
			spec    string
			created int64
		)
		if err := rows.Scan(&p.Name, &p.Kind, &spec, &created); err != nil {
			return nil, fmt.Errorf("list providers: %w", err)
		}
		p.Spec, p.CreatedAt = []byte(spec), fromMs(created)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list providers: %w", err)
	}
	return out, nil
}

// DeleteProvider implements store.Providers.
func (db *DB) DeleteProvider(ctx context.Context, name string) error {
	n, err := db.writer().affected(ctx, `DELETE FROM providers WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("delete provider %q: %w", name, err)
	}
	if n == 0 {
		return notFound("provider", name)
	}
	return nil
}

// launchMachinePrefix fills a pending row's machine id until its daemon
// says who it is: no daemon sends it, so no hello matches the row by
// identity, only by its token (adoptLaunched).
const launchMachinePrefix = "launch:"

// LaunchWorker implements store.Providers.
func (db *DB) LaunchWorker(ctx context.Context, l store.Launch) (store.Worker, error) {
	tags, err1 := encodeJSON(nonNil(l.Tags))
	queues, err2 := encodeJSON(nonNil(l.Queues))
	caps, err3 := encodeJSON(store.Capabilities{Runners: nonNil(l.Runners)})
	if err := errors.Join(err1, err2, err3); err != nil {
		return store.Worker{}, fmt.Errorf("launch worker: encode: %w", err)
	}
	t := l.Token
	var out store.Worker
	err := db.tx(ctx, func(tx querier) error {
		if _, err := tx.Exec(ctx, `INSERT INTO workers (id, namespace, machine_id, hello_label, label, state, tags, queues,
			capabilities, versions, created_at, last_seen_at, incarnation, single_job, provider, last_seq)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, '{}', ?, ?, '', ?, ?, ?)`,
			l.WorkerID, l.Namespace, launchMachinePrefix+l.WorkerID, l.Label, l.Label, operatorapi.StatePending, tags, queues,
			caps, ms(l.Now), ms(l.Now), false, l.Provider, int64(len(l.Setup))); err != nil {
			return fmt.Errorf("insert worker: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO tokens (id, kind, namespace, label, hash, created_at, expires_at, fleet, worker_id)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, t.ID, t.Kind, t.Namespace, t.Label, t.Hash, ms(t.CreatedAt),
			msPtr(t.ExpiresAt), false, l.WorkerID); err != nil {
			return fmt.Errorf("insert token: %w", err)
		}
		for i, c := range l.Setup {
			if _, err := tx.Exec(ctx, `INSERT INTO commands (id, worker_id, seq, kind, body, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
				c.ID, l.WorkerID, int64(i+1), store.KindSetup, nonNilBytes(c.Body), ms(c.Now)); err != nil {
				return fmt.Errorf("insert setup %d: %w", i+1, err)
			}
		}
		var err error
		out, err = getWorker(ctx, tx, "", l.WorkerID)
		return err
	})
	if err != nil {
		return store.Worker{}, fmt.Errorf("launch worker %s: %w", l.WorkerID, err)
	}
	return out, nil
}

// SetInstance implements store.Providers.
func (db *DB) SetInstance(ctx context.Context, workerID, instanceID string) error {
	n, err := db.writer().affected(ctx, `UPDATE workers SET instance_id = ? WHERE id = ?`, instanceID, workerID)
	if err != nil {
		return fmt.Errorf("set instance of worker %s: %w", workerID, err)
	}
	if n == 0 {
		return notFound("worker", workerID)
	}
	return nil
}

// adoptLaunched gives the pending row a launch made for h.Adopt's worker
// the hello's identity, so the insert that follows finds it and the hello
// refreshes it like any re-hello: state, capabilities and the token
// binding all follow. Only a row no daemon has spoken for yet is adopted,
// and only when no other row of the namespace has that identity (then the
// hello goes on as it would have, and the token rules decide).
func adoptLaunched(ctx context.Context, tx querier, h store.Hello) error {
	if h.Adopt == "" {
		return nil
	}
	_, err := tx.Exec(ctx, `UPDATE workers SET machine_id = ?, hello_label = ?
		WHERE state = 'pending' AND namespace = ? AND machine_id = CAST(? AS TEXT) || id
		AND id = (SELECT t.worker_id FROM tokens t WHERE t.id = ?)
		AND NOT EXISTS (SELECT 1 FROM workers o WHERE o.namespace = ? AND o.machine_id = ? AND o.hello_label = ?)`,
		h.MachineID, h.Label, h.Namespace, launchMachinePrefix, h.Adopt, h.Namespace, h.MachineID, h.Label)
	if err != nil {
		return fmt.Errorf("adopt launched worker: %w", err)
	}
	return nil
}
