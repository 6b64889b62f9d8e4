//go:build scale

package scale

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

// operatorConns bounds the operator's connections to the control plane: an
// open-loop sender against a saturated server would otherwise open one per
// waiting request. Requests over it wait in the transport, their clock
// already running.
const operatorConns = 256

// operatorHTTP is the operator's client: keep-alive connections enough for
// the highest rate, so that queuing an exec does not open a connection.
func operatorHTTP() *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        operatorConns,
		MaxIdleConnsPerHost: operatorConns,
		MaxConnsPerHost:     operatorConns,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// operator queues execs through the operator API at a set rate, open loop:
// each one is sent on its own goroutine when the pacer says it is due,
// whatever became of the ones before.
type operator struct {
	client *opclient.Client
	tr     *tracker
	c      *counters
	// inflight counts the POSTs not answered yet.
	inflight atomic.Int64
}

// window is one offer window on the tracker's clock, and what was offered.
type window struct {
	start, end time.Duration
	offered    int
}

// offer queues rate execs a second for dur, round robin over targets
// (worker ids in a shuffled order, so that consecutive execs go to
// different daemons), as phase.
func (o *operator) offer(ctx context.Context, phase int, rate float64, dur time.Duration, targets []string) window {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	begin := time.Now()
	w := window{start: o.tr.now()}
	p := newPacer(rate, begin)
	end := begin.Add(dur)
	for {
		now := time.Now()
		if now.After(end) {
			now = end
		}
		for range p.due(now) {
			target := targets[w.offered%len(targets)]
			w.offered++
			o.inflight.Add(1)
			go o.send(ctx, phase, target)
		}
		if !now.Before(end) {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			w.end = o.tr.now()
			return w
		}
	}
	w.end = o.tr.now()
	return w
}

func (o *operator) send(ctx context.Context, phase int, workerID string) {
	defer o.inflight.Add(-1)
	sent := o.tr.now()
	acc, err := o.client.Exec(ctx, workerID, operatorapi.ExecRequest{Command: "true"})
	at := o.tr.now()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		o.c.note(err)
		if opclient.StatusOf(err) != 0 {
			o.c.opStatus.Add(1)
		} else {
			o.c.opTransport.Add(1)
		}
		return
	}
	o.tr.markQueued(acc.ExecID, phase, sent, at)
}

// idle says whether every exec sent has been answered.
func (o *operator) idle() bool { return o.inflight.Load() == 0 }
