package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"nymph/lakeshore/store"
)

// CreateQueue implements store.Queues.
func (db *DB) CreateQueue(ctx context.Context, namespace, name string, now time.Time) (bool, error) {
	n, err := db.writer().affected(ctx, `INSERT INTO queues (namespace, name, created_at) VALUES (?, ?, ?)
		ON CONFLICT (namespace, name) DO NOTHING`, namespace, name, ms(now))
	if err != nil {
		return false, fmt.Errorf("create queue %q: %w", name, err)
	}
	return n > 0, nil
}

// ListQueues implements store.Queues.
func (db *DB) ListQueues(ctx context.Context, namespace string) ([]store.Queue, error) {
	byName := map[string]*store.Queue{}
	get := func(name string) *store.Queue {
		q, ok := byName[name]
		if !ok {
			q = &store.Queue{Name: name, Members: []string{}}
			byName[name] = q
		}
		return q
	}
	// One snapshot for both reads where the engine has them, so a queue
	// and its members agree.
	var workers []store.Worker
	err := db.readTx(ctx, func(tx querier) error {
		clear(byName)
		rows, err := tx.Query(ctx, `SELECT name, created_at FROM queues WHERE namespace = ?`, namespace)
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				name    string
				created int64
			)
			if err := rows.Scan(&name, &created); err != nil {
				rows.Close()
				return err
			}
			t := fromMs(created)
			get(name).CreatedAt = &t
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		workers, err = listWorkers(ctx, tx, namespace)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	for _, w := range workers {
		for _, name := range joinedQueues(w) {
			get(name)
		}
		for _, name := range w.Queues {
			get(name).Members = append(get(name).Members, w.ID)
		}
		if w.PollQueue != "" && !slices.Contains(w.Queues, w.PollQueue) && !slices.Contains(w.QueuesRemoved, w.PollQueue) {
			get(w.PollQueue).Members = append(get(w.PollQueue).Members, w.ID)
		}
	}
	out := make([]store.Queue, 0, len(byName))
	for _, q := range byName {
		sort.Strings(q.Members)
		out = append(out, *q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// joinedQueues are the queues a worker's daemon brought into existence: its
// lanes and the queue it polls, whatever the operator did to its membership.
func joinedQueues(w store.Worker) []string {
	out := slices.Clone(w.Lanes)
	if w.PollQueue != "" {
		out = append(out, w.PollQueue)
	}
	return out
}

// EditWorkerQueues implements store.Queues.
func (db *DB) EditWorkerQueues(ctx context.Context, e store.QueueEdit) (store.Worker, error) {
	var out store.Worker
	err := db.tx(ctx, func(tx querier) error {
		var added, removed string
		err := tx.QueryRow(ctx, `SELECT queues_added, queues_removed FROM workers WHERE id = ? AND namespace = ?`+tx.d.ForUpdate,
			e.WorkerID, e.Namespace).Scan(&added, &removed)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("worker", e.WorkerID)
		}
		if err != nil {
			return fmt.Errorf("read worker: %w", err)
		}
		var curAdded, curRemoved []string
		if err := errors.Join(decodeJSON(added, &curAdded), decodeJSON(removed, &curRemoved)); err != nil {
			return fmt.Errorf("worker %s: %w", e.WorkerID, err)
		}
		if len(e.Add) > 0 {
			known, err := knownQueues(ctx, tx, e.Namespace)
			if err != nil {
				return err
			}
			for _, q := range e.Add {
				if _, ok := known[q]; !ok {
					return &store.UnknownQueueError{Name: q}
				}
			}
		}
		newAdded, newRemoved := store.ApplyQueueEdit(curAdded, curRemoved, e)
		a, err1 := encodeJSON(newAdded)
		r, err2 := encodeJSON(newRemoved)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE workers SET queues_added = ?, queues_removed = ? WHERE id = ?`, a, r, e.WorkerID); err != nil {
			return fmt.Errorf("update worker: %w", err)
		}
		out, err = getWorker(ctx, tx, e.Namespace, e.WorkerID)
		return err
	})
	if err != nil {
		return store.Worker{}, fmt.Errorf("edit queues of %s: %w", e.WorkerID, err)
	}
	return out, nil
}

// knownQueues is every queue name that exists in the namespace.
func knownQueues(ctx context.Context, tx querier, namespace string) (map[string]struct{}, error) {
	known := map[string]struct{}{}
	rows, err := tx.Query(ctx, `SELECT name FROM queues WHERE namespace = ?`, namespace)
	if err != nil {
		return nil, fmt.Errorf("read queues: %w", err)
	}
	names, err := collectStrings(rows)
	if err != nil {
		return nil, fmt.Errorf("read queues: %w", err)
	}
	for _, n := range names {
		known[n] = struct{}{}
	}
	rows, err = tx.Query(ctx, `SELECT queues, queues_added, poll_queue FROM workers WHERE namespace = ?`, namespace)
	if err != nil {
		return nil, fmt.Errorf("read worker queues: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			lanesJSON, addedJSON, poll string
			lanes, added               []string
		)
		if err := rows.Scan(&lanesJSON, &addedJSON, &poll); err != nil {
			return nil, fmt.Errorf("read worker queues: %w", err)
		}
		// A row that does not decode contributes nothing rather than failing
		// every edit in the namespace.
		_ = decodeJSON(lanesJSON, &lanes)
		_ = decodeJSON(addedJSON, &added)
		for _, q := range append(lanes, added...) {
			known[q] = struct{}{}
		}
		if poll != "" {
			known[poll] = struct{}{}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read worker queues: %w", err)
	}
	return known, nil
}

// mergeQueueEdits turns a scanned worker's queues (its lanes, as the column
// stores them) into the effective membership, keeping the sources apart.
func mergeQueueEdits(w *store.Worker, addedJSON, removedJSON string) error {
	w.Lanes = nonNil(w.Queues)
	if err := errors.Join(decodeJSON(addedJSON, &w.QueuesAdded), decodeJSON(removedJSON, &w.QueuesRemoved)); err != nil {
		return fmt.Errorf("worker %s: queue edits: %w", w.ID, err)
	}
	w.QueuesAdded, w.QueuesRemoved = nonNil(w.QueuesAdded), nonNil(w.QueuesRemoved)
	w.Queues = store.EffectiveQueues(w.Lanes, w.QueuesAdded, w.QueuesRemoved)
	return nil
}
