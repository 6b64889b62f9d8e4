// Package identity owns a daemon's Ed25519 identity and the request
// signatures made with it. Both sides use it: the daemon loads or creates
// its key and signs every request (Key.SignRequest); the control plane
// checks those signatures (Verifier.Verify, and Verifier.VerifyWithKey for
// the enrollment hello, whose key is not stored yet).
//
// # Key file
//
// A key file is one PEM block and nothing else but whitespace:
//
//	-----BEGIN NYMPH ED25519 PRIVATE KEY-----
//	Key-Id: k_If4x36FUomFia_hUBG_SJw
//
//	<standard base64 of the 32-byte RFC 8032 seed>
//	-----END NYMPH ED25519 PRIVATE KEY-----
//
// The seed alone determines the key; the Key-Id header is there so an
// operator can tell which key a file holds without tooling, and a file whose
// header disagrees with its seed is refused as corrupt. No other header is
// accepted (in particular no PEM encryption). Files are written with mode
// 0600 through a temporary file in the same directory, fsync and rename, so a
// crash leaves either the old key or the new one, never a torn file.
//
// # Signature
//
// The signed message is the canonical string built by Canonical: nine
// fields joined by "\n", no trailing newline:
//
//	LS-SIG
//	v1
//	<key id>
//	<METHOD, upper-case>
//	<escaped path as sent, "/" when empty>
//	<raw query without "?", empty line when none>
//	<timestamp, unix seconds, decimal>
//	<nonce>
//	<lower-case hex sha256 of the exact body bytes>
//
// It travels in four headers (HeaderKeyID, HeaderTimestamp, HeaderNonce,
// HeaderSignature); the nonce is 16 random bytes and the signature the 64
// Ed25519 bytes, both base64url without padding. The key id is derived from
// the public key (KeyID), so a daemon can name its key before the control
// plane has ever seen it.
package identity
