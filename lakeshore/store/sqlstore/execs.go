package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// Exec implements store.Execs.
func (db *DB) Exec(ctx context.Context, id string) (store.Exec, error) {
	e, err := scanExec(db.reader().QueryRow(ctx, `SELECT `+execColumns+` FROM execs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Exec{}, notFound("exec", id)
	}
	if err != nil {
		return store.Exec{}, fmt.Errorf("read exec %s: %w", id, err)
	}
	return e, nil
}

// execColumns are the columns scanExec reads, in its order.
const execColumns = `id, namespace, worker_id, command_id, command, stream, state, created_at,
	started_at, finished_at, result, output_len`

// scanExec reads one row of execColumns.
func scanExec(row interface{ Scan(...any) error }) (store.Exec, error) {
	var (
		e                 store.Exec
		created           int64
		started, finished sql.NullInt64
	)
	if err := row.Scan(&e.ID, &e.Namespace, &e.WorkerID, &e.CommandID, &e.Command, &e.Stream, &e.State, &created,
		&started, &finished, &e.Result, &e.OutputLen); err != nil {
		return store.Exec{}, err
	}
	e.CreatedAt, e.StartedAt, e.FinishedAt = fromMs(created), fromNullMs(started), fromNullMs(finished)
	return e, nil
}

// AppendOutput implements store.Execs.
func (db *DB) AppendOutput(ctx context.Context, id string, data []byte) (int64, error) {
	var total int64
	err := db.tx(ctx, func(tx querier) error {
		// The row lock orders appends from concurrent requests: each chunk
		// starts where the previous one ended. It also orders them with
		// the result, so no chunk lands after it.
		var state string
		err := tx.QueryRow(ctx, `SELECT output_len, state FROM execs WHERE id = ?`+tx.d.ForUpdate, id).Scan(&total, &state)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("exec", id)
		}
		if err != nil {
			return err
		}
		if err := execRunning(state); err != nil {
			return err
		}
		if len(data) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO exec_output (exec_id, start, size, data) VALUES (?, ?, ?, ?)`,
			id, total, len(data), data); err != nil {
			return err
		}
		total += int64(len(data))
		_, err = tx.Exec(ctx, `UPDATE execs SET output_len = ? WHERE id = ?`, total, id)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("append output of %s: %w", id, err)
	}
	return total, nil
}

// Output implements store.Execs.
func (db *DB) Output(ctx context.Context, id string, offset int64, max int) ([]byte, error) {
	if max <= 0 {
		return []byte{}, nil
	}
	rows, err := db.reader().Query(ctx, `SELECT start, data FROM exec_output WHERE exec_id = ? AND start + size > ? ORDER BY start`, id, offset)
	if err != nil {
		return nil, fmt.Errorf("read output of %s: %w", id, err)
	}
	defer rows.Close()
	out := []byte{}
	for rows.Next() && len(out) < max {
		var (
			start int64
			data  []byte
		)
		if err := rows.Scan(&start, &data); err != nil {
			return nil, fmt.Errorf("read output of %s: %w", id, err)
		}
		if skip := offset - start; skip > 0 {
			if skip >= int64(len(data)) {
				continue
			}
			data = data[skip:]
		}
		out = append(out, data[:min(len(data), max-len(out))]...)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read output of %s: %w", id, err)
	}
	return out, nil
}

// FinishExec implements store.Execs.
func (db *DB) FinishExec(ctx context.Context, id string, result []byte, now time.Time) (bool, error) {
	var applied bool
	err := db.tx(ctx, func(tx querier) error {
		applied = false
		var state string
		err := tx.QueryRow(ctx, `SELECT state FROM execs WHERE id = ?`+tx.d.ForUpdate, id).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("exec", id)
		}
		if err != nil {
			return err
		}
		if state == operatorapi.ExecFinished {
			return nil
		}
		applied = true
		_, err = tx.Exec(ctx, `UPDATE execs SET state = ?, result = ?, finished_at = ?, started_at = COALESCE(started_at, ?)
			WHERE id = ?`, operatorapi.ExecFinished, nonNilBytes(result), ms(now), ms(now), id)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("finish exec %s: %w", id, err)
	}
	return applied, nil
}

// FinishRunningExec implements store.Execs.
func (db *DB) FinishRunningExec(ctx context.Context, id string, result []byte, now time.Time) (store.Exec, error) {
	var e store.Exec
	err := db.tx(ctx, func(tx querier) error {
		// One statement for the report that finds its exec running, as
		// every first report does; the others read why it did not.
		var err error
		e, err = scanExec(tx.QueryRow(ctx, `UPDATE execs SET state = ?, result = ?, finished_at = ? WHERE id = ? AND state = ?
			RETURNING `+execColumns, operatorapi.ExecFinished, nonNilBytes(result), ms(now), id, operatorapi.ExecRunning))
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		var state string
		err = tx.QueryRow(ctx, `SELECT state FROM execs WHERE id = ?`, id).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("exec", id)
		}
		if err != nil {
			return err
		}
		if err := execRunning(state); err != nil {
			return err
		}
		// Running now, so queued when the update looked (delivered
		// between the two statements, on another replica).
		return store.ErrExecNotDelivered
	})
	if err != nil {
		return store.Exec{}, fmt.Errorf("finish exec %s: %w", id, err)
	}
	return e, nil
}

// execRunning refuses a report for an exec in state that is not running.
func execRunning(state string) error {
	switch state {
	case operatorapi.ExecRunning:
		return nil
	case operatorapi.ExecQueued:
		return store.ErrExecNotDelivered
	case operatorapi.ExecFinished:
		return store.ErrExecFinished
	}
	return fmt.Errorf("exec in unknown state %q", state)
}

// unfinishedExecStates is the states of an exec not finished, as the SQL
// literal that the partial index execs_unfinished (migration 0015) is
// defined with: a query that names them so, and not as parameters, lets
// the planner prove that its rows are all in that index.
const unfinishedExecStates = `('` + operatorapi.ExecQueued + `', '` + operatorapi.ExecRunning + `')`

const openExecsQuery = `SELECT worker_id, COUNT(*) FROM execs WHERE namespace = ? AND state IN ` + unfinishedExecStates + ` GROUP BY worker_id`

// OpenExecs implements store.Execs.
func (db *DB) OpenExecs(ctx context.Context, namespace string) (map[string]int, error) {
	rows, err := db.reader().Query(ctx, openExecsQuery, namespace)
	if err != nil {
		return nil, fmt.Errorf("count open execs: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			id string
			n  int
		)
		if err := rows.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("count open execs: %w", err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count open execs: %w", err)
	}
	return out, nil
}

const lostExecsQuery = `SELECT id, namespace, worker_id, label, state, reason FROM (
		SELECT e.id, e.namespace, e.worker_id, COALESCE(w.label, '') AS label, e.state, e.created_at,
			CASE WHEN w.id IS NULL THEN ? WHEN w.state = ? THEN ?
				WHEN e.state = ? AND ` + restartedCond + ` THEN ? WHEN e.state = ? AND ` + staleCond + ` THEN ? ELSE '' END AS reason
		FROM execs e LEFT JOIN workers w ON w.id = e.worker_id LEFT JOIN commands c ON c.id = e.command_id
		WHERE e.state IN ` + unfinishedExecStates + `) x
		WHERE reason <> '' ORDER BY created_at, id`

// LostExecs implements store.Execs. A queued exec is lost only with its
// worker's row or state: its command is still queued for a worker that is
// merely stale or restarted, and goes out when it polls.
func (db *DB) LostExecs(ctx context.Context, staleBefore time.Time) ([]store.LostExec, error) {
	rows, err := db.reader().Query(ctx, lostExecsQuery,
		store.LostRemoved, operatorapi.StateGone, store.LostGone,
		operatorapi.ExecRunning, store.LostRestarted, operatorapi.ExecRunning, ms(staleBefore), ms(staleBefore), store.LostStale)
	if err != nil {
		return nil, fmt.Errorf("find lost execs: %w", err)
	}
	defer rows.Close()
	out := []store.LostExec{}
	for rows.Next() {
		var l store.LostExec
		if err := rows.Scan(&l.ID, &l.Namespace, &l.WorkerID, &l.WorkerLabel, &l.State, &l.Reason); err != nil {
			return nil, fmt.Errorf("find lost execs: %w", err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("find lost execs: %w", err)
	}
	return out, nil
}

// ListExecs implements store.Execs.
func (db *DB) ListExecs(ctx context.Context, f store.ExecFilter) ([]store.Exec, error) {
	q := `SELECT ` + execColumns + ` FROM execs WHERE namespace = ?`
	args := []any{f.Namespace}
	if f.WorkerID != "" {
		q += ` AND worker_id = ?`
		args = append(args, f.WorkerID)
	}
	q += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	args = append(args, f.Limit)
	rows, err := db.reader().Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list execs: %w", err)
	}
	defer rows.Close()
	out := []store.Exec{}
	for rows.Next() {
		e, err := scanExec(rows)
		if err != nil {
			return nil, fmt.Errorf("list execs: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list execs: %w", err)
	}
	return out, nil
}
