package identity_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"nymph/identity"
)

func BenchmarkSign(b *testing.B) {
	k := seedKey(b, 1)
	body := bytes.Repeat([]byte{0xa5}, 1024)
	req := httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", nil)
	b.ReportAllocs()
	for b.Loop() {
		if err := k.SignRequest(req, body, t0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	k := seedKey(b, 1)
	v := identity.NewVerifier(newMemKeys(k), identity.WithNonceCapacity(b.N+1), identity.WithKeyWindow(b.N+1))
	body := bytes.Repeat([]byte{0xa5}, 1024)
	// Every verification needs its own nonce, so sign them all up front.
	reqs := make([]*http.Request, b.N)
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", nil)
		if err := k.SignRequest(reqs[i], body, t0); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := v.Verify(ctx, reqs[i], body, t0); err != nil {
			b.Fatal(err)
		}
	}
}
