package dashboard

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// stream writes server-sent events.
type stream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func startStream(w http.ResponseWriter) *stream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &stream{w: w, rc: http.NewResponseController(w)}
	_ = s.rc.Flush()
	return s
}

// send writes one event whose data is v as JSON (one line, whatever v
// holds) and flushes it. id, when set, is what the browser sends back as
// Last-Event-ID if it reconnects.
func (s *stream) send(event, id string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("event %s: %w", event, err)
	}
	if id != "" {
		if _, err := fmt.Fprintf(s.w, "id: %s\n", id); err != nil {
			return err
		}
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", event, data); err != nil {
		return err
	}
	return s.rc.Flush()
}

// ping keeps an idle stream open through proxies and notices a browser
// gone.
func (s *stream) ping() error {
	if _, err := fmt.Fprint(s.w, ": ping\n\n"); err != nil {
		return err
	}
	return s.rc.Flush()
}
