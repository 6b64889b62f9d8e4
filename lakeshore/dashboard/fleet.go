package dashboard

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// PageSize is how many daemons one fleet page shows.
const PageSize = 100

// maxPage bounds ?page= (a million daemons at PageSize).
const maxPage = 10_000

// fleetQuery is the fleet page's filter, from its URL.
type fleetQuery struct {
	State, Queue, Label string
	Page                int
}

func parseFleetQuery(q url.Values) (fleetQuery, bool) {
	f := fleetQuery{State: q.Get("state"), Queue: q.Get("queue"), Label: q.Get("label"), Page: 1}
	if p := q.Get("page"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > maxPage {
			return f, false
		}
		f.Page = n
	}
	return f, true
}

// values is the filter as a query string, page included when past the
// first.
func (f fleetQuery) values(page int) url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"state": f.State, "queue": f.Queue, "label": f.Label} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if page > 1 {
		q.Set("page", strconv.Itoa(page))
	}
	return q
}

// fleetView is what fleet.html and its fragments render.
type fleetView struct {
	Query   fleetQuery
	List    operatorapi.WorkerList
	From    int
	To      int
	Prev    string
	Next    string
	Live    string
	Notice  string
	States  []string
	Counted int
}

func (d *Dashboard) fleet(ctx context.Context, q fleetQuery) (fleetView, error) {
	list, err := d.api.ListWorkerPage(ctx, opclient.WorkerFilter{State: q.State, Queue: q.Queue, LabelPrefix: q.Label,
		Limit: PageSize, Offset: (q.Page - 1) * PageSize})
	if err != nil {
		return fleetView{}, err
	}
	v := fleetView{Query: q, List: list, States: operatorapi.States}
	for _, c := range list.Counts {
		v.Counted += c.Count
	}
	if len(list.Workers) > 0 {
		v.From = (q.Page-1)*PageSize + 1
		v.To = v.From + len(list.Workers) - 1
	}
	if q.Page > 1 {
		v.Prev = "/fleet?" + q.values(q.Page-1).Encode()
	}
	if q.Page*PageSize < list.Total {
		v.Next = "/fleet?" + q.values(q.Page+1).Encode()
	}
	v.Live = "/fleet/live?" + q.values(q.Page).Encode()
	return v, nil
}

func (d *Dashboard) handleFleet(w http.ResponseWriter, r *http.Request, s store.Session) {
	q, ok := parseFleetQuery(r.URL.Query())
	if !ok {
		d.failS(w, s, http.StatusBadRequest, "page must be a whole number from 1 to 10000.")
		return
	}
	v, err := d.fleet(r.Context(), q)
	if err != nil {
		d.apiFail(w, r, s, err)
		return
	}
	if r.URL.Query().Get("did") == "kill" {
		v.Notice = "The daemon was killed."
	}
	d.render(w, http.StatusOK, "fleet", view{Title: "Fleet", CSRF: s.CSRF, Data: v})
}

// fleetSwap renders the parts of the fleet page a live update replaces,
// keyed by element id.
func (d *Dashboard) fleetSwap(ctx context.Context, q fleetQuery) (map[string]string, error) {
	v, err := d.fleet(ctx, q)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for id, name := range map[string]string{"fleet-rows": "rows", "fleet-counts": "counts", "fleet-pager": "pager"} {
		if out[id], err = d.pages.fragment(name, v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// handleFleetLive re-reads the page's slice of the fleet every Refresh
// and sends it, re-rendered, whenever it changed: a daemon going stale
// shows without a reload.
func (d *Dashboard) handleFleetLive(w http.ResponseWriter, r *http.Request, _ store.Session) {
	q, ok := parseFleetQuery(r.URL.Query())
	if !ok {
		http.Error(w, "page must be a whole number from 1 to 10000", http.StatusBadRequest)
		return
	}
	st := startStream(w)
	tick := time.NewTicker(d.cfg.Refresh)
	defer tick.Stop()
	var last string
	for n := 1; ; n++ {
		swap, err := d.fleetSwap(r.Context(), q)
		if err != nil {
			if r.Context().Err() != nil {
				return
			}
			d.log.Warn().Err(err).Msg("live fleet")
		} else if b, _ := json.Marshal(swap); string(b) != last {
			last = string(b)
			if st.send("swap", "", swap) != nil {
				return
			}
		} else if n%15 == 0 && st.ping() != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-d.cfg.Done:
			return
		case <-tick.C:
		}
		// A logout (here or on another replica) ends the stream.
		if n%5 == 0 && !d.alive(r) {
			return
		}
	}
}
