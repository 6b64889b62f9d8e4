package dashboard

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// recentRuns is how many of a daemon's invocations its page lists, of the
// namespace's newest runScan.
const (
	recentRuns = 20
	runScan    = operatorapi.MaxListLimit
)

// daemonView is what daemon.html renders.
type daemonView struct {
	W         operatorapi.Worker
	Runs      []operatorapi.Invocation
	Execs     []operatorapi.ExecSummary
	LaunchLog string
	Notice    string
	Hibernate []string
}

// hibernateFor are the hibernations the page offers.
var hibernateFor = []string{"10m", "1h", "8h", "24h"}

// notices are what a redirect after an action may say (?did=).
var notices = map[string]string{
	"hibernate": "Hibernate queued.", "wake": "Wake queued.", "reset": "Reset queued.", "update": "Update queued.",
}

func (d *Dashboard) handleDaemon(w http.ResponseWriter, r *http.Request, s store.Session) {
	wk, err := d.api.GetWorker(r.Context(), r.PathValue("id"))
	if err != nil {
		d.apiFail(w, r, s, err)
		return
	}
	v := daemonView{W: wk, Notice: notices[r.URL.Query().Get("did")], Hibernate: hibernateFor}
	if runs, err := d.api.ListInvocations(r.Context(), opclient.InvocationFilter{Limit: runScan}); err == nil {
		for _, inv := range runs {
			if inv.WorkerID == wk.ID && len(v.Runs) < recentRuns {
				v.Runs = append(v.Runs, inv)
			}
		}
	} else {
		d.log.Warn().Err(err).Msg("list invocations for a daemon page")
	}
	if v.Execs, err = d.api.ListExecs(r.Context(), wk.ID, recentRuns); err != nil {
		d.log.Warn().Err(err).Msg("list execs for a daemon page")
	}
	if wk.Provider != "" {
		if l, err := d.api.LaunchLog(r.Context(), wk.ID, true); err == nil {
			v.LaunchLog = l.Output
		} else {
			v.LaunchLog = "(launch log unavailable: " + err.Error() + ")"
		}
	}
	d.render(w, http.StatusOK, "daemon", view{Title: wk.Label, CSRF: s.CSRF, Data: v})
}

// confirmView is what confirm.html renders: the action, what it does, and
// the fields to post again with confirm=yes.
type confirmView struct {
	W      operatorapi.Worker
	Action string
	What   string
	Fields []field
}

type field struct{ Name, Value string }

// actionFields are the form fields each action takes.
var actionFields = map[string][]string{
	"exec": {"command"}, "hibernate": {"for"}, "wake": nil, "reset": nil, "update": {"version"}, "kill": nil,
}

// handleAction runs one of a daemon's actions, after a confirmation step:
// the first post shows what will happen, and only the post of that page
// (confirm=yes) acts.
func (d *Dashboard) handleAction(w http.ResponseWriter, r *http.Request, s store.Session) {
	action := r.PathValue("action")
	names, ok := actionFields[action]
	if !ok {
		d.failS(w, s, http.StatusNotFound, "No such action.")
		return
	}
	wk, err := d.api.GetWorker(r.Context(), r.PathValue("id"))
	if err != nil {
		d.apiFail(w, r, s, err)
		return
	}
	form := r.PostForm
	var what string
	switch action {
	case "exec":
		if strings.TrimSpace(form.Get("command")) == "" {
			d.failS(w, s, http.StatusBadRequest, "command: give a command to run.")
			return
		}
		what = "Run this command on " + wk.Label + ": " + form.Get("command")
	case "hibernate":
		if !slices.Contains(hibernateFor, form.Get("for")) {
			d.failS(w, s, http.StatusBadRequest, "for: must be one of "+strings.Join(hibernateFor, ", ")+".")
			return
		}
		what = "Hibernate " + wk.Label + " for " + form.Get("for") + ": it takes no work until then."
	case "wake":
		what = "Wake " + wk.Label + " now."
	case "reset":
		what = "Reset the backoff of " + wk.Label + "."
	case "update":
		what = "Update " + wk.Label + " to " + cmpOr(form.Get("version"), "the target version") + " (over the air)."
	case "kill":
		what = "Kill " + wk.Label + ": terminate its instance, if a provider launched it, and remove it."
	}
	if form.Get("confirm") != "yes" {
		v := confirmView{W: wk, Action: action, What: what}
		for _, n := range names {
			v.Fields = append(v.Fields, field{n, form.Get(n)})
		}
		d.render(w, http.StatusOK, "confirm", view{Title: "Confirm " + action, CSRF: s.CSRF, Data: v})
		return
	}
	ctx := r.Context()
	back := "/daemons/" + url.PathEscape(wk.ID) + "?did=" + action
	switch action {
	case "exec":
		acc, _, err := d.api.SubmitExec(ctx, wk.ID, operatorapi.ExecRequest{Command: form.Get("command"), Stream: true}, 0)
		if err != nil {
			d.apiFail(w, r, s, err)
			return
		}
		http.Redirect(w, r, "/execs/"+url.PathEscape(acc.ExecID), http.StatusSeeOther)
		return
	case "hibernate":
		dur, _ := time.ParseDuration(form.Get("for"))
		_, err = d.api.Hibernate(ctx, wk.ID, time.Now().Add(dur))
	case "wake":
		_, err = d.api.Wake(ctx, wk.ID)
	case "reset":
		_, err = d.api.Reset(ctx, wk.ID)
	case "update":
		_, err = d.api.UpdateWorker(ctx, wk.ID, operatorapi.UpdateRequest{Version: form.Get("version")})
	case "kill":
		_, err = d.api.KillWorker(ctx, wk.ID, true)
		back = "/fleet?did=kill"
	}
	if err != nil {
		d.apiFail(w, r, s, err)
		return
	}
	d.log.Info().Str("action", action).Str("worker_id", wk.ID).Msg("dashboard action")
	http.Redirect(w, r, back, http.StatusSeeOther)
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
