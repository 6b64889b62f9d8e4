package dashboard

import (
	"bytes"
	"io"
	"net/http"
)

// inProcess is an http.RoundTripper that serves each request with the
// control plane's own handler, in this process, answered once the handler
// returns (every operator call the pages make is bounded: long polls
// carry their own wait).
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	if r.Body == nil {
		r.Body = http.NoBody
	}
	r.RequestURI = req.URL.RequestURI()
	r.RemoteAddr = "in-process"
	rec := &recorder{header: http.Header{}}
	t.h.ServeHTTP(rec, r)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return &http.Response{
		Status: http.StatusText(rec.status), StatusCode: rec.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rec.header, Body: io.NopCloser(&rec.body), ContentLength: int64(rec.body.Len()),
		Request: req,
	}, nil
}

// recorder keeps one answer in memory.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

// Flush lets a handler that flushes a first answer before it waits go on;
// the caller reads everything once the handler returns.
func (r *recorder) Flush() {}
