package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/store/postgres"
	"nymph/messages"
	"nymph/test/realparts"
)

// BenchmarkSignedVerifyGroupCommit is the part of every signed request that
// durable replay protection adds to: the Verifier of a real control plane
// (signature, key lookup in the store, the in-memory window, the nonce
// committed to the store) under 64 concurrent requests from 64 keys, on
// SQLite and on PostgreSQL (when installed). Each round verifies the same
// number of requests once with one transaction per nonce and once
// group-committed, and reports signed requests/s and store transactions per
// request for each, and the ratio of the rates:
//
//	go test -run '^$' -bench SignedVerifyGroupCommit -benchtime 3x ./lakeshore/controlplane/
func BenchmarkSignedVerifyGroupCommit(b *testing.B) {
	b.Run("sqlite", func(b *testing.B) { benchVerify(b, newEnv(b, quietUnthrottled)) })
	b.Run("postgres", func(b *testing.B) {
		pg := realparts.StartPostgres(b)
		db, err := postgres.Open(context.Background(), pg.DSN)
		if err != nil {
			b.Fatal(err)
		}
		benchVerify(b, newEnv(b, quietUnthrottled, func(c *Config) { c.Store = db }))
	})
}

func quietUnthrottled(c *Config) { c.Logger = zerolog.Nop(); c.KeyRequestRate = -1 }

func benchVerify(b *testing.B, e *env) {
	const clients, perClient = 64, 200
	ds := make([]*signedDaemon, clients)
	for i := range ds {
		ds[i] = enrollSigned(b, e, fmt.Sprint("m", i))
	}
	body := []byte{0x80}
	run := func(batch int) (perSec, txPerReq float64) {
		// Signed before the clock starts: only verification is timed.
		reqs := make([][]*http.Request, clients)
		for i, d := range ds {
			for range perClient {
				req, err := http.NewRequest(http.MethodPost, e.url+"/v1/daemon/poll", nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := d.key.SignRequest(req, body, e.clock.Now()); err != nil {
					b.Fatal(err)
				}
				reqs[i] = append(reqs[i], req)
			}
		}
		l := e.srv.nonces
		setBatch(l, batch)
		c0, r0 := l.commits.Load(), l.recorded.Load()
		v := e.srv.ident.verifier
		var failed atomic.Value
		var wg sync.WaitGroup
		start := time.Now()
		for i := range ds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, req := range reqs[i] {
					if _, err := v.Verify(context.Background(), req, body, e.clock.Now()); err != nil {
						failed.Store(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		if err, _ := failed.Load().(error); err != nil {
			b.Fatal(err)
		}
		n := l.recorded.Load() - r0
		return float64(n) / elapsed.Seconds(), float64(l.commits.Load()-c0) / float64(n)
	}
	report(b, run)
}

// setBatch sets how many nonces one of l's transactions may record.
func setBatch(l *nonceLedger, n int) {
	l.q.SetMax(n)
}

// report runs each round unbatched, then batched, and reports the means
// and the ratio of the rates.
func report(b *testing.B, run func(batch int) (perSec, txPerReq float64)) {
	var single, grouped, singleTx, groupedTx float64
	rounds := 0
	for b.Loop() {
		s, st := run(1)
		g, gt := run(nonceBatch)
		single, grouped, singleTx, groupedTx = single+s, grouped+g, singleTx+st, groupedTx+gt
		rounds++
	}
	n := float64(rounds)
	b.ReportMetric(single/n, "unbatched-req/s")
	b.ReportMetric(singleTx/n, "unbatched-tx/req")
	b.ReportMetric(grouped/n, "batched-req/s")
	b.ReportMetric(groupedTx/n, "batched-tx/req")
	b.ReportMetric(grouped/single, "batched/unbatched")
}

// BenchmarkSignedPollsGroupCommit is the same end to end: immediate signed
// polls from 32 concurrent daemons, each with a key of its own, through the
// real routes over loopback HTTP on SQLite, every nonce committed before
// its poll is answered, one transaction per nonce against group-committed.
// A poll does store work of its own, so the ratio is smaller here:
//
//	go test -run '^$' -bench SignedPollsGroupCommit -benchtime 3x ./lakeshore/controlplane/
func BenchmarkSignedPollsGroupCommit(b *testing.B) {
	const clients, perClient = 32, 100
	e := newEnv(b, quietUnthrottled)
	ds := make([]*signedDaemon, clients)
	for i := range ds {
		ds[i] = enrollSigned(b, e, fmt.Sprint("m", i))
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer hc.CloseIdleConnections()
	run := func(batch int) (perSec, txPerReq float64) {
		l := e.srv.nonces
		setBatch(l, batch)
		c0, r0 := l.commits.Load(), l.recorded.Load()
		var failed atomic.Value
		var wg sync.WaitGroup
		start := time.Now()
		for _, d := range ds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body, err := messages.Marshal(&messages.PollRequest{WorkerID: d.worker, Cursor: d.cursor})
				for range perClient {
					var req *http.Request
					if err == nil {
						req, err = http.NewRequest(http.MethodPost, e.url+"/v1/daemon/poll", bytes.NewReader(body))
					}
					if err == nil {
						req.Header.Set("Content-Type", messages.ContentType)
						err = d.key.SignRequest(req, body, e.clock.Now())
					}
					var r resp
					if err == nil {
						r, err = sendCopy(hc, e.url, req, body)
					}
					if err == nil && r.status != http.StatusOK {
						err = fmt.Errorf("signed poll: %d %q", r.status, r.body)
					}
					if err != nil {
						failed.Store(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		if err, _ := failed.Load().(error); err != nil {
			b.Fatal(err)
		}
		n := l.recorded.Load() - r0
		return float64(n) / elapsed.Seconds(), float64(l.commits.Load()-c0) / float64(n)
	}
	report(b, run)
}
