package dashboard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/store"
)

// pageNames are the templates/<name>.html files, each a "content" inside
// layout.html.
var pageNames = []string{"login", "error", "fleet", "daemon", "confirm", "exec", "execs", "invocations", "invocation"}

// pages holds one parsed template set per page.
type pages struct{ byName map[string]*template.Template }

func parsePages() (*pages, error) {
	p := &pages{byName: map[string]*template.Template{}}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS,
			"templates/layout.html", "templates/fragments.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
		p.byName[name] = t
	}
	return p, nil
}

// fragment renders one named template of the fleet page (the parts a live
// update swaps in).
func (p *pages) fragment(name string, data any) (string, error) {
	var b bytes.Buffer
	if err := p.byName["fleet"].ExecuteTemplate(&b, name, data); err != nil {
		return "", err
	}
	return b.String(), nil
}

// view is what layout.html renders: the page's title, the session's CSRF
// token (for its forms and the meta tag; empty when logged out) and the
// page's own data.
type view struct {
	Title string
	CSRF  string
	Data  any
}

// render writes a page; it is rendered into memory first, so a template
// error is a clean 500, not half a page.
func (d *Dashboard) render(w http.ResponseWriter, status int, name string, v view) {
	var b bytes.Buffer
	if err := d.pages.byName[name].ExecuteTemplate(&b, "layout", v); err != nil {
		d.log.Error().Err(err).Str("page", name).Msg("render page")
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func (d *Dashboard) renderLogin(w http.ResponseWriter, status int, msg string) {
	d.render(w, status, "login", view{Title: "Log in", Data: msg})
}

// errorPage is the body of error.html.
type errorPage struct {
	Status  int
	Text    string
	Message string
}

// fail renders an error page without a session (logged out: no nav).
func (d *Dashboard) fail(w http.ResponseWriter, status int, msg string) {
	d.render(w, status, "error", view{Title: http.StatusText(status), Data: errorPage{status, http.StatusText(status), msg}})
}

// failS renders an error page for a logged-in operator.
func (d *Dashboard) failS(w http.ResponseWriter, s store.Session, status int, msg string) {
	d.render(w, status, "error", view{Title: http.StatusText(status), CSRF: s.CSRF,
		Data: errorPage{status, http.StatusText(status), msg}})
}

// apiFail turns an operator API error into a page: its own 4xx and
// message (which name the field), or a 502 when the API failed.
func (d *Dashboard) apiFail(w http.ResponseWriter, r *http.Request, s store.Session, err error) {
	var oe *opclient.Error
	if errors.As(err, &oe) && oe.Status >= 400 && oe.Status < 500 && oe.Status != http.StatusUnauthorized {
		msg := oe.Message
		if oe.Field != "" {
			msg = fmt.Sprintf("%s (%s)", msg, oe.Field)
		}
		d.failS(w, s, oe.Status, msg)
		return
	}
	if r.Context().Err() != nil {
		return
	}
	d.log.Error().Err(err).Str("path", r.URL.Path).Msg("operator API call")
	d.failS(w, s, http.StatusBadGateway, "The control plane could not answer this page; try again.")
}

var funcs = template.FuncMap{
	"ago":      ago,
	"stamp":    stamp,
	"join":     strings.Join,
	"versions": versions,
	"short":    shortVersions,
	"ms":       func(v uint64) string { return (time.Duration(v) * time.Millisecond).String() },
	"since":    func(t time.Time) string { return time.Since(t).Round(time.Second).String() },
	"took":     took,
	"str":      func(b []byte) string { return string(b) },
}

// stamp is a time (or a non-nil *time.Time) in RFC 3339, UTC.
func stamp(v any) string {
	switch t := v.(type) {
	case time.Time:
		return t.UTC().Format(time.RFC3339)
	case *time.Time:
		if t != nil {
			return t.UTC().Format(time.RFC3339)
		}
	}
	return ""
}

// ago is how long before now t was, coarsely.
func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd ago", int(d.Hours()/24))
	}
}

// took is how long a job ran, from start to end or, while it runs, to
// now; "" before it started.
func took(start, end *time.Time) string {
	if start == nil {
		return ""
	}
	to := time.Now()
	if end != nil {
		to = *end
	}
	return to.Sub(*start).Round(time.Millisecond).String()
}

// versions renders a worker's versions object as "name value" pairs,
// sorted by name, leaving out what the daemon did not find (null); an
// object or list value is shown as JSON.
func versions(raw json.RawMessage) []string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		var s string
		switch {
		case string(v) == "null":
			continue
		case json.Unmarshal(v, &s) == nil:
			out = append(out, k+" "+s)
		default:
			out = append(out, k+" "+string(v))
		}
	}
	slices.Sort(out)
	return out
}

// fleetVersions are the versions a fleet row shows; the daemon's page
// shows them all.
var fleetVersions = []string{"daemon", "protocol"}

func shortVersions(raw json.RawMessage) []string {
	var out []string
	for _, v := range versions(raw) {
		name, _, _ := strings.Cut(v, " ")
		if slices.Contains(fleetVersions, name) {
			out = append(out, v)
		}
	}
	return out
}
