package identity

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
)

// b64 is the one encoding used for keys, nonces and signatures on the wire.
var b64 = base64.RawURLEncoding.Strict()

// Key is a daemon's Ed25519 keypair. It is immutable and safe for
// concurrent use. Printing a Key shows only its id, never the private half.
type Key struct {
	priv ed25519.PrivateKey
	pub  ed25519.PublicKey
	id   string
}

// Generate returns a fresh random key.
func Generate() (*Key, error) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := io.ReadFull(rand.Reader, seed); err != nil {
		return nil, fmt.Errorf("identity: generate key: %w", err)
	}
	return NewKeyFromSeed(seed)
}

// NewKeyFromSeed returns the key for a 32-byte RFC 8032 seed. It exists for
// deterministic test fixtures and for reading key files.
func NewKeyFromSeed(seed []byte) (*Key, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("identity: seed is %d bytes, want %d", len(seed), ed25519.SeedSize)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	pub := priv.Public().(ed25519.PublicKey)
	return &Key{priv: priv, pub: pub, id: KeyID(pub)}, nil
}

// PublicKey returns a copy of the public half.
func (k *Key) PublicKey() ed25519.PublicKey {
	return append(ed25519.PublicKey(nil), k.pub...)
}

// PublicKeyB64 returns the raw 32-byte public key, base64url without padding:
// the form of HelloRequest.public_key.
func (k *Key) PublicKeyB64() string { return b64.EncodeToString(k.pub) }

// ID returns KeyID of the public half.
func (k *Key) ID() string { return k.id }

// Sign returns the Ed25519 signature of msg. Request signing goes through
// SignRequest; this is for other proofs that the key is held.
func (k *Key) Sign(msg []byte) []byte { return ed25519.Sign(k.priv, msg) }

// String names the key by id so that logging a Key cannot leak its seed.
func (k *Key) String() string {
	if k == nil {
		return "identity.Key(nil)"
	}
	return "identity.Key(" + k.id + ")"
}

// GoString keeps %#v from dumping the private key.
func (k *Key) GoString() string { return k.String() }

// Format makes every verb (%d and %x included) print String, so no format
// verb walks into the private key bytes.
func (k *Key) Format(f fmt.State, verb rune) { _, _ = io.WriteString(f, k.String()) }

// KeyID is the deterministic id of a public key: "k_" followed by the first
// 16 bytes of sha256(pub), base64url without padding (24 characters in all).
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "k_" + b64.EncodeToString(sum[:16])
}

// ParsePublicKey decodes a raw 32-byte public key written base64url without
// padding. Padding, the standard alphabet, line breaks and any other length
// are refused, so one key has exactly one accepted spelling.
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	raw, err := decodeB64(s, ed25519.PublicKeySize, ed25519.PublicKeySize)
	if err != nil {
		return nil, fmt.Errorf("identity: public_key: %w", err)
	}
	return ed25519.PublicKey(raw), nil
}

// decodeB64 decodes strict unpadded base64url whose decoded length lies in
// [minLen, maxLen]. The alphabet is checked by hand because the standard
// decoder silently skips '\r' and '\n'.
func decodeB64(s string, minLen, maxLen int) ([]byte, error) {
	if s == "" {
		return nil, fmt.Errorf("empty")
	}
	if n := b64.DecodedLen(len(s)); len(s) > b64.EncodedLen(maxLen) || n < minLen {
		return nil, fmt.Errorf("%d characters, want the base64url form of %s", len(s), lengthWant(minLen, maxLen))
	}
	for i := 0; i < len(s); i++ {
		if !isB64URL(s[i]) {
			return nil, fmt.Errorf("character %q at offset %d is not unpadded base64url", s[i], i)
		}
	}
	raw, err := b64.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("not unpadded base64url: %w", err)
	}
	if len(raw) < minLen || len(raw) > maxLen {
		return nil, fmt.Errorf("decodes to %d bytes, want %s", len(raw), lengthWant(minLen, maxLen))
	}
	return raw, nil
}

func lengthWant(minLen, maxLen int) string {
	if minLen == maxLen {
		return fmt.Sprintf("%d bytes", minLen)
	}
	return fmt.Sprintf("%d to %d bytes", minLen, maxLen)
}

func isB64URL(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}
