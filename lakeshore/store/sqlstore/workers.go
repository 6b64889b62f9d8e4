package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

const workerColumns = `w.id, w.namespace, w.machine_id, w.hello_label, w.label, w.state, w.tags, w.queues,
	w.capabilities, w.versions, w.poll_queue, w.running, w.created_at, w.last_seen_at, w.hibernating_until,
	w.last_seq, w.delivered_seq, w.acked_seq, w.queues_added, w.queues_removed, w.incarnation,
	(SELECT COUNT(*) FROM commands c WHERE c.worker_id = w.id AND c.kind = 'setup' AND c.acked_at IS NULL),
	w.single_job, w.job_seq, CASE WHEN w.single_job THEN (SELECT COUNT(*) FROM commands c WHERE c.worker_id = w.id
		AND c.kind IN ('exec', 'run') AND c.delivered_at IS NULL AND c.acked_at IS NULL) ELSE 0 END,
	w.provider, w.instance_id`

func scanWorker(row rowScanner) (store.Worker, error) {
	var (
		w                                   store.Worker
		tags, queues, caps, versions, runng string
		queuesAdded, queuesRemoved          string
		created, seen                       int64
		hib                                 sql.NullInt64
	)
	err := row.Scan(&w.ID, &w.Namespace, &w.MachineID, &w.HelloLabel, &w.Label, &w.State, &tags, &queues,
		&caps, &versions, &w.PollQueue, &runng, &created, &seen, &hib,
		&w.LastSeq, &w.DeliveredSeq, &w.AckedSeq, &queuesAdded, &queuesRemoved, &w.Incarnation, &w.SetupPending,
		&w.SingleJob, &w.JobSeq, &w.JobsQueued, &w.Provider, &w.InstanceID)
	if err != nil {
		return store.Worker{}, err
	}
	w.CreatedAt, w.LastSeenAt, w.HibernatingUntil = fromMs(created), fromMs(seen), fromNullMs(hib)
	if err := errors.Join(
		decodeJSON(tags, &w.Tags), decodeJSON(queues, &w.Queues),
		decodeJSON(caps, &w.Capabilities), decodeJSON(runng, &w.Running),
	); err != nil {
		return store.Worker{}, fmt.Errorf("worker %s: %w", w.ID, err)
	}
	w.Versions = json.RawMessage(versions)
	if err := mergeQueueEdits(&w, queuesAdded, queuesRemoved); err != nil {
		return store.Worker{}, err
	}
	normalizeWorker(&w)
	return w, nil
}

func normalizeWorker(w *store.Worker) {
	if w.Tags == nil {
		w.Tags = []string{}
	}
	if w.Queues == nil {
		w.Queues = []string{}
	}
	if w.Capabilities.Runners == nil {
		w.Capabilities.Runners = []string{}
	}
	if w.Running == nil {
		w.Running = []store.InvocationStatus{}
	}
	if len(w.Versions) == 0 {
		w.Versions = json.RawMessage("{}")
	}
}

func getWorker(ctx context.Context, q querier, namespace, id string) (store.Worker, error) {
	query := `SELECT ` + workerColumns + ` FROM workers w WHERE w.id = ?`
	args := []any{id}
	if namespace != "" {
		query += ` AND w.namespace = ?`
		args = append(args, namespace)
	}
	w, err := scanWorker(q.QueryRow(ctx, query, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Worker{}, notFound("worker", id)
	}
	if err != nil {
		return store.Worker{}, fmt.Errorf("read worker %s: %w", id, err)
	}
	return w, nil
}

// lockWorker takes the worker's row lock, which every change to its command
// sequence holds until commit.
func lockWorker(ctx context.Context, tx querier, id string) error {
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM workers WHERE id = ?`+tx.d.ForUpdate, id).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return notFound("worker", id)
	}
	if err != nil {
		return fmt.Errorf("lock worker %s: %w", id, err)
	}
	return nil
}

// Worker implements store.Workers.
func (db *DB) Worker(ctx context.Context, namespace, id string) (store.Worker, error) {
	return getWorker(ctx, db.reader(), namespace, id)
}

// ListWorkers implements store.Workers.
func (db *DB) ListWorkers(ctx context.Context, namespace string) ([]store.Worker, error) {
	return listWorkers(ctx, db.reader(), namespace)
}

// WorkersByLabel implements store.Workers.
func (db *DB) WorkersByLabel(ctx context.Context, namespace, label string) ([]store.Worker, error) {
	rows, err := db.reader().Query(ctx, `SELECT `+workerColumns+` FROM workers w WHERE w.namespace = ? AND w.label = ? ORDER BY w.id`, namespace, label)
	if err != nil {
		return nil, fmt.Errorf("workers labelled %q: %w", label, err)
	}
	return scanWorkers(rows)
}

func listWorkers(ctx context.Context, q querier, namespace string) ([]store.Worker, error) {
	rows, err := q.Query(ctx, `SELECT `+workerColumns+` FROM workers w WHERE w.namespace = ? ORDER BY w.label, w.id`, namespace)
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	return scanWorkers(rows)
}

// scanWorkers reads every worker of rows and closes them.
func scanWorkers(rs *rows) ([]store.Worker, error) {
	defer rs.Close()
	out := []store.Worker{}
	for rs.Next() {
		w, err := scanWorker(rs)
		if err != nil {
			return nil, fmt.Errorf("read workers: %w", err)
		}
		out = append(out, w)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("read workers: %w", err)
	}
	return out, nil
}

// Hello implements store.Workers.
func (db *DB) Hello(ctx context.Context, h store.Hello) (store.Worker, bool, error) {
	var (
		out     store.Worker
		created bool
	)
	tags, err1 := encodeJSON(nonNil(h.Tags))
	queues, err2 := encodeJSON(nonNil(h.Queues))
	caps := h.Capabilities
	caps.Runners = nonNil(caps.Runners)
	capsJSON, err3 := encodeJSON(caps)
	if err := errors.Join(err1, err2, err3); err != nil {
		return store.Worker{}, false, fmt.Errorf("hello: encode: %w", err)
	}
	versions := string(h.Versions)
	if versions == "" {
		versions = "{}"
	}
	label := h.Label
	if label == "" {
		label = h.NewID
	}
	err := db.tx(ctx, func(tx querier) error {
		if err := adoptLaunched(ctx, tx, h); err != nil {
			return err
		}
		// Two replicas may see the same daemon's hello at once: the insert
		// that loses the unique race finds the winner's row and refreshes it.
		n, err := tx.affected(ctx, `INSERT INTO workers (id, namespace, machine_id, hello_label, label, state, tags, queues,
			capabilities, versions, created_at, last_seen_at, incarnation, single_job) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (namespace, machine_id, hello_label) DO NOTHING`,
			h.NewID, h.Namespace, h.MachineID, h.Label, label, operatorapi.StateActive, tags, queues, capsJSON, versions, ms(h.Now), ms(h.Now),
			h.Incarnation, h.SingleJob)
		if err != nil {
			return fmt.Errorf("insert worker: %w", err)
		}
		created = n == 1
		id := h.NewID
		if !created {
			err = tx.QueryRow(ctx, `UPDATE workers SET tags = ?, queues = ?, capabilities = ?, versions = ?, last_seen_at = ?,
				hibernating_until = NULL, incarnation = ?, single_job = ?,
				state = CASE WHEN EXISTS (SELECT 1 FROM commands c WHERE c.worker_id = workers.id AND c.kind = 'setup' AND c.acked_at IS NULL)
					THEN 'setting_up' ELSE 'active' END
				WHERE namespace = ? AND machine_id = ? AND hello_label = ? RETURNING id`,
				tags, queues, capsJSON, versions, ms(h.Now), h.Incarnation, h.SingleJob, h.Namespace, h.MachineID, h.Label).Scan(&id)
			if err != nil {
				return fmt.Errorf("update worker: %w", err)
			}
			if err := settleSingleJob(ctx, tx, id, h.SingleJob, h.Now); err != nil {
				return err
			}
		}
		// What refuses the hello comes last: its error rolls back the
		// row written above, incarnation and all.
		if err := bindHello(ctx, tx, h, id); err != nil {
			return err
		}
		if err := helloKey(ctx, tx, h, id); err != nil {
			return err
		}
		out, err = getWorker(ctx, tx, "", id)
		return err
	})
	if err != nil {
		return store.Worker{}, false, fmt.Errorf("hello: %w", err)
	}
	return out, created, nil
}

// RecordPoll implements store.Workers.
func (db *DB) RecordPoll(ctx context.Context, p store.Poll) (store.Worker, error) {
	running, err := encodeJSON(nonNilStatus(p.Running))
	if err != nil {
		return store.Worker{}, fmt.Errorf("poll: encode running: %w", err)
	}
	var caps any
	if p.UpdatedCapabilities != nil {
		c := *p.UpdatedCapabilities
		c.Runners = nonNil(c.Runners)
		s, err := encodeJSON(c)
		if err != nil {
			return store.Worker{}, fmt.Errorf("poll: encode capabilities: %w", err)
		}
		caps = s
	}
	var out store.Worker
	err = db.tx(ctx, func(tx querier) error {
		var (
			delivered   int64
			incarnation string
		)
		err := tx.QueryRow(ctx, `UPDATE workers SET last_seen_at = ?, poll_queue = ?, running = ?,
			capabilities = COALESCE(CAST(? AS TEXT), capabilities),
			hibernating_until = CASE WHEN hibernating_until IS NOT NULL AND hibernating_until <= ? THEN NULL ELSE hibernating_until END
			WHERE id = ? RETURNING delivered_seq, incarnation`, ms(p.Now), p.Queue, running, caps, ms(p.Now), p.WorkerID).Scan(&delivered, &incarnation)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("worker", p.WorkerID)
		}
		if err != nil {
			return fmt.Errorf("update worker: %w", err)
		}
		var stmts []Stmt
		if p.Cursor != nil {
			stmts = ackStmts(p.WorkerID, incarnation, min(*p.Cursor, delivered), p.Now)
		}
		stmts = append(stmts, stmt("settle state", `UPDATE workers SET state = 'active' WHERE id = ? AND (state = 'joining' OR (state = 'setting_up'
			AND NOT EXISTS (SELECT 1 FROM commands c WHERE c.worker_id = workers.id AND c.kind = 'setup' AND c.acked_at IS NULL)))`, p.WorkerID))
		if err := tx.execAll(ctx, stmts...); err != nil {
			return err
		}
		out, err = getWorker(ctx, tx, "", p.WorkerID)
		return err
	})
	if err != nil {
		return store.Worker{}, fmt.Errorf("poll: %w", err)
	}
	return out, nil
}

// AckThrough implements store.Workers: RecordPoll's acknowledgement alone,
// for the poll that follows every delivery (it only acknowledges what it
// received), without the worker's row rewritten and read back.
func (db *DB) AckThrough(ctx context.Context, workerID string, cursor int64, now time.Time) (int64, error) {
	var acked int64
	err := db.tx(ctx, func(tx querier) error {
		var (
			delivered   int64
			incarnation string
		)
		err := tx.QueryRow(ctx, `SELECT delivered_seq, acked_seq, incarnation FROM workers WHERE id = ?`+tx.d.ForUpdate,
			workerID).Scan(&delivered, &acked, &incarnation)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("worker", workerID)
		}
		if err != nil {
			return fmt.Errorf("lock worker: %w", err)
		}
		c := min(cursor, delivered)
		acked = max(acked, c)
		return ackThrough(ctx, tx, workerID, incarnation, c, now)
	})
	if err != nil {
		return 0, fmt.Errorf("ack through %d: %w", cursor, err)
	}
	return acked, nil
}

// touchChunk bounds the workers one statement of TouchWorkers updates;
// a power of 4.
const touchChunk = 64

// TouchWorkers implements store.Workers: one UPDATE ... FROM (VALUES ...)
// per chunk, whose RETURNING names the rows that exist. Each chunk is a
// transaction of its own, in worker id order: a flush of thousands of
// rows never holds the row locks (PostgreSQL) or the one writer (SQLite)
// that a poll or an exec of one of those workers waits for longer than
// one short statement, and two replicas flushing at once lock in the
// same order.
func (db *DB) TouchWorkers(ctx context.Context, seen []store.Seen) ([]string, error) {
	seen = slices.Clone(seen)
	slices.SortFunc(seen, func(a, b store.Seen) int { return strings.Compare(a.WorkerID, b.WorkerID) })
	var missing []string
	for start := 0; start < len(seen); {
		// Chunks of a few fixed sizes: each size is one statement text,
		// prepared once (stmtcache.go).
		n := touchChunk
		for n > len(seen)-start {
			n /= 4
		}
		chunk := seen[start : start+n]
		start += n
		var q strings.Builder
		q.WriteString(`UPDATE workers SET last_seen_at = CASE WHEN workers.last_seen_at < CAST(v.column2 AS BIGINT)
			THEN CAST(v.column2 AS BIGINT) ELSE workers.last_seen_at END FROM (VALUES `)
		args := make([]any, 0, 2*len(chunk))
		for i, s := range chunk {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(?, CAST(? AS BIGINT))")
			args = append(args, s.WorkerID, ms(s.At))
		}
		q.WriteString(`) AS v WHERE workers.id = v.column1 RETURNING workers.id`)
		var found []string
		err := db.tx(ctx, func(tx querier) error {
			rs, err := tx.Query(ctx, q.String(), args...)
			if err != nil {
				return err
			}
			found, err = collectStrings(rs)
			return err
		})
		if err != nil {
			return missing, fmt.Errorf("touch workers: %w", err)
		}
		if len(found) == len(chunk) {
			continue
		}
		have := make(map[string]bool, len(found))
		for _, id := range found {
			have[id] = true
		}
		for _, s := range chunk {
			if !have[s.WorkerID] {
				missing = append(missing, s.WorkerID)
			}
		}
	}
	return missing, nil
}

// ackThrough acknowledges every command up to c, which the caller clamped to
// the highest sequence ever delivered (read in the same statement that took
// the worker's row), so a bogus or stale cursor never acknowledges a
// command not yet sent. The commands are marked received by incarnation,
// the process that sent the cursor.
func ackThrough(ctx context.Context, tx querier, workerID, incarnation string, c int64, now time.Time) error {
	return tx.execAll(ctx, ackStmts(workerID, incarnation, c, now)...)
}

// ackStmts are ackThrough's statements (none for a cursor of 0).
func ackStmts(workerID, incarnation string, c int64, now time.Time) []Stmt {
	if c <= 0 {
		return nil
	}
	return []Stmt{
		stmt("ack commands", `UPDATE commands SET acked_at = ?, delivered_at = COALESCE(delivered_at, ?), acked_by = ?
		WHERE worker_id = ? AND seq <= ? AND acked_at IS NULL`, ms(now), ms(now), incarnation, workerID, c),
		stmt("ack seq", `UPDATE workers SET acked_seq = ? WHERE id = ? AND acked_seq < ?`, c, workerID, c),
	}
}

// DeleteWorker implements store.Workers.
func (db *DB) DeleteWorker(ctx context.Context, namespace, id string) error {
	err := db.tx(ctx, func(tx querier) error {
		n, err := tx.affected(ctx, `DELETE FROM workers WHERE id = ? AND namespace = ?`, id, namespace)
		if err != nil {
			return err
		}
		if n == 0 {
			return notFound("worker", id)
		}
		_, err = tx.Exec(ctx, `DELETE FROM commands WHERE worker_id = ?`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete worker: %w", err)
	}
	return nil
}

// DeleteWorkersSeenBefore implements store.Workers.
func (db *DB) DeleteWorkersSeenBefore(ctx context.Context, namespace string, t time.Time) ([]string, error) {
	var ids []string
	err := db.tx(ctx, func(tx querier) error {
		rows, err := tx.Query(ctx, `DELETE FROM workers WHERE namespace = ? AND last_seen_at < ? RETURNING id`, namespace, ms(t))
		if err != nil {
			return err
		}
		ids, err = collectStrings(rows)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if _, err := tx.Exec(ctx, `DELETE FROM commands WHERE worker_id = ?`, id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("delete workers seen before %s: %w", t.Format(time.RFC3339), err)
	}
	slices.Sort(ids)
	return nonNil(ids), nil
}

func nonNilStatus(s []store.InvocationStatus) []store.InvocationStatus {
	if s == nil {
		return []store.InvocationStatus{}
	}
	return s
}

// settleSingleJob is what a hello does to the job a single-job worker had.
// Once that job has ended the hello is a new daemon process (the old one
// sent nothing but its outcome after taking the job, and never acknowledged
// the batch that brought it): everything delivered to the old process is
// acknowledged, so none of it runs again, and the worker may take a job
// again. A job not ended stays its job, unless the worker is single-job no
// more.
func settleSingleJob(ctx context.Context, tx querier, workerID string, singleJob bool, now time.Time) error {
	var jobSeq, delivered int64
	if err := tx.QueryRow(ctx, `SELECT job_seq, delivered_seq FROM workers WHERE id = ?`, workerID).Scan(&jobSeq, &delivered); err != nil {
		return fmt.Errorf("read single job: %w", err)
	}
	if jobSeq == 0 {
		return nil
	}
	ended, err := jobEnded(ctx, tx, workerID, jobSeq)
	if err != nil {
		return err
	}
	if ended {
		// The old process is gone, so it acknowledges nothing itself:
		// these acks name no incarnation.
		if err := ackThrough(ctx, tx, workerID, "", delivered, now); err != nil {
			return err
		}
	}
	if ended || !singleJob {
		if _, err := tx.Exec(ctx, `UPDATE workers SET job_seq = 0 WHERE id = ?`, workerID); err != nil {
			return fmt.Errorf("clear single job: %w", err)
		}
	}
	return nil
}

// jobEnded reports whether the job command at seq is over: acknowledged,
// gone, its exec finished or its invocation in a final state.
func jobEnded(ctx context.Context, tx querier, workerID string, seq int64) (bool, error) {
	var acked, execDone, runDone bool
	err := tx.QueryRow(ctx, `SELECT c.acked_at IS NOT NULL,
		EXISTS (SELECT 1 FROM execs e WHERE e.command_id = c.id AND e.state = ?),
		EXISTS (SELECT 1 FROM invocations i WHERE i.command_id = c.id AND i.state NOT IN (?, ?))
		FROM commands c WHERE c.worker_id = ? AND c.seq = ?`,
		operatorapi.ExecFinished, operatorapi.InvocationQueued, operatorapi.InvocationRunning, workerID, seq).Scan(&acked, &execDone, &runDone)
	if errors.Is(err, sql.ErrNoRows) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("read single job: %w", err)
	}
	return acked || execDone || runDone, nil
}

// heldJob returns the *store.SingleJobError that refuses another job for
// a single-job worker that has its job (jobSeq, its job's seq, 0 while it
// has none delivered), or nil when it may take one. The caller holds the
// worker's row lock.
func heldJob(ctx context.Context, tx querier, workerID string, jobSeq int64) (*store.SingleJobError, error) {
	query := `SELECT id, kind FROM commands WHERE worker_id = ? AND seq = ?`
	args := []any{workerID, jobSeq}
	if jobSeq == 0 {
		query = `SELECT id, kind FROM commands WHERE worker_id = ? AND kind IN ('exec', 'run')
			AND delivered_at IS NULL AND acked_at IS NULL ORDER BY seq LIMIT 1`
		args = []any{workerID}
	}
	var cmdID, kind string
	err := tx.QueryRow(ctx, query, args...).Scan(&cmdID, &kind)
	if errors.Is(err, sql.ErrNoRows) {
		if jobSeq == 0 {
			return nil, nil
		}
		return &store.SingleJobError{WorkerID: workerID, Job: fmt.Sprintf("command seq %d", jobSeq), Delivered: true}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read single job: %w", err)
	}
	job, err := jobName(ctx, tx, cmdID, kind)
	if err != nil {
		return nil, err
	}
	return &store.SingleJobError{WorkerID: workerID, Job: job, Delivered: jobSeq > 0}, nil
}

// jobName names a job command for an operator: by its exec or invocation
// id when it has one.
func jobName(ctx context.Context, tx querier, cmdID, kind string) (string, error) {
	table, noun := "execs", "exec"
	if kind == store.KindRun {
		table, noun = "invocations", "run"
	}
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM `+table+` WHERE command_id = ?`, cmdID).Scan(&id)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "command " + cmdID, nil
	case err != nil:
		return "", fmt.Errorf("name single job: %w", err)
	}
	return noun + " " + id, nil
}
