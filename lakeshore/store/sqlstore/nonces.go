package sqlstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"nymph/lakeshore/store"
)

// nonceRowsPerInsert bounds the rows of one INSERT (three parameters each):
// far under either engine's parameter limit, and a batch of many signed
// requests still takes a statement or two.
const nonceRowsPerInsert = 256

// UseNonces implements store.Nonces: one transaction of multi-row INSERT …
// ON CONFLICT DO NOTHING RETURNING, whose returned rows are the new pairs.
// A pair another transaction is inserting makes this one wait for it
// (PostgreSQL) or cannot be (SQLite's one writer), so of racing stores
// exactly one sees a pair returned.
func (db *DB) UseNonces(ctx context.Context, uses []store.NonceUse) ([]bool, error) {
	fresh := make([]bool, len(uses))
	if len(uses) == 0 {
		return fresh, nil
	}
	// Sorted, so replicas recording overlapping batches take the pairs'
	// locks in one order; a pair listed again is left out (not new).
	order := make([]int, len(uses))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(strings.Compare(uses[a].KeyID, uses[b].KeyID), strings.Compare(uses[a].Nonce, uses[b].Nonce))
	})
	type pair struct{ key, nonce string }
	at := make(map[pair]int, len(uses))
	rows := order[:0]
	for _, i := range order {
		p := pair{uses[i].KeyID, uses[i].Nonce}
		if _, dup := at[p]; !dup {
			at[p] = i
			rows = append(rows, i)
		}
	}
	err := db.tx(ctx, func(q querier) error {
		clear(fresh)
		for rows := rows; len(rows) > 0; {
			n := min(len(rows), nonceRowsPerInsert)
			var b strings.Builder
			b.WriteString(`INSERT INTO nonces (key_id, nonce, expires_at) VALUES `)
			args := make([]any, 0, 3*n)
			for j, i := range rows[:n] {
				if j > 0 {
					b.WriteString(", ")
				}
				b.WriteString("(?, ?, ?)")
				args = append(args, uses[i].KeyID, uses[i].Nonce, ms(uses[i].Expires))
			}
			b.WriteString(` ON CONFLICT (key_id, nonce) DO NOTHING RETURNING key_id, nonce`)
			rs, err := q.Query(ctx, b.String(), args...)
			if err != nil {
				return err
			}
			for rs.Next() {
				var p pair
				if err := rs.Scan(&p.key, &p.nonce); err != nil {
					rs.Close()
					return err
				}
				if i, ok := at[p]; ok {
					fresh[i] = true
				}
			}
			err = rs.Err()
			if cerr := rs.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			rows = rows[n:]
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("record %d nonces: %w", len(uses), err)
	}
	return fresh, nil
}

// PurgeNonces implements store.Nonces.
func (db *DB) PurgeNonces(ctx context.Context, now time.Time) (int64, error) {
	n, err := db.writer().Exec(ctx, `DELETE FROM nonces WHERE expires_at <= ?`, ms(now))
	if err != nil {
		return 0, fmt.Errorf("purge nonces: %w", err)
	}
	return n, nil
}
