package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// maxTail bounds the stdout tail kept per invocation; daemons send 4 KiB.
const maxTail = 16 << 10

const invocationColumns = `id, namespace, queue, module, qualname, runner, run_config, args, args_key, args_size,
	script, as_user, parent_id, root_id, run_body, state, worker_id, worker_label, command_id,
	created_at, started_at, finished_at, result, COALESCE(length(result), 0), error, stdout_tail, reported_at`

// listColumns leaves the bytes out: lists show state, not payloads.
const listColumns = `id, namespace, queue, module, qualname, runner, run_config, NULL, args_key, args_size,
	script, as_user, parent_id, root_id, NULL, state, worker_id, worker_label, command_id,
	created_at, started_at, finished_at, NULL, COALESCE(length(result), 0), error, stdout_tail, reported_at`

func scanInvocation(row rowScanner) (store.Invocation, error) {
	var (
		inv                          store.Invocation
		runConfig                    string
		script, asUser, parent, root sql.NullString
		errText                      sql.NullString
		created                      int64
		started, finished, reported  sql.NullInt64
	)
	err := row.Scan(&inv.ID, &inv.Namespace, &inv.Queue, &inv.Module, &inv.Qualname, &inv.Runner, &runConfig,
		&inv.Args, &inv.ArgsKey, &inv.ArgsSize, &script, &asUser, &parent, &root,
		&inv.RunBody, &inv.State, &inv.WorkerID, &inv.WorkerLabel, &inv.CommandID, &created, &started, &finished,
		&inv.Result, &inv.ResultSize, &errText, &inv.StdoutTail, &reported)
	if err != nil {
		return store.Invocation{}, err
	}
	inv.RunConfig = []byte(runConfig)
	inv.Script, inv.AsUser = nullString(script), nullString(asUser)
	inv.ParentInvocationID, inv.RootInvocationID = nullString(parent), nullString(root)
	if errText.Valid {
		inv.Error = []byte(errText.String)
	}
	inv.CreatedAt, inv.StartedAt, inv.FinishedAt, inv.ReportedAt = fromMs(created), fromNullMs(started), fromNullMs(finished), fromNullMs(reported)
	return inv, nil
}

func getInvocation(ctx context.Context, q querier, namespace, id string, lock bool) (store.Invocation, error) {
	query := `SELECT ` + invocationColumns + ` FROM invocations WHERE id = ?`
	args := []any{id}
	if namespace != "" {
		query += ` AND namespace = ?`
		args = append(args, namespace)
	}
	if lock {
		query += q.d.ForUpdate
	}
	inv, err := scanInvocation(q.QueryRow(ctx, query, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Invocation{}, notFound("invocation", id)
	}
	if err != nil {
		return store.Invocation{}, fmt.Errorf("read invocation %s: %w", id, err)
	}
	return inv, nil
}

// CreateInvocation implements store.Invocations.
func (db *DB) CreateInvocation(ctx context.Context, n store.NewInvocation) (store.Invocation, error) {
	inv, err := scanInvocation(db.writer().QueryRow(ctx, `INSERT INTO invocations (id, namespace, queue, module, qualname, runner, run_config,
		args, args_key, args_size, script, as_user, parent_id, root_id, run_body, state, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING `+invocationColumns,
		n.ID, n.Namespace, n.Queue, n.Module, n.Qualname, n.Runner, string(n.RunConfig),
		n.Args, n.ArgsKey, n.ArgsSize, strOrNil(n.Script), strOrNil(n.AsUser),
		strOrNil(n.ParentInvocationID), strOrNil(n.RootInvocationID),
		nonNilBytes(n.RunBody), operatorapi.InvocationQueued, ms(n.Now)))
	if err != nil {
		return store.Invocation{}, fmt.Errorf("create invocation %s: %w", n.ID, err)
	}
	return inv, nil
}

// Invocation implements store.Invocations.
func (db *DB) Invocation(ctx context.Context, namespace, id string) (store.Invocation, error) {
	return getInvocation(ctx, db.reader(), namespace, id, false)
}

// ListInvocations implements store.Invocations.
func (db *DB) ListInvocations(ctx context.Context, f store.InvocationFilter) ([]store.Invocation, error) {
	query := `SELECT ` + listColumns + ` FROM invocations WHERE namespace = ?`
	args := []any{f.Namespace}
	if f.State != "" {
		query += ` AND state = ?`
		args = append(args, f.State)
	}
	if f.Queue != "" {
		query += ` AND queue = ?`
		args = append(args, f.Queue)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	query += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	args = append(args, limit)
	rows, err := db.reader().Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list invocations: %w", err)
	}
	defer rows.Close()
	out := []store.Invocation{}
	for rows.Next() {
		inv, err := scanInvocation(rows)
		if err != nil {
			return nil, fmt.Errorf("list invocations: %w", err)
		}
		out = append(out, inv)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list invocations: %w", err)
	}
	return out, nil
}

// ClaimInvocations implements store.Invocations.
func (db *DB) ClaimInvocations(ctx context.Context, c store.Claim) ([]store.Invocation, error) {
	out := []store.Invocation{}
	if c.Limit <= 0 {
		return out, nil
	}
	// Most polls find nothing queued; finding that out without a
	// transaction keeps them cheap.
	var queued bool
	err := db.reader().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM invocations WHERE state = ? AND namespace =
		(SELECT namespace FROM workers WHERE id = ?))`, operatorapi.InvocationQueued, c.WorkerID).Scan(&queued)
	if err != nil {
		return nil, fmt.Errorf("claim invocations for %s: %w", c.WorkerID, err)
	}
	if !queued {
		return out, nil
	}
	err = db.tx(ctx, func(tx querier) error {
		out = []store.Invocation{}
		// The worker's row lock orders this claim with everything else
		// that numbers its commands, and with a second claim for it.
		if err := lockWorker(ctx, tx, c.WorkerID); err != nil {
			return err
		}
		w, err := getWorker(ctx, tx, "", c.WorkerID)
		if err != nil {
			return err
		}
		if w.State != operatorapi.StateActive || len(w.Capabilities.Runners) == 0 ||
			(w.HibernatingUntil != nil && w.HibernatingUntil.After(c.Now)) || w.HasJob() {
			return nil
		}
		limit := c.Limit
		if w.SingleJob {
			limit = 1
		}
		if max := int(w.Capabilities.MaxInvocations); max > 0 {
			var running int
			if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM invocations WHERE worker_id = ? AND state = ?`,
				w.ID, operatorapi.InvocationRunning).Scan(&running); err != nil {
				return fmt.Errorf("count running: %w", err)
			}
			limit = min(limit, max-running)
		}
		if limit <= 0 {
			return nil
		}
		query, args, ok := claimQuery(tx.d, w, limit)
		if !ok {
			return nil
		}
		rows, err := tx.Query(ctx, query, args...)
		if err != nil {
			return fmt.Errorf("find queued: %w", err)
		}
		ids, err := collectStrings(rows)
		if err != nil {
			return fmt.Errorf("find queued: %w", err)
		}
		seq := w.LastSeq
		for _, id := range ids {
			cmdID := c.NewID()
			// Where the dialect locks rows they are locked (SKIP LOCKED
			// passed over those another claimer holds); the state guard
			// keeps a second claimer off the invocation regardless.
			n, err := tx.affected(ctx, `UPDATE invocations SET state = ?, worker_id = ?, worker_label = ?, command_id = ?,
				started_at = ?, missing_since = NULL WHERE id = ? AND state = ?`,
				operatorapi.InvocationRunning, w.ID, w.Label, cmdID, ms(c.Now), id, operatorapi.InvocationQueued)
			if err != nil {
				return fmt.Errorf("claim %s: %w", id, err)
			}
			if n != 1 {
				continue
			}
			seq++
			if _, err := tx.Exec(ctx, `INSERT INTO commands (id, worker_id, seq, kind, body, created_at)
				SELECT ?, ?, ?, ?, run_body, ? FROM invocations WHERE id = ?`,
				cmdID, w.ID, seq, store.KindRun, ms(c.Now), id); err != nil {
				return fmt.Errorf("queue run of %s: %w", id, err)
			}
			inv, err := getInvocation(ctx, tx, "", id, false)
			if err != nil {
				return err
			}
			out = append(out, inv)
		}
		if seq != w.LastSeq {
			if _, err := tx.Exec(ctx, `UPDATE workers SET last_seq = ? WHERE id = ?`, seq, w.ID); err != nil {
				return fmt.Errorf("bump seq: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim invocations for %s: %w", c.WorkerID, err)
	}
	return out, nil
}

// claimQuery selects (and, where the dialect locks rows, locks) the ids of
// the oldest queued invocations w may take, skipping those another claimer
// has locked. The queues are w's routing membership (Worker.RoutingQueues),
// the rule an exec routed to a queue follows too; an invocation's queue
// never holds a '*', so only the worker's side is matched as a pattern.
// ok is false when w belongs to no queue.
func claimQuery(d *Dialect, w store.Worker, limit int) (query string, args []any, ok bool) {
	queues := w.RoutingQueues()
	if len(queues) == 0 {
		return "", nil, false
	}
	var b strings.Builder
	b.WriteString(`SELECT id FROM invocations WHERE namespace = ? AND state = ? AND (`)
	args = []any{w.Namespace, operatorapi.InvocationQueued}
	for i, q := range queues {
		if i > 0 {
			b.WriteString(` OR `)
		}
		if prefix, ok := strings.CutSuffix(q, "*"); ok {
			b.WriteString(`substr(queue, 1, length(CAST(? AS TEXT))) = CAST(? AS TEXT)`)
			args = append(args, prefix, prefix)
		} else {
			b.WriteString(`queue = ?`)
			args = append(args, q)
		}
	}
	b.WriteString(`)`)
	b.WriteString(` AND (runner = ''`)
	for _, r := range w.Capabilities.Runners {
		b.WriteString(` OR runner = ?`)
		args = append(args, r)
	}
	b.WriteString(`) ORDER BY created_at, id LIMIT ?` + d.forUpdateSkipLocked())
	args = append(args, limit)
	return b.String(), args, true
}

// FinishInvocation implements store.Invocations.
func (db *DB) FinishInvocation(ctx context.Context, f store.Finish) (store.Invocation, bool, error) {
	var (
		out     store.Invocation
		applied bool
	)
	errText := jsonOrNil(f.Error)
	var result any
	if f.Result != nil {
		result = f.Result
	}
	err := db.tx(ctx, func(tx querier) error {
		applied = false
		cur, err := getInvocation(ctx, tx, "", f.ID, true)
		if err != nil {
			return err
		}
		out = cur
		if !slices.Contains(f.From, cur.State) || (f.WorkerID != "" && cur.WorkerID != f.WorkerID) {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE invocations SET state = ?, result = ?, error = ?, finished_at = ?, missing_since = NULL
			WHERE id = ?`, f.State, result, errText, ms(f.Now), f.ID); err != nil {
			return fmt.Errorf("update: %w", err)
		}
		if _, err := withdrawRun(ctx, tx, cur.CommandID); err != nil {
			return err
		}
		applied = true
		out, err = getInvocation(ctx, tx, "", f.ID, false)
		return err
	})
	if err != nil {
		return store.Invocation{}, false, fmt.Errorf("finish invocation %s: %w", f.ID, err)
	}
	return out, applied, nil
}

// withdrawRun deletes a run command its worker has not been sent yet, so a
// finished or cancelled invocation is never started after all. A take
// delivering it at the same moment holds its row lock; the delete waits for
// it and then finds the command delivered (a single writer orders them
// anyway).
func withdrawRun(ctx context.Context, tx querier, commandID string) (bool, error) {
	if commandID == "" {
		return false, nil
	}
	n, err := tx.affected(ctx, `DELETE FROM commands WHERE id = ? AND delivered_at IS NULL AND acked_at IS NULL`, commandID)
	if err != nil {
		return false, fmt.Errorf("withdraw run command: %w", err)
	}
	return n == 1, nil
}

// ReportRunning implements store.Invocations.
func (db *DB) ReportRunning(ctx context.Context, r store.RunningReport) ([]store.LostInvocation, int, error) {
	reported := make(map[string]store.InvocationStatus, len(r.Statuses))
	for _, s := range r.Statuses {
		reported[s.InvocationID] = s
	}
	lost := []store.LostInvocation{}
	if len(r.Statuses) == 0 {
		var running bool
		err := db.reader().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM invocations WHERE worker_id = ? AND state = ?)`,
			r.WorkerID, operatorapi.InvocationRunning).Scan(&running)
		if err != nil {
			return nil, 0, fmt.Errorf("report running of %s: %w", r.WorkerID, err)
		}
		if !running {
			return lost, 0, nil
		}
	}
	n := 0
	err := db.tx(ctx, func(tx querier) error {
		lost, n = []store.LostInvocation{}, 0
		rows, err := tx.Query(ctx, `SELECT i.id, i.namespace, i.worker_label, i.missing_since,
			(c.id IS NULL OR c.acked_at IS NOT NULL)
			FROM invocations i LEFT JOIN commands c ON c.id = i.command_id
			WHERE i.worker_id = ? AND i.state = ? ORDER BY i.id`+tx.d.forUpdateOf("i"), r.WorkerID, operatorapi.InvocationRunning)
		if err != nil {
			return fmt.Errorf("read running: %w", err)
		}
		type running struct {
			id, ns, label string
			missing       sql.NullInt64
			received      bool
		}
		var all []running
		for rows.Next() {
			var x running
			if err := rows.Scan(&x.id, &x.ns, &x.label, &x.missing, &x.received); err != nil {
				rows.Close()
				return err
			}
			all = append(all, x)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		n = len(all)
		for _, x := range all {
			if st, ok := reported[x.id]; ok {
				if _, err := tx.Exec(ctx, `UPDATE invocations SET stdout_tail = ?, reported_at = ?, missing_since = NULL WHERE id = ?`,
					clipTail(st.StdoutTail), ms(r.Now), x.id); err != nil {
					return fmt.Errorf("record status of %s: %w", x.id, err)
				}
				continue
			}
			if !x.received {
				continue
			}
			if !x.missing.Valid {
				if _, err := tx.Exec(ctx, `UPDATE invocations SET missing_since = ? WHERE id = ?`, ms(r.Now), x.id); err != nil {
					return fmt.Errorf("mark %s missing: %w", x.id, err)
				}
				if r.MissingGrace > 0 {
					continue
				}
			} else if r.Now.Sub(fromMs(x.missing.Int64)) < r.MissingGrace {
				continue
			}
			lost = append(lost, store.LostInvocation{ID: x.id, Namespace: x.ns, WorkerID: r.WorkerID, WorkerLabel: x.label, Reason: store.LostMissing})
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("report running of %s: %w", r.WorkerID, err)
	}
	return lost, n, nil
}

// clipTail keeps the last maxTail bytes, cut at a character boundary.
func clipTail(s string) string {
	if len(s) <= maxTail {
		return s
	}
	s = s[len(s)-maxTail:]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return s
}

// restartedCond is true when the command aliased c was acknowledged by a
// process of the worker aliased w other than the one that said hello last.
// Both must have named themselves: a daemon that names no incarnation (the
// original one) never reads as restarted.
const restartedCond = `(w.incarnation <> '' AND c.acked_by <> '' AND c.acked_by <> w.incarnation)`

// staleCond is true when the worker aliased w was last seen before the
// deadline (the query's next two arguments), is not hibernating past it,
// and is not a single-job worker holding its job (it polls no more once it
// has its job, by design, so silence says nothing about it).
const staleCond = `(w.last_seen_at < ? AND (w.hibernating_until IS NULL OR w.hibernating_until < ?) AND w.job_seq = 0)`

// LostInvocations implements store.Invocations.
func (db *DB) LostInvocations(ctx context.Context, staleBefore time.Time) ([]store.LostInvocation, error) {
	rows, err := db.reader().Query(ctx, `SELECT id, namespace, worker_id, worker_label, reason FROM (
		SELECT i.id, i.namespace, i.worker_id, i.worker_label, i.created_at,
			CASE WHEN w.id IS NULL THEN ? WHEN w.state = ? THEN ?
				WHEN `+restartedCond+` THEN ? WHEN `+staleCond+` THEN ? ELSE '' END AS reason
		FROM invocations i LEFT JOIN workers w ON w.id = i.worker_id LEFT JOIN commands c ON c.id = i.command_id
		WHERE i.state = ?) x
		WHERE reason <> '' ORDER BY created_at, id`,
		store.LostRemoved, operatorapi.StateGone, store.LostGone, store.LostRestarted, ms(staleBefore), ms(staleBefore), store.LostStale,
		operatorapi.InvocationRunning)
	if err != nil {
		return nil, fmt.Errorf("find lost invocations: %w", err)
	}
	defer rows.Close()
	out := []store.LostInvocation{}
	for rows.Next() {
		var l store.LostInvocation
		if err := rows.Scan(&l.ID, &l.Namespace, &l.WorkerID, &l.WorkerLabel, &l.Reason); err != nil {
			return nil, fmt.Errorf("find lost invocations: %w", err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("find lost invocations: %w", err)
	}
	return out, nil
}

// CancelInvocation implements store.Invocations.
func (db *DB) CancelInvocation(ctx context.Context, namespace, id string, errJSON []byte, now time.Time) (store.Invocation, bool, error) {
	var (
		out       store.Invocation
		cancelled bool
	)
	errText := jsonOrNil(errJSON)
	err := db.tx(ctx, func(tx querier) error {
		cancelled = false
		cur, err := getInvocation(ctx, tx, namespace, id, true)
		if err != nil {
			return err
		}
		out = cur
		switch cur.State {
		case operatorapi.InvocationQueued:
		case operatorapi.InvocationRunning:
			withdrawn, err := withdrawRun(ctx, tx, cur.CommandID)
			if err != nil || !withdrawn {
				return err
			}
		default:
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE invocations SET state = ?, error = ?, finished_at = ?, missing_since = NULL WHERE id = ?`,
			operatorapi.InvocationCancelled, errText, ms(now), id); err != nil {
			return fmt.Errorf("cancel: %w", err)
		}
		cancelled = true
		out, err = getInvocation(ctx, tx, "", id, false)
		return err
	})
	if err != nil {
		return store.Invocation{}, false, fmt.Errorf("cancel invocation %s: %w", id, err)
	}
	return out, cancelled, nil
}
