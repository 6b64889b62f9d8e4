package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// writeJSON prints v as indented JSON followed by a newline. Field order is
// the struct's, so the output is stable for scripts.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeJSONLine prints v as one compact line (one document per --watch tick).
func writeJSONLine(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// ago renders how long before now t was, coarsely, for tables.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + span(-d)
	}
	if d < time.Second {
		return "just now"
	}
	return span(d) + " ago"
}

// span renders a duration the way a person reads it: 45s, 12m, 3h5m, 4d.
// It rounds to the unit it shows, so a deadline 3d away that is read a
// moment later is still "3d", not "2d".
func span(d time.Duration) string {
	if s := d.Round(time.Second); s < time.Minute {
		return fmt.Sprintf("%ds", int(s.Seconds()))
	}
	if m := d.Round(time.Minute); m < time.Hour {
		return fmt.Sprintf("%dm", int(m.Minutes()))
	} else if m < 10*time.Hour {
		if h, mins := int(m.Hours()), int(m.Minutes())%60; mins != 0 {
			return fmt.Sprintf("%dh%dm", h, mins)
		}
		return fmt.Sprintf("%dh", int(m.Hours()))
	}
	if h := d.Round(time.Hour); h < 48*time.Hour {
		return fmt.Sprintf("%dh", int(h.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Round(24*time.Hour).Hours()/24))
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}

func joinOrDash(xs []string) string {
	return orDash(strings.Join(xs, ","))
}

// progress shows one self-refreshing status line on a terminal's stderr
// while lakeshore waits. Stop clears it; it must be stopped before anything
// else is written to that terminal.
type progress struct {
	w       io.Writer
	mu      sync.Mutex
	msg     string
	start   time.Time
	stop    chan struct{}
	done    chan struct{}
	stopped bool
}

// startProgress returns nil (a no-op progress) when w is not a terminal.
func startProgress(w io.Writer, enabled bool, msg string) *progress {
	if !enabled {
		return nil
	}
	p := &progress{w: w, msg: msg, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go p.loop()
	return p
}

func (p *progress) loop() {
	defer close(p.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	p.render()
	for {
		select {
		case <-p.stop:
			p.mu.Lock()
			fmt.Fprint(p.w, "\r\x1b[K")
			p.mu.Unlock()
			return
		case <-tick.C:
			p.render()
		}
	}
}

func (p *progress) render() {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r\x1b[K%s %s", p.msg, span(time.Since(p.start)))
}

// Set changes the message shown.
func (p *progress) Set(msg string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.msg = msg
	p.mu.Unlock()
}

// Stop clears the line and waits for the refresher to finish.
func (p *progress) Stop() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	p.mu.Unlock()
	close(p.stop)
	<-p.done
}
