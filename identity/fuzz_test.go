package identity_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"testing"

	"nymph/identity"
)

// FuzzVerify feeds arbitrary header values, request lines and bodies to
// Verify. It must never panic; every refusal must be an authentication
// error; an acceptance must be a genuine signature and must not be
// accepted twice. When sign is odd the fuzzer's fields are signed for real,
// so the paths past the signature check are explored too.
func FuzzVerify(f *testing.F) {
	k := seedKey(f, 1)
	revoked := seedKey(f, 3)
	keys := newMemKeys(k, revoked)
	keys.keys[revoked.ID()] = storedKey{pub: revoked.PublicKey(), revoked: true}

	req := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: "/v1/daemon/poll", RawQuery: "a=1"}, Header: http.Header{}}
	body := []byte("body")
	if err := k.SignRequest(req, body, t0); err != nil {
		f.Fatal(err)
	}
	hv := func(name string) string { return req.Header.Get(name) }
	f.Add("POST", "/v1/daemon/poll", "a=1", hv(identity.HeaderKeyID), hv(identity.HeaderTimestamp), hv(identity.HeaderNonce), hv(identity.HeaderSignature), body, uint8(0), uint8(0))
	f.Add("POST", "/v1/daemon/poll", "a=1", hv(identity.HeaderKeyID), hv(identity.HeaderTimestamp), hv(identity.HeaderNonce), hv(identity.HeaderSignature), body, uint8(1), uint8(0))
	f.Add("get", "", "", revoked.ID(), "1700000000", "AAAAAAAAAAAAAAAAAAAAAA", "", []byte{}, uint8(1), uint8(0))
	f.Add("POST", "/", "", "k_x", "-9223372036854775808", "AAAAAAAAAAAAAAAAAAAAAA", "!", []byte(nil), uint8(0), uint8(15))
	f.Add("POST", "/\n", "\n", k.ID(), "9223372036854775807", "A\r\nAAAAAAAAAAAAAAAAAAAAA", hv(identity.HeaderSignature)+"=", []byte("x"), uint8(1), uint8(3))

	f.Fuzz(func(t *testing.T, method, path, query, keyID, ts, nonce, sig string, body []byte, sign, dup uint8) {
		v := identity.NewVerifier(keys, identity.WithNonceCapacity(8))
		if sign&1 == 1 {
			if n, err := strconv.ParseInt(ts, 10, 64); err == nil {
				signer := k
				if keyID == revoked.ID() {
					signer = revoked
				}
				sig = base64.RawURLEncoding.EncodeToString(signer.Sign(identity.Canonical(keyID, method, pathOrSlash(path), query, n, nonce, body)))
			}
		}
		r := &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{}}
		for i, hdr := range [][2]string{{identity.HeaderKeyID, keyID}, {identity.HeaderTimestamp, ts}, {identity.HeaderNonce, nonce}, {identity.HeaderSignature, sig}} {
			r.Header.Set(hdr[0], hdr[1])
			if dup&(1<<i) != 0 {
				r.Header.Add(hdr[0], hdr[1])
			}
		}
		got, err := v.Verify(context.Background(), r, body, t0)
		if err != nil {
			if !errors.Is(err, identity.ErrUnauthenticated) {
				t.Fatalf("refusal that is not an auth error: %v", err)
			}
			return
		}
		if got != keyID || keyID != k.ID() {
			t.Fatalf("accepted as %q with key id header %q", got, keyID)
		}
		raw, decErr := base64.RawURLEncoding.DecodeString(sig)
		n, _ := strconv.ParseInt(ts, 10, 64)
		if decErr != nil || !ed25519.Verify(k.PublicKey(), identity.Canonical(keyID, method, pathOrSlash(path), query, n, nonce, body), raw) {
			t.Fatalf("accepted a signature that does not verify")
		}
		if _, err := v.Verify(context.Background(), r, bytes.Clone(body), t0); !errors.Is(err, identity.ErrReplay) {
			t.Fatalf("second acceptance: %v", err)
		}
	})
}

// pathOrSlash mirrors what the verifier hashes for the path: the escaped
// form, "/" when empty.
func pathOrSlash(p string) string {
	u := url.URL{Path: p}
	if e := u.EscapedPath(); e != "" {
		return e
	}
	return "/"
}

func FuzzParsePublicKey(f *testing.F) {
	f.Add(seedKey(f, 1).PublicKeyB64())
	f.Add("")
	f.Add("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
	f.Add("AAAAAAAAAAAAAAAAAAAA\nAAAAAAAAAAAAAAAAAAAAAAA")
	f.Fuzz(func(t *testing.T, s string) {
		pub, err := identity.ParsePublicKey(s)
		if err != nil {
			return
		}
		if len(pub) != ed25519.PublicKeySize {
			t.Fatalf("accepted %q as a %d-byte key", s, len(pub))
		}
		if back := base64.RawURLEncoding.EncodeToString(pub); back != s {
			t.Fatalf("accepted %q, which is not the canonical spelling %q", s, back)
		}
	})
}
