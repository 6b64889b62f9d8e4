package controlplane

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"regexp"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// newWorkerID returns a 24-hex id shaped like a Mongo ObjectId: four bytes
// of creation time, eight random.
func newWorkerID(now time.Time) string {
	var b [12]byte
	binary.BigEndian.PutUint32(b[:4], uint32(now.Unix()))
	_, _ = rand.Read(b[4:])
	return hex.EncodeToString(b[:])
}

// newExecID returns 128 random bits as 32 hex characters. The exec id is
// what authenticates the result and chunk callbacks, so it must be
// unguessable.
func newExecID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newULID is for ids that need ordering, not secrecy: commands, events,
// session tokens.
func newULID() string { return ulid.Make().String() }

// newSecret returns prefix followed by 256 random bits, base64url.
func newSecret(prefix string) string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

var (
	namespaceRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`) })
	pathIDRe    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`) })
)

func validNamespace(ns string) bool { return namespaceRe().MatchString(ns) }

// validPathID screens ids taken from a URL before they reach the store.
func validPathID(id string) bool { return pathIDRe().MatchString(id) }
