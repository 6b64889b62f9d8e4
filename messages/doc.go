// Package messages owns the project's vocabulary: every body that crosses the
// wire between nymph and the control plane (msgpack maps with string keys,
// field names exactly as the protocol spells them) and every message the
// daemon's actors send each other.
//
// Wire compatibility with the original Rust daemon (rmp_serde to_vec_named)
// is the rule: integers in their smallest form, f64 always as float64, None as
// nil with the key kept, strings as str, and never nil where a list or map is
// expected. Encode through Marshal, which applies all of that; decode through
// Unmarshal, which tolerates what either side may emit.
//
// This package imports nothing of ours.
package messages
