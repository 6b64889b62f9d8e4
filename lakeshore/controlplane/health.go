package controlplane

import (
	"context"
	"net/http"
	"time"
)

// readyTimeout bounds the store's answer to a readiness probe: a store
// slower than this is not ready, and the probe must not pile up.
const readyTimeout = 5 * time.Second

// handleHealthz is GET /healthz: the process answers. It touches nothing,
// so it says nothing of the store; /readyz does.
func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok\n")
}

// handleReadyz is GET /readyz: 200 once the store answers and has every
// migration this binary embeds, 503 naming what is wrong otherwise, and
// 503 from the moment the control plane starts shutting down, so a load
// balancer stops sending it requests.
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.closing:
		writeText(w, http.StatusServiceUnavailable, "not ready: the control plane is shutting down\n")
		return
	default:
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := s.st.Ready(ctx); err != nil {
		s.log.Warn().Err(err).Msg("readiness probe: the store is not ready")
		writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error()+"\n")
		return
	}
	writeText(w, http.StatusOK, "ok\n")
}

func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
