package e2e

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"nymph/test/harness"
	"nymph/test/realparts"
)

// browserTimeout bounds each step in the browser: a wait for an element,
// a poll of the DOM. They wait on events; this is only the deadline.
const browserTimeout = 60 * time.Second

// startChromium starts a headless Chromium for the test (a missing one
// skips it, or fails it under CI=true) and returns its context.
func startChromium(t *testing.T) context.Context {
	t.Helper()
	bin := realparts.RequireTool(t, "chromium")[0]
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1000),
		// As root (which CI is), Chromium refuses to start with its sandbox.
		chromedp.NoSandbox, chromedp.DisableGPU)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first run starts the browser, which lives as long as ctx.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// in runs steps in the browser, each wait bounded by browserTimeout.
func in(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	if err := chromedp.Do(sctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval runs JavaScript in the page (awaiting a promise) and returns its
// value.
func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	v, err := chromedp.Run(sctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// poll waits until the JavaScript predicate holds in the page.
func poll(js string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Poll[bool](js, chromedp.WithPollingTimeout(browserTimeout), chromedp.WithPollingInterval(50*time.Millisecond))(ctx, tg)
		return chromedp.Void{}, err
	})
}

// The dashboard in a real headless Chromium, over a real `lakeshore serve`
// with real nymph daemons: a wrong token is refused, the right one shows
// the fleet, a daemon killed goes stale on the open page without a
// reload, an exec run from a daemon's page streams its output in, a POST
// without the CSRF token is refused, and after logout the old session
// cookie is refused by the server.
func TestDashboardInABrowser(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{Args: []string{"--stale-after", "3s"}})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "keeper", WaitMaxS: 1})
	doomed := cp.StartDaemon(t, harness.DaemonOptions{Label: "doomed", WaitMaxS: 1})
	ctx := startChromium(t)

	// A wrong token: the login page again, saying so.
	in(t, ctx, "a wrong token",
		chromedp.Navigate(cp.URL+"/fleet"),
		chromedp.WaitVisible("#token"),
		chromedp.SendKeys("#token", "not-the-token"),
		chromedp.Click("#login"),
		chromedp.WaitVisible("#login-error"))
	if msg := eval[string](t, ctx, `document.getElementById("login-error").textContent`); msg != "Wrong admin token." {
		t.Fatalf("after a wrong token the page says %q", msg)
	}
	if eval[bool](t, ctx, `document.cookie.includes("lakeshore_session")`) {
		t.Fatal("a session cookie is readable by scripts")
	}

	// The right one: the fleet, both daemons active.
	in(t, ctx, "log in and see the fleet",
		chromedp.SendKeys("#token", cp.AdminToken),
		chromedp.Click("#login"),
		chromedp.WaitVisible(`tr[data-label="keeper"][data-state="active"]`),
		chromedp.WaitVisible(`tr[data-label="doomed"][data-state="active"]`),
		// A mark that a reload would erase.
		chromedp.Steps(chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[bool](`window.notReloaded = true`)(ctx, tg)
			return err
		})))
	if html := eval[string](t, ctx, `document.documentElement.outerHTML`); strings.Contains(html, cp.AdminToken) {
		t.Fatal("the admin token is in the fleet page")
	}

	// Killed, the daemon goes stale on the open page.
	doomed.Kill()
	in(t, ctx, "the killed daemon to show stale without a reload",
		chromedp.WaitVisible(`tr[data-label="doomed"][data-state="stale"]`),
		chromedp.WaitVisible(`#count-stale`))
	if !eval[bool](t, ctx, `window.notReloaded === true`) {
		t.Fatal("the page was reloaded")
	}
	if n := eval[string](t, ctx, `document.getElementById("count-stale").textContent`); n != "1" {
		t.Fatalf("stale count %s, want 1", n)
	}
	screenshot(t, ctx, "fleet")

	// An exec from keeper's page: its first line shows while it waits on
	// a gate, the rest and its exit once the gate opens.
	gate := filepath.Join(t.TempDir(), "gate")
	command := fmt.Sprintf("echo tick-one; while [ ! -e %s ]; do sleep 0.05; done; echo tick-two", gate)
	in(t, ctx, "open keeper's page and run an exec",
		chromedp.Click(`tr[data-label="keeper"] a`),
		chromedp.WaitVisible("#exec-command"))
	screenshot(t, ctx, "daemon")
	in(t, ctx, "run an exec from keeper's page",
		chromedp.SendKeys("#exec-command", command),
		chromedp.Click("#exec-run"),
		chromedp.WaitVisible("#confirm"),
		chromedp.Click("#confirm"),
		chromedp.WaitVisible("#output"),
		poll(`document.getElementById("output").textContent.includes("tick-one")`))
	if st := eval[string](t, ctx, `document.getElementById("status").textContent`); st != "running" {
		t.Fatalf("with the gate shut the exec is %q, want running", st)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	in(t, ctx, "the rest of the output and the exit code to stream in",
		poll(`document.getElementById("output").textContent.includes("tick-two")`),
		poll(`document.getElementById("status").textContent.startsWith("finished, exit 0")`))
	screenshot(t, ctx, "exec")

	// A POST without the CSRF token (a fetch from the page itself, with
	// its cookie) is refused.
	keeper := cp.WaitForWorker(t, "keeper")
	if st := eval[int](t, ctx, fmt.Sprintf(`fetch("/daemons/%s/reset", {method: "POST",
		body: new URLSearchParams({confirm: "yes"})}).then(r => r.status)`, keeper.ID)); st != http.StatusForbidden {
		t.Fatalf("a POST without the CSRF token: %d", st)
	}

	// Logout: the login page, and the old cookie is refused by the server.
	cookies, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{cp.URL}})
	if err != nil {
		t.Fatal(err)
	}
	var session *http.Cookie
	for _, c := range cookies.Cookies {
		if c.Name == "lakeshore_session" {
			if !c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict {
				t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict", c)
			}
			session = &http.Cookie{Name: c.Name, Value: c.Value}
		}
	}
	if session == nil {
		t.Fatal("no session cookie in the browser")
	}
	in(t, ctx, "log out",
		chromedp.Click("#logout"),
		chromedp.WaitVisible("#token"))
	in(t, ctx, "the fleet after logout",
		chromedp.Navigate(cp.URL+"/fleet"),
		chromedp.WaitVisible("#token"))
	for _, path := range []string{"/fleet", "/fleet/live"} {
		req, _ := http.NewRequest(http.MethodGet, cp.URL+path, nil)
		req.AddCookie(session)
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther && resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s with the cookie of the ended session: %d", path, resp.StatusCode)
		}
	}
}

// screenshot saves the page as NAME.png where screenshotPath says, and
// says where.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	shot, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := screenshotPath(t, name+".png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the %s page: %s", name, path)
}

// screenshotPath is where the fleet screenshot goes: the test's artifact
// directory under -artifacts (kept in the output directory), else a named
// file in $TMPDIR that outlives the test.
func screenshotPath(t *testing.T, name string) string {
	if f := flag.Lookup("test.artifacts"); f != nil && f.Value.String() == "true" {
		return filepath.Join(t.ArtifactDir(), name)
	}
	return filepath.Join(os.TempDir(), "lakeshore-dashboard-"+name)
}
