package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/store"
)

// BenchmarkMetricsScrape10k measures a whole scrape over loopback on the
// 10,000-worker fleet of the scale bench, each worker with a command
// queued: "uncached" reads the fleet counts every scrape (what one scrape
// per TTL pays), "cached" within the TTL (what every other scrape pays).
//
//	go test -run XXX -bench MetricsScrape10k -benchtime 50x ./lakeshore/controlplane/
func BenchmarkMetricsScrape10k(b *testing.B) {
	e := newEnv(b, withMetricsToken, func(c *Config) { c.Logger = zerolog.Nop() })
	seedFleet(b, e.srv.st, 10000, e.clock.Now())
	scrape := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			r := doCtx(b, context.Background(), http.MethodGet, e.url+"/metrics", "", testMetricsToken, nil)
			if r.status != http.StatusOK {
				b.Fatalf("scrape: %d", r.status)
			}
		}
	}
	f := e.scrape()
	if got := f.value("lakeshore_daemons", l("state", "joining")) + f.value("lakeshore_daemons", l("state", "active")); got != 10000 {
		b.Fatalf("the scrape counts %v daemons", got)
	}
	b.Run("uncached", func(b *testing.B) {
		e.srv.metrics.fleet.setTTL(0)
		scrape(b)
	})
	b.Run("cached", func(b *testing.B) {
		e.srv.metrics.fleet.setTTL(metricsCacheTTL)
		scrape(b)
	})
	b.Run("count-workers", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := e.srv.st.CountWorkers(context.Background(), e.clock.Now()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("count-queued", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := e.srv.st.CountQueued(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// seedFleet says hello for n workers straight to the store, 64 at a time,
// and queues one exec command for each.
func seedFleet(b *testing.B, st store.Store, n int, now time.Time) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	next := make(chan int)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				w, _, err := st.Hello(context.Background(), store.Hello{
					NewID: fmt.Sprintf("w%05d", i), Namespace: "default", MachineID: fmt.Sprint("m", i), Label: fmt.Sprint("l", i),
					Capabilities: store.Capabilities{Runners: []string{"process"}},
					Versions:     json.RawMessage(`{"daemon":"1.0","protocol":"1"}`), Now: now,
				})
				if err == nil {
					_, err = st.Enqueue(context.Background(), store.NewCommand{ID: fmt.Sprint("c", i), WorkerID: w.ID, Kind: "reset_backoff", Now: now}, nil)
				}
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}
