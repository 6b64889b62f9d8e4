package controlplane

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/rs/zerolog"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// BenchmarkExecRoundTrip measures the control plane's share of one exec:
// queue it, wake the parked poll, post the result, read it back through a
// waiting GET. The daemon is a goroutine speaking msgpack over loopback.
func BenchmarkExecRoundTrip(b *testing.B) {
	e := newEnv(b, func(c *Config) { c.Logger = zerolog.Nop() })
	id, cursor := e.hello("m", "l")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go fakeDaemon(ctx, e.url, id, cursor)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		acc := e.exec(id, operatorapi.ExecRequest{Command: "true"})
		for e.getExec(acc.ExecID, "?wait=20").State != operatorapi.ExecFinished {
		}
	}
}

// fakeDaemon polls with a cursor and answers every exec with exit 0.
func fakeDaemon(ctx context.Context, url, id, cursor string) {
	post := func(path string, v any, token string) []byte {
		body, _ := messages.Marshal(v)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(body))
		req.Header.Set("Content-Type", messages.ContentType)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return out
	}
	for ctx.Err() == nil {
		var p messages.PollResponse
		if err := messages.Unmarshal(post("/v1/daemon/poll", &messages.PollRequest{WorkerID: id, Cursor: &cursor, TimeoutS: 20}, testDaemon), &p); err != nil {
			continue
		}
		if p.Cursor != nil {
			cursor = *p.Cursor
		}
		for _, c := range p.Commands {
			if ex, ok := messages.DecodeCommand(c).(*messages.Exec); ok {
				post("/v1/daemon/exec/"+ex.ExecID+"/result", &messages.ExecResult{ExitCode: 0}, testDaemon)
			}
		}
	}
}
