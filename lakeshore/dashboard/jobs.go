package dashboard

import (
	"net/http"
	"strconv"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// liveWait is how long one read of a live job waits for news.
const liveWait = 10 * time.Second

// execsView is what execs.html renders.
type execsView struct {
	List   []operatorapi.ExecSummary
	Worker string
}

func (d *Dashboard) handleExecs(w http.ResponseWriter, r *http.Request, s store.Session) {
	v := execsView{Worker: r.URL.Query().Get("worker")}
	list, err := d.api.ListExecs(r.Context(), v.Worker, operatorapi.DefaultListLimit)
	if err != nil {
		d.apiFail(w, r, s, err)
		return
	}
	v.List = list
	d.render(w, http.StatusOK, "execs", view{Title: "Execs", CSRF: s.CSRF, Data: v})
}

// execView is what exec.html renders.
type execView struct {
	E      operatorapi.Exec
	Output string
	Status string
	Live   string
}

// execStatus says where an exec is, its exit code once finished.
func execStatus(e operatorapi.Exec) string {
	if e.State != operatorapi.ExecFinished || e.Result == nil {
		return e.State
	}
	st := "finished, exit " + strconv.Itoa(int(e.Result.ExitCode))
	if e.Result.Error != nil {
		st += ": " + *e.Result.Error
	}
	return st + " in " + (time.Duration(e.Result.DurationMs) * time.Millisecond).String()
}

func (d *Dashboard) handleExec(w http.ResponseWriter, r *http.Request, s store.Session) {
	e, err := d.api.GetExec(r.Context(), r.PathValue("id"), 0, 0)
	if err != nil {
		d.apiFail(w, r, s, err)
		return
	}
	v := execView{E: e, Output: string(e.Output), Status: execStatus(e)}
	if e.Result != nil && len(e.Output) == 0 {
		v.Output = e.Result.Stdout + e.Result.Stderr
	}
	if e.State != operatorapi.ExecFinished {
		v.Live = "/execs/" + e.ExecID + "/live?offset=" + strconv.FormatInt(e.NextOffset, 10)
	}
	d.render(w, http.StatusOK, "exec", view{Title: "Exec " + e.ExecID, CSRF: s.CSRF, Data: v})
}

// handleExecLive streams an exec's output from offset (or the browser's
// Last-Event-ID, on a reconnect) until it finishes.
func (d *Dashboard) handleExecLive(w http.ResponseWriter, r *http.Request, _ store.Session) {
	id := r.PathValue("id")
	offset, ok := resumeAt(w, r, "offset")
	if !ok {
		return
	}
	// The first read answers a bad id with its status, before the stream.
	e, err := d.api.GetExec(r.Context(), id, 0, offset)
	if err != nil {
		streamRefused(w, err, "no such exec")
		return
	}
	st := startStream(w)
	for {
		if len(e.Output) > 0 {
			if st.send("output", strconv.FormatInt(e.NextOffset, 10), string(e.Output)) != nil {
				return
			}
		}
		offset = max(offset, e.NextOffset)
		if e.State == operatorapi.ExecFinished {
			_ = st.send("done", "", map[string]string{"status": execStatus(e), "stderr": stderrOf(e)})
			return
		}
		select {
		case <-d.cfg.Done:
			return
		default:
		}
		if e, err = d.api.GetExec(r.Context(), id, liveWait, offset); err != nil {
			if r.Context().Err() == nil {
				d.log.Warn().Err(err).Str("exec_id", id).Msg("live exec")
			}
			return
		}
	}
}

// stderrOf is a streamed exec's stderr, which comes with its result.
func stderrOf(e operatorapi.Exec) string {
	if e.Result == nil {
		return ""
	}
	return e.Result.Stderr
}

// invocationsView is what invocations.html renders.
type invocationsView struct {
	List  []operatorapi.Invocation
	State string
	Queue string
}

func (d *Dashboard) handleInvocations(w http.ResponseWriter, r *http.Request, s store.Session) {
	q := r.URL.Query()
	v := invocationsView{State: q.Get("state"), Queue: q.Get("queue")}
	list, err := d.api.ListInvocations(r.Context(), opclient.InvocationFilter{State: v.State, Queue: v.Queue, Limit: operatorapi.MaxListLimit})
	if err != nil {
		d.apiFail(w, r, s, err)
		return
	}
	v.List = list
	d.render(w, http.StatusOK, "invocations", view{Title: "Invocations", CSRF: s.CSRF, Data: v})
}

// invocationView is what invocation.html renders.
type invocationView struct {
	I      operatorapi.Invocation
	Output string
	Live   string
}

// finished reports whether an invocation is over.
func finished(state string) bool {
	return state != operatorapi.InvocationQueued && state != operatorapi.InvocationRunning
}

func (d *Dashboard) handleInvocation(w http.ResponseWriter, r *http.Request, s store.Session) {
	inv, err := d.api.GetInvocation(r.Context(), r.PathValue("id"), 0)
	if err != nil {
		d.apiFail(w, r, s, err)
		return
	}
	logs, err := d.api.InvocationLogs(r.Context(), inv.ID, 0, 0, 0)
	if err != nil {
		d.apiFail(w, r, s, err)
		return
	}
	v := invocationView{I: inv}
	for _, e := range logs.Events {
		v.Output += string(e.Data)
	}
	if !finished(logs.State) || logs.More {
		v.Live = "/invocations/" + inv.ID + "/live?after=" + strconv.FormatInt(logs.Next, 10)
	}
	d.render(w, http.StatusOK, "invocation", view{Title: "Invocation " + inv.ID, CSRF: s.CSRF, Data: v})
}

// handleInvocationLive streams a run's output after the cursor until the
// run is over and all of it is sent.
func (d *Dashboard) handleInvocationLive(w http.ResponseWriter, r *http.Request, _ store.Session) {
	id := r.PathValue("id")
	after, ok := resumeAt(w, r, "after")
	if !ok {
		return
	}
	logs, err := d.api.InvocationLogs(r.Context(), id, after, 0, 0)
	if err != nil {
		streamRefused(w, err, "no such invocation")
		return
	}
	st := startStream(w)
	for {
		var out string
		for _, e := range logs.Events {
			out += string(e.Data)
		}
		after = max(after, logs.Next)
		if out != "" && st.send("output", strconv.FormatInt(after, 10), out) != nil {
			return
		}
		if finished(logs.State) && !logs.More {
			_ = st.send("done", "", map[string]string{"status": logs.State})
			return
		}
		select {
		case <-d.cfg.Done:
			return
		default:
		}
		if logs, err = d.api.InvocationLogs(r.Context(), id, after, 0, liveWait); err != nil {
			if r.Context().Err() == nil {
				d.log.Warn().Err(err).Str("invocation_id", id).Msg("live invocation")
			}
			return
		}
	}
}

// streamRefused answers a live stream whose first read failed: the API's
// 4xx (a bad or unknown id), else 502.
func streamRefused(w http.ResponseWriter, err error, msg string) {
	status := opclient.StatusOf(err)
	if status < 400 || status >= 500 {
		status, msg = http.StatusBadGateway, "the control plane did not answer"
	}
	http.Error(w, msg, status)
}

// resumeAt is where a live stream starts: the browser's Last-Event-ID on
// a reconnect, else the page's query parameter param; a bad one is a 400
// naming it.
func resumeAt(w http.ResponseWriter, r *http.Request, param string) (int64, bool) {
	from := r.Header.Get("Last-Event-ID")
	if from == "" {
		from = r.URL.Query().Get(param)
	}
	n, err := strconv.ParseInt(cmpOr(from, "0"), 10, 64)
	if err != nil || n < 0 {
		http.Error(w, param+" must be a whole number", http.StatusBadRequest)
		return 0, false
	}
	return n, true
}
