package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/controlplane"
	"nymph/lakeshore/dashboard"
	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/lakeshore/store/sqlite"
	"nymph/test/fakeclock"
)

const admin = "admin-Secret-Token-0123456789"

// env is a real control plane (SQLite in a temp dir) over real HTTP.
type env struct {
	t     *testing.T
	dir   string
	url   string
	st    store.Store
	clock *fakeclock.Clock
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvIn(t, t.TempDir(), fakeclock.New(time.Now().UTC().Truncate(time.Second)))
}

// newEnvIn starts a control plane on dir's database: a second one on the
// same dir is a restart (or, for the sessions, a replica).
func newEnvIn(t *testing.T, dir string, clock *fakeclock.Clock) *env {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "lakeshore.db"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := controlplane.New(context.Background(), controlplane.Config{
		DataDir: dir, AdminToken: admin, Store: st, Now: clock.Now,
		Logger:           zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
		DashboardRefresh: 20 * time.Millisecond,
	})
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		if err := srv.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return &env{t: t, dir: dir, url: hs.URL, st: st, clock: clock}
}

// hello creates a worker row as a daemon's hello does.
func (e *env) hello(label string, queues ...string) string {
	e.t.Helper()
	w, _, err := e.st.Hello(context.Background(), store.Hello{
		NewID: workerID(label), Namespace: "default",
		MachineID: "m-" + label, Label: label, Queues: queues, Tags: []string{"gpu=h100"},
		Capabilities: store.Capabilities{Runners: []string{"process"}},
		Versions:     json.RawMessage(`{"daemon":"1.2.3"}`), Now: e.clock.Now(),
	})
	if err != nil {
		e.t.Fatalf("hello %s: %v", label, err)
	}
	return w.ID
}

// workerID is a worker id made of the label, as unique as it.
func workerID(label string) string {
	h := fnv.New64a()
	h.Write([]byte(label))
	return fmt.Sprintf("%024x", h.Sum64())
}

// browser is an HTTP client with a cookie jar that does not follow
// redirects, so each answer is seen as it is.
type browser struct {
	t    *testing.T
	e    *env
	c    *http.Client
	csrf string
}

func (e *env) browser() *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: e.t, e: e, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

type page struct {
	status int
	body   string
	header http.Header
}

func (b *browser) do(method, path string, form url.Values, hdr ...string) page {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.e.url+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	p := page{status: resp.StatusCode, body: string(data), header: resp.Header}
	// Whatever the page, the admin token is never in it.
	if strings.Contains(p.body, admin) {
		b.t.Fatalf("%s %s: the admin token is in the page", method, path)
	}
	if p.status >= 500 {
		b.t.Fatalf("%s %s: %d\n%s", method, path, p.status, p.body)
	}
	if m := csrfMeta.FindStringSubmatch(p.body); m != nil {
		b.csrf = m[1]
	}
	return p
}

var csrfMeta = regexp.MustCompile(`<meta name="csrf-token" content="([^"]+)">`)

func (b *browser) get(path string) page { b.t.Helper(); return b.do(http.MethodGet, path, nil) }

// post sends a form with the page's CSRF token.
func (b *browser) post(path string, form url.Values, hdr ...string) page {
	b.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	if _, ok := form["csrf"]; !ok {
		form.Set("csrf", b.csrf)
	}
	return b.do(http.MethodPost, path, form, hdr...)
}

func (b *browser) login(token string) page {
	b.t.Helper()
	return b.do(http.MethodPost, "/login", url.Values{"token": {token}})
}

// loggedIn logs in and opens the fleet page (for its CSRF token).
func (b *browser) loggedIn() *browser {
	b.t.Helper()
	if p := b.login(admin); p.status != http.StatusSeeOther || p.header.Get("Location") != "/fleet" {
		b.t.Fatalf("login: %d %s", p.status, p.header.Get("Location"))
	}
	if p := b.get("/fleet"); p.status != http.StatusOK || b.csrf == "" {
		b.t.Fatalf("fleet after login: %d, csrf %q", p.status, b.csrf)
	}
	return b
}

func expect(t *testing.T, p page, status int, contains ...string) {
	t.Helper()
	if p.status != status {
		t.Fatalf("status %d, want %d\n%s", p.status, status, p.body)
	}
	for _, c := range contains {
		if !strings.Contains(p.body, c) {
			t.Fatalf("page lacks %q:\n%s", c, p.body)
		}
	}
}

func expectRedirect(t *testing.T, p page, to string) {
	t.Helper()
	if p.status != http.StatusSeeOther || p.header.Get("Location") != to {
		t.Fatalf("got %d to %q, want 303 to %s\n%s", p.status, p.header.Get("Location"), to, p.body)
	}
}

// Login sets a session cookie that is HttpOnly, SameSite=Strict, Path=/;
// the session holds across a restart (and so across replicas sharing the
// database); logout ends it on the server, so the old cookie is refused.
func TestLoginSessionAndLogout(t *testing.T) {
	e := newEnv(t)
	e.hello("gpu-a")
	b := e.browser()
	expectRedirect(t, b.get("/fleet"), "/login")
	expectRedirect(t, b.get("/"), "/fleet")
	expect(t, b.get("/login"), http.StatusOK, `name="token"`)

	expect(t, b.login("wrong"), http.StatusUnauthorized, "Wrong admin token.")
	expect(t, b.login(""), http.StatusUnauthorized, "Wrong admin token.")
	p := b.login(admin)
	expectRedirect(t, p, "/fleet")
	cookie := p.header.Get("Set-Cookie")
	for _, attr := range []string{"lakeshore_session=", "Path=/", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(cookie, attr) {
			t.Fatalf("cookie %q lacks %s", cookie, attr)
		}
	}
	if strings.Contains(cookie, "Secure") {
		t.Fatalf("cookie %q is Secure over plain HTTP", cookie)
	}
	expect(t, b.get("/fleet"), http.StatusOK, "gpu-a", `name="csrf-token"`)
	if strings.Contains(b.get("/fleet").header.Get("Content-Security-Policy"), "unsafe-inline") {
		t.Fatal("the pages allow inline script")
	}

	// A restart on the same database keeps the session.
	e2 := newEnvIn(t, e.dir, e.clock)
	b2 := e2.browser()
	b2.c.Jar = b.c.Jar
	u, _ := url.Parse(e.url)
	u2, _ := url.Parse(e2.url)
	b2.c.Jar.SetCookies(u2, b.c.Jar.Cookies(u))
	expect(t, b2.get("/fleet"), http.StatusOK, "gpu-a")

	// Logout needs the CSRF token, then ends the session everywhere.
	expect(t, b.post("/logout", url.Values{"csrf": {""}}), http.StatusForbidden, "CSRF")
	expectRedirect(t, b.post("/logout", nil), "/login")
	expectRedirect(t, b2.get("/fleet"), "/login")
	if p := b2.get("/fleet/live"); p.status != http.StatusUnauthorized {
		t.Fatalf("live fleet after logout: %d", p.status)
	}
	expect(t, b2.post("/daemons/x/reset", nil), http.StatusUnauthorized, "log in again")
}

// Every POST checks the session's CSRF token (the field missing, wrong,
// or another session's) and the Origin when the browser sends one; an
// action acts only once confirmed.
func TestCSRFOriginAndConfirmation(t *testing.T) {
	e := newEnv(t)
	id := e.hello("gpu-a")
	b := e.browser().loggedIn()
	other := e.browser().loggedIn()
	path := "/daemons/" + id + "/reset"
	expect(t, b.do(http.MethodPost, path, url.Values{}), http.StatusForbidden, "CSRF token is missing or wrong")
	expect(t, b.post(path, url.Values{"csrf": {"x" + b.csrf}}), http.StatusForbidden)
	expect(t, b.post(path, url.Values{"csrf": {other.csrf}}), http.StatusForbidden)
	expect(t, b.post(path, nil, "Origin", "http://evil.example"), http.StatusForbidden)
	expect(t, b.post(path, nil, "Referer", "http://evil.example/page"), http.StatusForbidden)
	expect(t, b.do(http.MethodPost, "/login", url.Values{"token": {admin}}, "Origin", "http://evil.example"), http.StatusForbidden)

	// The first post asks; nothing is queued until the confirmation.
	expect(t, b.post(path, nil, "Origin", e.url), http.StatusOK, `id="confirm"`, "Reset the backoff of gpu-a")
	cmds, err := e.st.ListCommands(context.Background(), id)
	if err != nil || len(cmds) != 0 {
		t.Fatalf("commands before the confirmation: %v, %v", cmds, err)
	}
	expectRedirect(t, b.post(path, url.Values{"confirm": {"yes"}}), "/daemons/"+id+"?did=reset")
	if cmds, err := e.st.ListCommands(context.Background(), id); err != nil || len(cmds) != 1 || cmds[0].Kind != "reset_backoff" {
		t.Fatalf("commands after the confirmation: %+v, %v", cmds, err)
	}
	expect(t, b.get("/daemons/"+id+"?did=reset"), http.StatusOK, "Reset queued.")

	// An exec, confirmed, lands on its page.
	p := b.post("/daemons/"+id+"/exec", url.Values{"command": {"echo hi"}, "confirm": {"yes"}})
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "/execs/") {
		t.Fatalf("exec: %d %s", p.status, p.header.Get("Location"))
	}
	expect(t, b.get(p.header.Get("Location")), http.StatusOK, "echo hi", "queued")
	execID := strings.TrimPrefix(p.header.Get("Location"), "/execs/")
	expect(t, b.get("/execs"), http.StatusOK, `data-exec="`+execID+`"`, "echo hi")
	expect(t, b.get("/execs?worker="+id), http.StatusOK, `data-exec="`+execID+`"`)
	expect(t, b.get("/daemons/"+id), http.StatusOK, `data-exec="`+execID+`"`, "gpu=h100", "daemon 1.2.3")
	expect(t, b.get("/execs?worker=a%20b"), http.StatusBadRequest, "worker")
	// The queued exec is what the daemon runs now, on the fleet and on its page.
	expect(t, b.get("/fleet"), http.StatusOK, `<a href="/execs?worker=`+id+`">1 exec</a>`)
	expect(t, b.get("/daemons/"+id), http.StatusOK, "1 exec queued or running")

	// Kill, confirmed, removes the row.
	expectRedirect(t, b.post("/daemons/"+id+"/kill", url.Values{"confirm": {"yes"}}), "/fleet?did=kill")
	expect(t, b.get("/daemons/"+id), http.StatusNotFound)
}

// A session ends once unused for its idle window, and at its absolute
// expiry however much it is used.
func TestSessionExpiry(t *testing.T) {
	e := newEnv(t)
	b := e.browser().loggedIn()
	e.clock.Advance(90 * time.Minute)
	expect(t, b.get("/fleet"), http.StatusOK)
	e.clock.Advance(2*time.Hour + time.Second)
	expectRedirect(t, b.get("/fleet"), "/login")

	b = e.browser().loggedIn()
	for range 7 {
		e.clock.Advance(90 * time.Minute)
		expect(t, b.get("/fleet"), http.StatusOK)
	}
	e.clock.Advance(time.Hour)
	expect(t, b.get("/fleet"), http.StatusOK)
	// 12 h after the login, 31 minutes after its last use.
	e.clock.Advance(31 * time.Minute)
	expectRedirect(t, b.get("/fleet"), "/login")
}

// Bad input gets a clear page or status: never a 500, never the token.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	e.hello("gpu-a")
	anon := e.browser()
	u, _ := url.Parse(e.url)
	for _, v := range []string{"forged", strings.Repeat("A", 43), "../../etc", `"; DROP TABLE sessions; --`} {
		anon.c.Jar.SetCookies(u, []*http.Cookie{{Name: "lakeshore_session", Value: url.QueryEscape(v)}})
		expectRedirect(t, anon.get("/fleet"), "/login")
		if p := anon.get("/fleet/live"); p.status != http.StatusUnauthorized {
			t.Fatalf("live with cookie %q: %d", v, p.status)
		}
	}

	b := e.browser().loggedIn()
	expect(t, b.get("/daemons/no-such-daemon"), http.StatusNotFound, "no such worker")
	expect(t, b.get("/daemons/"+strings.Repeat("x", 300)), http.StatusNotFound)
	expect(t, b.get("/daemons/%3Cscript%3E"), http.StatusNotFound)
	expect(t, b.get("/execs/no-such-exec"), http.StatusNotFound)
	expect(t, b.get("/invocations/no-such-run"), http.StatusNotFound)
	expect(t, b.post("/daemons/no-such-daemon/exec", url.Values{"command": {"id"}}), http.StatusNotFound)
	p := b.get("/fleet?state=%3Cscript%3Ealert(1)%3C/script%3E")
	expect(t, p, http.StatusBadRequest, "state")
	if strings.Contains(p.body, "<script>alert") {
		t.Fatal("the bad filter is echoed unescaped")
	}
	expect(t, b.get("/fleet?label=%3Cb%3E%27%22%25&queue=*"), http.StatusOK, "No daemon matches.")
	expect(t, b.get("/fleet?label=a%0Ab"), http.StatusBadRequest, "labelPrefix")
	expect(t, b.get("/fleet?page=0"), http.StatusBadRequest, "page")
	expect(t, b.get("/fleet?page=x"), http.StatusBadRequest, "page")
	expect(t, b.get("/invocations?state=nope"), http.StatusBadRequest)
	id := e.hello("gpu-b")
	expect(t, b.post("/daemons/"+id+"/explode", nil), http.StatusNotFound, "No such action.")
	expect(t, b.post("/daemons/"+id+"/hibernate", url.Values{"for": {"forever"}}), http.StatusBadRequest, "for:")
	expect(t, b.post("/daemons/"+id+"/exec", url.Values{"command": {"  "}}), http.StatusBadRequest, "command")
	expect(t, b.post("/daemons/"+id+"/exec", url.Values{"command": {strings.Repeat("x", 70<<10)}}), http.StatusBadRequest)
	if p := b.get("/execs/x/live?offset=-1"); p.status != http.StatusBadRequest {
		t.Fatalf("live exec with a negative offset: %d", p.status)
	}
	if p := b.get("/execs/no-such-exec/live"); p.status != http.StatusNotFound {
		t.Fatalf("live of an unknown exec: %d", p.status)
	}

	// Login attempts are limited per remote address.
	limited := e.browser()
	for i := range 20 {
		if p := limited.login("wrong"); p.status == http.StatusTooManyRequests {
			if i < 5 {
				t.Fatalf("limited after %d attempts", i)
			}
			return
		}
	}
	t.Fatal("20 wrong logins in a row were never limited")
}

// The live fleet re-renders its rows and counts server-side and sends
// them over server-sent events when they change: a daemon going stale
// shows without a reload.
func TestLiveFleetShowsStale(t *testing.T) {
	e := newEnv(t)
	e.hello("gpu-a")
	b := e.browser().loggedIn()
	req, _ := http.NewRequest(http.MethodGet, e.url+"/fleet/live", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := b.c.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("live: %d %s", resp.StatusCode, ct)
	}
	events := bufio.NewScanner(resp.Body)
	events.Buffer(make([]byte, 1<<20), 1<<20)
	next := func() map[string]string {
		t.Helper()
		for events.Scan() {
			if data, ok := strings.CutPrefix(events.Text(), "data: "); ok {
				var swap map[string]string
				if err := json.Unmarshal([]byte(data), &swap); err != nil {
					t.Fatalf("event data %q: %v", data, err)
				}
				return swap
			}
		}
		t.Fatalf("the stream ended: %v", events.Err())
		return nil
	}
	first := next()
	if !strings.Contains(first["fleet-rows"], `data-state="active"`) || !strings.Contains(first["fleet-counts"], `id="count-active">1<`) {
		t.Fatalf("first event: %v", first)
	}
	e.clock.Advance(operatorapi.StaleAfter + time.Second)
	second := next()
	if !strings.Contains(second["fleet-rows"], `data-state="stale"`) || !strings.Contains(second["fleet-counts"], `id="count-stale">1<`) {
		t.Fatalf("after the stale window: %v", second)
	}
}

// With 10,000 daemons in a real store, a fleet page renders one page of
// them (and the counts of all), not every row; the filters and the pager
// reach the rest.
func TestFleetOf10000Daemons(t *testing.T) {
	e := newEnv(t)
	const n = 10_000
	start := time.Now()
	for i := range n {
		q := []string{"cpu"}
		if i%2 == 0 {
			q = []string{"gpu"}
		}
		e.hello(fmt.Sprintf("d-%05d", i), q...)
	}
	t.Logf("%d worker rows created in %v", n, time.Since(start).Round(time.Millisecond))
	b := e.browser().loggedIn()
	rows := regexp.MustCompile(`<tr data-label="([^"]+)"`)
	labels := func(p page) []string {
		var out []string
		for _, m := range rows.FindAllStringSubmatch(p.body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	start = time.Now()
	p := b.get("/fleet")
	took := time.Since(start)
	expect(t, p, http.StatusOK, `id="count-all">10000<`, `id="count-active">10000<`, "1–100 of 10000")
	if got := labels(p); len(got) != dashboard.PageSize || got[0] != "d-00000" || got[99] != "d-00099" {
		t.Fatalf("first page: %d rows, %v … ", len(got), got[:min(3, len(got))])
	}
	t.Logf("fleet page of %d daemons: %v, %d bytes", n, took.Round(time.Millisecond), len(p.body))

	p = b.get("/fleet?page=100")
	if got := labels(p); len(got) != 100 || got[0] != "d-09900" || got[99] != "d-09999" || strings.Contains(p.body, `id="next"`) {
		t.Fatalf("last page: %d rows from %v", len(got), got[:min(1, len(got))])
	}
	expect(t, p, http.StatusOK, "9901–10000 of 10000", `id="prev"`)
	p = b.get("/fleet?queue=gpu&label=d-0999")
	if got := labels(p); len(got) != 5 || got[0] != "d-09990" {
		t.Fatalf("gpu daemons labelled d-0999*: %v", got)
	}
	expect(t, p, http.StatusOK, "1–5 of 5", `id="count-all">10000<`)
	p = b.get("/fleet?state=stale")
	expect(t, p, http.StatusOK, "No daemon matches.", "0 of 0")
}

// Behind TLS the session cookie is Secure too.
func TestSecureCookieUnderTLS(t *testing.T) {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d, err := dashboard.New(dashboard.Config{API: http.NotFoundHandler(), Token: admin, Sessions: st, Secure: true})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	d.Mount(mux)
	hs := httptest.NewTLSServer(mux)
	t.Cleanup(hs.Close)
	c := hs.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.PostForm(hs.URL+"/login", url.Values{"token": {admin}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ck := resp.Header.Get("Set-Cookie"); resp.StatusCode != http.StatusSeeOther || !strings.Contains(ck, "; Secure") || !strings.Contains(ck, "HttpOnly") {
		t.Fatalf("login over TLS: %d, cookie %q", resp.StatusCode, ck)
	}
}

// The invocation list and a queued invocation's page, whose output
// stream stays open while it runs.
func TestInvocationPages(t *testing.T) {
	e := newEnv(t)
	api, err := opclient.New(e.url, admin, opclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := api.SubmitInvocation(context.Background(), operatorapi.InvocationRequest{Script: "echo hi"})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	b := e.browser().loggedIn()
	expect(t, b.get("/invocations"), http.StatusOK, sub.Invocation.ID, "script", "queued")
	expect(t, b.get("/invocations?state=queued"), http.StatusOK, sub.Invocation.ID)
	expect(t, b.get("/invocations?state=succeeded"), http.StatusOK, "No invocation matches.")
	expect(t, b.get("/invocations/"+sub.Invocation.ID), http.StatusOK, `id="status">queued<`,
		`data-live="/invocations/`+sub.Invocation.ID+`/live?after=0"`)
}
