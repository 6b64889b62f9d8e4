package identity

import (
	"errors"
	"fmt"
	"testing"
)

func TestNonceCacheExpires(t *testing.T) {
	c := newNonceCache(100, 300)
	for i := 0; i < 10; i++ {
		if err := c.remember("k", fmt.Sprint(i), 1000+int64(i), 1000); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.size(); n != 10 {
		t.Fatalf("size %d", n)
	}
	// At now=1305 the entries stamped 1000..1004 can no longer pass the skew
	// check; the next insert drops them.
	if err := c.remember("k", "new", 1305, 1305); err != nil {
		t.Fatal(err)
	}
	if n := c.size(); n != 6 {
		t.Fatalf("size %d after expiry, want 6", n)
	}
	if err := c.remember("k", "9", 1009, 1305); !errors.Is(err, ErrReplay) {
		t.Fatalf("unexpired nonce: %v", err)
	}
}

func TestNonceCacheNoncesAreScopedByKey(t *testing.T) {
	c := newNonceCache(100, 300)
	if err := c.remember("a", "n", 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := c.remember("b", "n", 1000, 1000); err != nil {
		t.Fatalf("same nonce, other key: %v", err)
	}
}

func TestNonceCacheIsBounded(t *testing.T) {
	c := newNonceCache(3, 300)
	for i := 0; i < 50; i++ {
		if err := c.remember("k", fmt.Sprint(i), 1000+int64(i), 1000); err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
		if n := c.size(); n > 3 {
			t.Fatalf("size %d over capacity", n)
		}
	}
	// Everything at or before the newest evicted timestamp (1046) is refused.
	if err := c.remember("k", "late", 1046, 1000); !errors.Is(err, ErrReplay) {
		t.Fatalf("at the floor: %v", err)
	}
	if err := c.remember("k", "fresh", 1047, 1000); err != nil {
		t.Fatalf("above the floor: %v", err)
	}
}

func FuzzParseKeyFile(f *testing.F) {
	k, err := NewKeyFromSeed(make([]byte, 32))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(k.marshal())
	f.Add([]byte("-----BEGIN NYMPH ED25519 PRIVATE KEY-----\n\n-----END NYMPH ED25519 PRIVATE KEY-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := parseKeyFile(data)
		if err != nil {
			return
		}
		// Whatever parses must survive a round trip unchanged.
		again, err := parseKeyFile(got.marshal())
		if err != nil || again.ID() != got.ID() {
			t.Fatalf("round trip: %v", err)
		}
	})
}
