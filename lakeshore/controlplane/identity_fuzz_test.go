package controlplane

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/identity"
	"nymph/messages"
)

// FuzzSignedDaemonRoutes sends arbitrary signature headers, bearers,
// public keys and bodies to hello, poll and keys. Nothing may answer 5xx
// or panic, and no hello may enroll a key without a genuine signature.
func FuzzSignedDaemonRoutes(f *testing.F) {
	e := newEnv(f, func(c *Config) { c.Logger = zerolog.Nop() })
	e.srv.pollCap = time.Millisecond
	key, err := identity.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		f.Fatal(err)
	}
	r := e.op(http.MethodPost, "/v1/tokens", map[string]any{"kind": "enroll"})
	tok := decodeJS[struct{ Token string }](f, r).Token

	probe := httptest.NewRequest(http.MethodPost, "/v1/daemon/hello", nil)
	if err := key.SignRequest(probe, []byte("x"), e.clock.Now()); err != nil {
		f.Fatal(err)
	}
	h := func(n string) string { return probe.Header.Get(n) }
	hello := helloReq("m", "l")
	hello.PublicKey = key.PublicKeyB64()
	helloBody := mustMP(f, hello)
	f.Add(uint8(0), tok, h(identity.HeaderKeyID), h(identity.HeaderTimestamp), h(identity.HeaderNonce), h(identity.HeaderSignature), key.PublicKeyB64(), helloBody)
	f.Add(uint8(1), "", key.ID(), "0", "AAAAAAAAAAAAAAAAAAAAAA", "", "", []byte{0x80})
	f.Add(uint8(2), testDaemon, "k_,x", "99999999999999999999", "@", "AA==", "AAAA", []byte("\x83\xa9worker_id\xa1w"))
	f.Add(uint8(0), "dle_x", "", "", "", "", "!!", []byte{})

	paths := []string{"/v1/daemon/hello", "/v1/daemon/poll", "/v1/daemon/keys", "/v1/daemon/ack", "/v1/daemon/event"}
	f.Fuzz(func(t *testing.T, route uint8, bearer, kid, ts, nonce, sig, pub string, body []byte) {
		path := paths[int(route)%len(paths)]
		if path == "/v1/daemon/hello" && pub != "" {
			var m map[string]any
			if messages.Unmarshal(body, &m) == nil && m != nil {
				m["public_key"] = pub
				if b, err := messages.Marshal(m); err == nil {
					body = b
				}
			}
		}
		req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", messages.ContentType)
		if bearer != "" {
			req.Header["Authorization"] = []string{"Bearer " + bearer}
		}
		for name, v := range map[string]string{identity.HeaderKeyID: kid, identity.HeaderTimestamp: ts, identity.HeaderNonce: nonce, identity.HeaderSignature: sig} {
			if v != "" {
				req.Header[name] = []string{v}
			}
		}
		rec := httptest.NewRecorder()
		e.srv.Handler().ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s: %d %q", path, rec.Code, rec.Body.Bytes())
		}
		if path == "/v1/daemon/hello" && rec.Code == http.StatusOK {
			var hr messages.HelloResponse
			if err := messages.Unmarshal(rec.Body.Bytes(), &hr); err != nil {
				t.Fatalf("hello answer: %v", err)
			}
			if hr.KeyID != nil {
				t.Fatalf("a fuzzed hello enrolled key %s", *hr.KeyID)
			}
		}
	})
}

// BenchmarkPollAuth compares a poll authenticated by the bearer with one
// signed by an enrolled key (signing, verification, key lookup), in one run.
func BenchmarkPollAuth(b *testing.B) {
	e := newEnv(b, func(c *Config) { c.Logger = zerolog.Nop() })
	bearerWorker, bearerCursor := e.hello("m", "bearer")
	key, err := identity.Generate()
	if err != nil {
		b.Fatal(err)
	}
	r := e.op(http.MethodPost, "/v1/tokens", map[string]any{"kind": "enroll"})
	tok := decodeJS[struct{ Token string }](b, r).Token
	hello := helloReq("m", "signed")
	hello.PublicKey = key.PublicKeyB64()
	body := mustMP(b, hello)
	req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/daemon/hello", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	if err := key.SignRequest(req, body, e.clock.Now()); err != nil {
		b.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	raw, err := io.ReadAll(res.Body)
	res.Body.Close()
	var hr messages.HelloResponse
	if err := messages.Unmarshal(raw, &hr); err != nil || hr.KeyID == nil {
		b.Fatalf("enrollment: %v %q", err, raw)
	}
	signedWorker, signedCursor := *hr.WorkerID, *hr.Cursor

	poll := func(b *testing.B, sign bool, worker, cursor string) {
		body := mustMP(b, &messages.PollRequest{WorkerID: worker, Cursor: &cursor})
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/daemon/poll", bytes.NewReader(body))
			req.Header.Set("Content-Type", messages.ContentType)
			if sign {
				if err := key.SignRequest(req, body, e.clock.Now()); err != nil {
					b.Fatal(err)
				}
			} else {
				req.Header.Set("Authorization", "Bearer "+testDaemon)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				b.Fatalf("poll: %d", res.StatusCode)
			}
		}
	}
	b.Run("bearer", func(b *testing.B) { poll(b, false, bearerWorker, bearerCursor) })
	b.Run("signed", func(b *testing.B) { poll(b, true, signedWorker, signedCursor) })
}
