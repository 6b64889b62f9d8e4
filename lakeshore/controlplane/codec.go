package controlplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"nymph/identity"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// Body limits: each daemon route's is what the daemon can legitimately
// send on it, plus slack for the envelope; the operator routes keep theirs.
const (
	limitSmall = 1 << 20 // operator JSON requests
	// limitCommand bounds an operator's exec, setup and other command
	// requests (a script, an exec's stdin).
	limitCommand = 32 << 20
	// An exec result carries at most messages.OutputCap of stdout and of
	// stderr, and an inline result (null today) under the inline
	// threshold, as bin or, from serde without serde_bytes, an array of
	// small integers (two bytes each at most).
	limitExecResult = 2*messages.OutputCap + 2*messages.InlineThreshold + limitSlack
	// limitExecResultJSON is the same result as JSON: every output byte may
	// be escaped as \u00XX (six bytes), a result byte written as "255,".
	limitExecResultJSON = 6*2*messages.OutputCap + 4*messages.InlineThreshold + limitSlack
	// limitExecChunk is one streamed exec chunk: the daemon posts what it
	// buffered, which it bounds at 16 MiB (dropping the oldest bytes past
	// it) while the chunk route does not answer.
	limitExecChunk = 16 << 20
	// limitHello: tags, lanes, runners, the version probes and a public
	// key; a real one weighs a few KiB.
	limitHello = 256 << 10
	// limitPoll: the status of every run the daemon holds, each with a
	// stdout tail of up to 4 KiB: a thousand runs.
	limitPoll = 4 << 20
	// limitAck: a result blob of up to messages.MaxPayload bytes (a bin),
	// and an error whose traceback may be long.
	limitAck = messages.MaxPayload + 1<<20
	// limitEvent: one invocation.log piece (messages.MaxLogPiece of output
	// as bin) or an outcome with its 4 KiB tail.
	limitEvent = messages.MaxLogPiece + limitSlack
	// limitResultChunk: one piece of a streamed result, cut like a log
	// piece (no daemon posts them yet).
	limitResultChunk = messages.MaxLogPiece + limitSlack
	// limitKeys: a worker id, a public key and its id.
	limitKeys = 16 << 10
	// limitSlack is the envelope around the payload of a route: keys,
	// ids, small fields.
	limitSlack = 64 << 10
)

// fieldError is a client error naming the offending field.
type fieldError struct {
	status int
	field  string
	msg    string
}

func (e *fieldError) Error() string {
	if e.field == "" {
		return e.msg
	}
	return e.field + ": " + e.msg
}

func badField(status int, field, format string, args ...any) *fieldError {
	return &fieldError{status: status, field: field, msg: fmt.Sprintf(format, args...)}
}

// readBody reads the whole body up to limit bytes. A Content-Length over
// the limit is refused before a byte is read; one within it sizes the
// buffer exactly, where growing it as io.ReadAll does can cost twice the
// body.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	tooLarge := badField(http.StatusRequestEntityTooLarge, "body", "larger than %d bytes", limit)
	if kb, ok := r.Body.(*keptBody); ok {
		// Read before (a guard hashed it): handed on, not copied.
		if int64(len(kb.b)) > limit {
			return nil, tooLarge
		}
		return kb.b, nil
	}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	var b []byte
	var err error
	if r.ContentLength >= 0 {
		b = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, b)
	} else {
		b, err = io.ReadAll(r.Body)
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge
		}
		return nil, badField(http.StatusBadRequest, "body", "could not be read: %v", err)
	}
	return b, nil
}

// keptBody is a body already read, put back for the handler: readBody
// returns its bytes as they are, other readers read them.
type keptBody struct {
	*bytes.Reader
	b []byte
}

func (*keptBody) Close() error { return nil }

// keepBody puts a body read by a guard back on r for the handler.
func keepBody(r *http.Request, body []byte) {
	r.Body = &keptBody{Reader: bytes.NewReader(body), b: body}
}

// --- daemon side: msgpack ---

func writeMsgpack(w http.ResponseWriter, status int, v any) {
	b, err := messages.Marshal(v)
	if err != nil {
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", messages.ContentType)
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeDaemonError(w http.ResponseWriter, err error) {
	var fe *fieldError
	if errors.As(err, &fe) {
		writeMsgpack(w, fe.status, &messages.ValidationError{Error: fe.msg, Field: fe.field})
		return
	}
	var te *identity.ThrottledError
	if errors.As(err, &te) {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(te.RetryAfter/time.Second), 10))
		writeMsgpack(w, http.StatusTooManyRequests, &messages.ValidationError{Error: "this key sends more signed requests than a daemon does; retry after the Retry-After seconds"})
		return
	}
	writeMsgpack(w, http.StatusServiceUnavailable, &messages.ValidationError{Error: "the control plane could not complete the request; retry"})
}

// scanMap scans a msgpack body and returns it as a map whose keys are
// strings, read in place: the routes check fields on it by path (telling a
// missing key from a zero value, naming the field at fault) without
// decoding anything into generic values, which cost 16 to 100 times the
// bytes they are made from.
func scanMap(body []byte) (messages.Value, error) {
	if len(body) == 0 {
		return nil, badField(http.StatusBadRequest, "body", "empty; want a msgpack map")
	}
	m, err := messages.ScanValue(body)
	if err != nil {
		return nil, badField(http.StatusBadRequest, "body", "not a msgpack map with string keys: %v", err)
	}
	switch m.Type() {
	case messages.TypeMap:
	case messages.TypeNil:
		return nil, badField(http.StatusBadRequest, "body", "nil; want a msgpack map")
	default:
		return nil, badField(http.StatusBadRequest, "body", "not a msgpack map with string keys: a %s", typeName(m.Type()))
	}
	for k := range m.Entries() {
		// What the decoder reads a field name from.
		if t := k.Type(); t != messages.TypeStr && t != messages.TypeBin && t != messages.TypeNil {
			return nil, badField(http.StatusBadRequest, "body", "not a msgpack map with string keys: a key is a %s", typeName(t))
		}
	}
	return m, nil
}

// typeName names a msgpack type in a refusal.
func typeName(t messages.Type) string {
	switch t {
	case messages.TypeNil:
		return "nil"
	case messages.TypeBool:
		return "boolean"
	case messages.TypeInt:
		return "integer"
	case messages.TypeFloat:
		return "float"
	case messages.TypeStr:
		return "string"
	case messages.TypeBin:
		return "bin"
	case messages.TypeArray:
		return "array"
	case messages.TypeMap:
		return "map"
	case messages.TypeExt:
		return "ext"
	}
	return "malformed value"
}

// decodeTyped decodes body into v after the checks passed; a failure here
// means a field had a shape the checks did not anticipate.
func decodeTyped(body []byte, v any) error {
	if err := messages.Unmarshal(body, v); err != nil {
		return badField(http.StatusUnprocessableEntity, "body", "does not fit the expected shape: %v", err)
	}
	return nil
}

// decodeChecked decodes a msgpack body into v once its fields pass checks,
// so a fault is named by its field before the typed decode.
func decodeChecked(body []byte, checks []check, v any) error {
	m, err := scanMap(body)
	if err == nil {
		err = runChecks(m, checks)
	}
	if err == nil {
		err = decodeTyped(body, v)
	}
	return err
}

// --- operator side: JSON ---

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeOperatorError(w http.ResponseWriter, err error) {
	var fe *fieldError
	if errors.As(err, &fe) {
		writeJSON(w, fe.status, operatorapi.Error{Error: fe.msg, Field: fe.field})
		return
	}
	writeJSON(w, http.StatusServiceUnavailable, operatorapi.Error{Error: "the control plane could not complete the request; retry"})
}

// readJSON reads a small operator request body and decodes it into v.
func readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := readBody(w, r, limitSmall)
	if err != nil {
		return err
	}
	return decodeJSON(body, v)
}

// decodeJSON decodes one JSON object from body into v. An empty body is an
// empty object. It decodes in place (a json.Decoder would copy the body
// into buffers of its own, up to twice its size), once the body's density
// is known to be one whose decode stays within a few times its size.
func decodeJSON(body []byte, v any) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		body = []byte("{}")
	}
	if body[0] != '{' {
		return badField(http.StatusBadRequest, "body", "not a JSON object")
	}
	if n := jsonElements(body); n*jsonElementCost > 2*len(body)+genericSlack {
		return badField(http.StatusBadRequest, "body", "%d JSON values in %d bytes: more than a body of this size may hold", n, len(body))
	}
	if err := json.Unmarshal(body, v); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) && se.Offset > 0 && se.Offset <= int64(len(body)) && json.Valid(body[:se.Offset-1]) {
			return badField(http.StatusBadRequest, "body", "trailing data after the JSON object")
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return badField(http.StatusBadRequest, te.Field, "must be %s, not JSON %s", te.Type, te.Value)
		}
		return badField(http.StatusBadRequest, "body", "malformed JSON: %v", err)
	}
	return nil
}

// jsonElementCost is what one JSON value may cost decoded (a string header
// and its bytes, a map entry, a slice element, an interface value).
const jsonElementCost = 64

// jsonElements counts the values of a JSON text, near enough: one per
// container and one per comma outside strings. It reads the bytes once
// and allocates nothing.
func jsonElements(b []byte) int {
	n := 0
	inStr, esc := false, false
	for _, c := range b {
		switch {
		case esc:
			esc = false
		case inStr:
			switch c {
			case '\\':
				esc = true
			case '"':
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == ',', c == '[', c == '{':
			n++
		}
	}
	return n
}

// isJSON decides how to read a body that may be JSON or msgpack: by its
// media type when it names one, else by its first byte.
func isJSON(contentType string, body []byte) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case strings.Contains(mt, "json"):
		return true
	case strings.Contains(mt, "msgpack"):
		return false
	}
	t := bytes.TrimLeft(body, " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}

// --- field checks over the raw bytes ---

// lookup finds a dotted path in a scanned map. present is false when any
// key on the way is absent or a parent on the way is nil (error: nil on a
// successful ack has no fields); a non-map on the way, or a key given
// twice, is reported through err: the decoder would decode every copy of
// a repeated key, the checks see one (serde refuses repeats too).
func lookup(m messages.Value, path string) (v messages.Value, present bool, err error) {
	cur := m
	walked := ""
	for k := range strings.SplitSeq(path, ".") {
		if cur.IsNil() {
			return nil, false, nil
		}
		if cur.Type() != messages.TypeMap {
			return nil, false, badField(http.StatusUnprocessableEntity, walked, "must be a map")
		}
		if walked != "" {
			walked += "."
		}
		walked += k
		next, n := cur.Get(k)
		switch {
		case n == 0:
			return nil, false, nil
		case n > 1:
			return nil, false, badField(http.StatusUnprocessableEntity, walked, "given %d times", n)
		}
		cur = next
	}
	return cur, true, nil
}

// check describes one field of a body.
type check struct {
	path     string
	required bool // the key must be present and not nil
	kind     string
	// elemCost is what one element of a list decodes to in Go (bytes), for
	// kStrings (default stringCost) and kMapsList (required).
	elemCost int
}

// Kinds a check can demand.
const (
	kString    = "string"
	kNonEmpty  = "non-empty string"
	kStrings   = "list of strings"
	kMap       = "map"
	kNumber    = "number"
	kUint32    = "integer from 0 to 4294967295"
	kUint64    = "non-negative integer"
	kInt32     = "integer from -2147483648 to 2147483647"
	kBool      = "boolean"
	kBytes     = "bytes"
	kMapsList  = "list of maps"
	kStrOrUint = "string or non-negative integer"
)

// Decoded sizes the list bounds count with.
const (
	// stringCost is a string in a []string: its header and the smallest
	// allocation of its bytes.
	stringCost = 32
	// listSlack lets a short list of tiny elements through: what a list
	// may cost beyond its own size.
	listSlack = 16 << 10
	// genericSlack is the same for a piece decoded into interface values,
	// and for a JSON body.
	genericSlack = 64 << 10
	// genericValueCost and genericContainerCost are what a value decoded
	// into an interface costs, and what a map or slice adds (a Go map's
	// first group of slots is a few hundred bytes).
	genericValueCost     = 32
	genericContainerCost = 320
)

func runChecks(m messages.Value, checks []check) error {
	for _, c := range checks {
		v, present, err := lookup(m, c.path)
		if err != nil {
			return err
		}
		if !present || v.IsNil() {
			if c.required {
				return badField(http.StatusUnprocessableEntity, c.path, "missing")
			}
			continue
		}
		if !fits(v, c.kind) {
			return badField(http.StatusUnprocessableEntity, c.path, "must be a %s", c.kind)
		}
		if err := listBounded(v, c); err != nil {
			return err
		}
	}
	return nil
}

// listBounded refuses a list whose typed decode would cost more than its
// own bytes (plus listSlack): a list of a million one-byte elements decodes
// to a million string headers or structs.
func listBounded(v messages.Value, c check) error {
	per := c.elemCost
	switch {
	case c.kind == kStrings && per == 0:
		per = stringCost
	case c.kind != kStrings && c.kind != kMapsList:
		return nil
	}
	if n := v.Len(); n*per > len(v)+listSlack {
		return badField(http.StatusUnprocessableEntity, c.path, "%d elements in %d bytes: more than a list of this size may hold", n, len(v))
	}
	return nil
}

// genericBounded refuses a piece whose decode into interface values would
// cost more than twice its size (plus genericSlack); it runs before the
// few pieces that are decoded that way.
func genericBounded(field string, v messages.Value) error {
	values, containers := v.Census()
	if values*genericValueCost+containers*genericContainerCost > len(v)+genericSlack {
		return badField(http.StatusUnprocessableEntity, field, "%d values in %d bytes: more than a field of this size may hold", values, len(v))
	}
	return nil
}

func fits(v messages.Value, kind string) bool {
	switch kind {
	case kString:
		return v.Type() == messages.TypeStr
	case kNonEmpty:
		return v.Type() == messages.TypeStr && v.Len() > 0
	case kStrings:
		return allElems(v, func(e messages.Value) bool { return e.Type() == messages.TypeStr })
	case kMapsList:
		return allElems(v, func(e messages.Value) bool { return e.Type() == messages.TypeMap })
	case kMap:
		return v.Type() == messages.TypeMap
	case kNumber:
		f, ok := v.Float()
		return ok && !math.IsNaN(f) && !math.IsInf(f, 0)
	case kUint32:
		n, ok := v.Int()
		return ok && n >= 0 && n <= math.MaxUint32
	case kUint64:
		n, ok := v.Int()
		return ok && n >= 0
	case kInt32:
		n, ok := v.Int()
		return ok && n >= math.MinInt32 && n <= math.MaxInt32
	case kStrOrUint:
		if v.Type() == messages.TypeStr {
			return true
		}
		n, ok := v.Int()
		return ok && n >= 0
	case kBool:
		_, ok := v.Bool()
		return ok
	case kBytes:
		if _, ok := v.Bin(); ok {
			return true
		}
		return allElems(v, func(e messages.Value) bool {
			n, ok := e.Int()
			return ok && n >= 0 && n <= 255
		})
	}
	return false
}

// allElems reports whether v is an array whose every element passes ok.
func allElems(v messages.Value, ok func(messages.Value) bool) bool {
	if v.Type() != messages.TypeArray {
		return false
	}
	for e := range v.Elems() {
		if !ok(e) {
			return false
		}
	}
	return true
}

// jsonSafe turns a generic msgpack value into something encoding/json can
// always encode: non-finite floats become nil, unknown types their string.
func jsonSafe(v any) any {
	switch x := v.(type) {
	case nil, bool, string, []byte,
		int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, uint:
		return x
	case float32:
		return jsonSafe(float64(x))
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonSafe(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonSafe(e)
		}
		return out
	default:
		return fmt.Sprint(x)
	}
}
