// Package controlplane owns lakeshore's HTTP server: the daemon routes
// (msgpack, as the protocol spec describes them from the daemon's side) and
// the operator routes (JSON, the operatorapi contract), on top of the
// stores the composition root chooses and hands to New: a store.Store
// (SQLite or PostgreSQL), a PayloadStore and a releases.Store. routes.go
// lists every route.
//
// Everything a daemon or an operator could lose is in the store before the
// request that created it is answered: a control plane killed at any moment
// and restarted on the same data directory has every queued command and
// every finished result. What is only in memory are the wake-ups: a
// long-poll (a daemon's poll, an operator's wait on an exec) blocks on a
// per-worker or per-exec channel that is closed the instant something it
// waits for is written, never on a sleep loop.
//
// Every route checks its credential from the request's headers before it
// reads a byte of the body (a daemon's signature headers and stored key, or
// its bearer; for an exec callback also the exec's worker and state), and
// answers a refusal with the body unread and the connection closed. A
// daemon token is bound to the worker of its first hello and acts for that
// worker only; a fleet token (or the shared bootstrap token) acts for any.
//
// Commands are rows with a per-worker sequence number. A poll's cursor
// acknowledges everything up to it, so a poll answer lost on the way is
// delivered again; a daemon that sends no cursor gets the legacy
// delete-on-delivery.
package controlplane
