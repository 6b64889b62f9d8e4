package uplink_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"nymph/daemon/uplink"
	"nymph/messages"
)

type seen struct {
	mu   sync.Mutex
	reqs []*http.Request
	body [][]byte
}

func (s *seen) add(r *http.Request, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, r)
	s.body = append(s.body, b)
}

func (s *seen) last() (*http.Request, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reqs[len(s.reqs)-1], s.body[len(s.body)-1]
}

func server(t *testing.T, h func(w http.ResponseWriter, r *http.Request, body []byte)) (*httptest.Server, *seen) {
	t.Helper()
	s := &seen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.add(r, b)
		h(w, r, b)
	}))
	t.Cleanup(srv.Close)
	return srv, s
}

func writeMsgpack(t *testing.T, w http.ResponseWriter, v any) {
	b, err := messages.Marshal(v)
	if err != nil {
		t.Error(err)
	}
	w.Header().Set("Content-Type", messages.ContentType)
	_, _ = w.Write(b)
}

type recordingSigner struct {
	mu    sync.Mutex
	paths []string
}

func (s *recordingSigner) SignRequest(req *http.Request, body []byte, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paths = append(s.paths, req.URL.Path)
	req.Header.Set("X-LS-Signature", "sig")
	return nil
}

func TestPollHeadersBodyAndDecode(t *testing.T) {
	cursor := "c-7"
	srv, s := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		cmd, _ := messages.EncodeCommand("1", messages.KindResetBackoff, nil)
		writeMsgpack(t, w, &messages.PollResponse{Commands: []messages.Command{cmd}, Cursor: &cursor})
	})
	sig := &recordingSigner{}
	c, err := uplink.New(srv.URL+"/", uplink.WithToken(" tok \n"), uplink.WithSigner(sig))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Poll(context.Background(), &messages.PollRequest{WorkerID: "w", TimeoutS: 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Commands) != 1 || resp.Commands[0].Kind != messages.KindResetBackoff || *resp.Cursor != "c-7" {
		t.Fatalf("resp = %+v", resp)
	}
	r, body := s.last()
	if r.Method != http.MethodPost || r.URL.Path != uplink.PathPoll {
		t.Fatalf("%s %s", r.Method, r.URL.Path)
	}
	if r.Header.Get("Content-Type") != messages.ContentType || r.Header.Get("Accept") != messages.ContentType {
		t.Fatalf("headers %v", r.Header)
	}
	if r.Header.Get("Authorization") != "Bearer tok" || r.Header.Get("X-LS-Signature") != "sig" {
		t.Fatalf("auth headers %v", r.Header)
	}
	var got messages.PollRequest
	if err := messages.Unmarshal(body, &got); err != nil || got.WorkerID != "w" || got.Invocations == nil {
		t.Fatalf("body %+v %v", got, err)
	}
}

func TestExecResultPathChunkAndBasePrefix(t *testing.T) {
	srv, s := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {})
	c, err := uplink.New(srv.URL + "/cp")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ExecResult(context.Background(), "ex/1 2", &messages.ExecResult{ExitCode: 3}); err != nil {
		t.Fatal(err)
	}
	r, body := s.last()
	if r.URL.EscapedPath() != "/cp/v1/daemon/exec/ex%2F1%202/result" {
		t.Fatalf("path %q", r.URL.EscapedPath())
	}
	var res messages.ExecResult
	if err := messages.Unmarshal(body, &res); err != nil || res.ExitCode != 3 {
		t.Fatalf("%+v %v", res, err)
	}
	if r.Header.Get("Authorization") != "" {
		t.Fatal("bearer without a token")
	}

	if err := c.PostChunk(context.Background(), "/v1/daemon/exec/e1/chunk", []byte("raw\x00bytes")); err != nil {
		t.Fatal(err)
	}
	r, body = s.last()
	if r.Header.Get("Content-Type") != uplink.OctetStream || string(body) != "raw\x00bytes" || r.URL.Path != "/v1/daemon/exec/e1/chunk" {
		t.Fatalf("chunk %v %q %s", r.Header, body, r.URL.Path)
	}
}

func TestCredentialsOnlyForTheServerOrigin(t *testing.T) {
	other, so := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) { _, _ = w.Write([]byte("blob")) })
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {})
	sig := &recordingSigner{}
	c, err := uplink.New(srv.URL, uplink.WithToken("tok"), uplink.WithSigner(sig))
	if err != nil {
		t.Fatal(err)
	}
	data, err := c.Download(context.Background(), other.URL+"/b/k", 100)
	if err != nil || string(data) != "blob" {
		t.Fatalf("%q %v", data, err)
	}
	r, _ := so.last()
	if r.Header.Get("Authorization") != "" || r.Header.Get("X-LS-Signature") != "" {
		t.Fatalf("credentials leaked to another origin: %v", r.Header)
	}
	if _, err := c.Download(context.Background(), other.URL+"/b/k", 3); err == nil || !strings.Contains(err.Error(), "larger than 3 bytes") {
		t.Fatalf("limit not enforced: %v", err)
	}
	// An exec's log sink is the control plane's own callback, which takes
	// output only with the exec's worker's credentials, wherever the
	// control plane says it is.
	if err := c.PostChunk(context.Background(), other.URL+"/v1/daemon/exec/e1/chunk", []byte("out")); err != nil {
		t.Fatal(err)
	}
	r, _ = so.last()
	if r.Header.Get("Authorization") != "Bearer tok" || r.Header.Get("X-LS-Signature") == "" {
		t.Fatalf("a log chunk for the control plane's public URL went without credentials: %v", r.Header)
	}
}

func TestStatusErrorsAndRetryable(t *testing.T) {
	status := http.StatusServiceUnavailable
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.WriteHeader(status)
		_, _ = w.Write([]byte("down for a bit"))
	})
	c, _ := uplink.New(srv.URL)
	err := c.Ack(context.Background(), &messages.Ack{InvocationID: "i"})
	var se *uplink.StatusError
	if !errors.As(err, &se) || se.Status != 503 || se.Body != "down for a bit" || !uplink.Retryable(err) {
		t.Fatalf("err = %v", err)
	}
	for code, want := range map[int]bool{400: false, 401: false, 404: false, 409: false, 422: false, 408: true, 429: true, 500: true, 502: true} {
		status = code
		err := c.Ack(context.Background(), &messages.Ack{InvocationID: "i"})
		if uplink.Retryable(err) != want {
			t.Errorf("HTTP %d: Retryable = %v, want %v", code, !want, want)
		}
	}
	if uplink.Retryable(context.Canceled) || uplink.Retryable(nil) {
		t.Fatal("cancel or nil retryable")
	}
}

func TestMsgpackErrorBodyIsReadable(t *testing.T) {
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		b, _ := messages.Marshal(&messages.ValidationError{Error: "unknown token", Field: "authorization"})
		w.Header().Set("Content-Type", messages.ContentType)
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write(b)
	})
	c, _ := uplink.New(srv.URL)
	_, err := c.Hello(context.Background(), &messages.HelloRequest{MachineID: "m"})
	var se *uplink.StatusError
	if !errors.As(err, &se) || se.Body != "unknown token (field authorization)" {
		t.Fatalf("err = %v", err)
	}
}

func TestMalformedBodyIsDecodeError(t *testing.T) {
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) { _, _ = w.Write([]byte{0xc1, 0xff}) })
	c, _ := uplink.New(srv.URL)
	_, err := c.Hello(context.Background(), &messages.HelloRequest{MachineID: "m"})
	var de *uplink.DecodeError
	if !errors.As(err, &de) || !uplink.Retryable(err) {
		t.Fatalf("err = %v", err)
	}
}

func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	c, _ := uplink.New(srv.URL, uplink.WithTimeout(50*time.Millisecond))
	start := time.Now()
	_, err := c.Poll(context.Background(), &messages.PollRequest{})
	if err == nil || !uplink.Retryable(err) {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("timeout not honoured")
	}
}

func TestPresignAndDownloadRelative(t *testing.T) {
	srv, s := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.HasSuffix(r.URL.Path, "/presign") {
			writeMsgpack(t, w, &messages.PresignResponse{URL: "/blobs/k1", Key: "k1"})
			return
		}
		_, _ = w.Write([]byte("payload"))
	})
	c, _ := uplink.New(srv.URL, uplink.WithToken("t"))
	key := "k1"
	p, err := c.Presign(context.Background(), "default", &messages.PresignRequest{Op: messages.PresignGet, Key: &key})
	if err != nil || p.URL != "/blobs/k1" {
		t.Fatalf("%+v %v", p, err)
	}
	r, body := s.last()
	if r.URL.Path != "/v1/namespaces/default/payloads/presign" {
		t.Fatal(r.URL.Path)
	}
	var pr messages.PresignRequest
	if err := messages.Unmarshal(body, &pr); err != nil || pr.Op != "get" || *pr.Key != "k1" {
		t.Fatalf("%+v %v", pr, err)
	}
	data, err := c.Download(context.Background(), p.URL, 1<<20)
	if err != nil || string(data) != "payload" {
		t.Fatalf("%q %v", data, err)
	}
}

func TestNewRejectsBadURLAndMissingFiles(t *testing.T) {
	if _, err := uplink.New("ftp://x"); err == nil {
		t.Fatal("ftp accepted")
	}
	if _, err := uplink.New("http://x", uplink.WithTokenFile("/nonexistent")); err == nil {
		t.Fatal("missing token file accepted")
	}
	if _, err := uplink.New("http://x", uplink.WithCAFile("/nonexistent")); err == nil {
		t.Fatal("missing ca file accepted")
	}
}

func TestHelloTokenOnlyOnHello(t *testing.T) {
	srv, s := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == uplink.PathHello {
			writeMsgpack(t, w, &messages.HelloResponse{})
			return
		}
		writeMsgpack(t, w, &messages.PollResponse{})
	})
	c, _ := uplink.New(srv.URL, uplink.WithToken("daemon"), uplink.WithHelloToken("dle_enroll"))
	if _, err := c.Hello(context.Background(), &messages.HelloRequest{MachineID: "m"}); err != nil {
		t.Fatal(err)
	}
	r, _ := s.last()
	if r.Header.Get("Authorization") != "Bearer dle_enroll" {
		t.Fatalf("hello auth %q", r.Header.Get("Authorization"))
	}
	if _, err := c.Poll(context.Background(), &messages.PollRequest{}); err != nil {
		t.Fatal(err)
	}
	r, _ = s.last()
	if r.Header.Get("Authorization") != "Bearer daemon" {
		t.Fatalf("poll auth %q", r.Header.Get("Authorization"))
	}
}

// The long-poll, which a finished job cuts short, and a job's payload
// fetch, which an aborted job cuts short, never share a keep-alive
// connection with the deliveries (results, acks, chunks), nor with each
// other: net/http can fail a live request with the context.Canceled of
// another one cancelled on the same connection (the chaos soak lost chunks
// and results to it while polls were being abandoned).
func TestAbandonedRequestsKeepToConnectionsOfTheirOwn(t *testing.T) {
	srv, s := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		switch {
		case r.URL.Path == uplink.PathPoll:
			writeMsgpack(t, w, &messages.PollResponse{Commands: []messages.Command{}})
		case strings.HasSuffix(r.URL.Path, "/presign"):
			writeMsgpack(t, w, &messages.PresignResponse{URL: "/blobs/k1", Key: "k1"})
		case strings.HasPrefix(r.URL.Path, "/blobs/"):
			_, _ = w.Write([]byte("payload"))
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	c, err := uplink.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, key := context.Background(), "k1"
	family := map[string]string{}
	steps := []struct {
		family string
		do     func() error
	}{
		{"poll", func() error { _, err := c.Poll(ctx, &messages.PollRequest{WorkerID: "w"}); return err }},
		{"delivery", func() error { return c.ExecResult(ctx, "e1", &messages.ExecResult{}) }},
		{"fetch", func() error {
			_, err := c.Presign(ctx, "default", &messages.PresignRequest{Op: messages.PresignGet, Key: &key})
			return err
		}},
		{"delivery", func() error { return c.PostChunk(ctx, "/v1/daemon/exec/e1/chunk", []byte("x")) }},
		{"poll", func() error { _, err := c.Poll(ctx, &messages.PollRequest{WorkerID: "w"}); return err }},
		{"fetch", func() error { _, err := c.Download(ctx, "/blobs/k1", 1<<20); return err }},
		{"delivery", func() error { return c.Ack(ctx, &messages.Ack{InvocationID: "i1", State: messages.StateSucceeded}) }},
		{"poll", func() error { _, err := c.Poll(ctx, &messages.PollRequest{WorkerID: "w"}); return err }},
	}
	for i, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("step %d (%s): %v", i, st.family, err)
		}
		r, _ := s.last()
		if f, ok := family[r.RemoteAddr]; ok && f != st.family {
			t.Fatalf("step %d: a %s request on the connection of a %s one (%s %s)", i, st.family, f, r.Method, r.URL.Path)
		}
		family[r.RemoteAddr] = st.family
	}
}
