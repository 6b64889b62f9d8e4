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

// Body limits. A result carries up to 1 MiB of stdout and of stderr plus an
// inline result; JSON escaping can blow that up several times.
const (
	limitSmall  = 1 << 20
	limitResult = 32 << 20
	limitChunk  = 16 << 20
	limitAck    = 128 << 20
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

// readBody reads the whole body up to limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, badField(http.StatusRequestEntityTooLarge, "body", "larger than %d bytes", limit)
		}
		return nil, badField(http.StatusBadRequest, "body", "could not be read: %v", err)
	}
	return b, nil
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

// decodeMsgpackMap decodes a msgpack body into a generic map, which lets the
// routes tell a missing key from a zero value and name the field at fault.
func decodeMsgpackMap(body []byte) (map[string]any, error) {
	if len(body) == 0 {
		return nil, badField(http.StatusBadRequest, "body", "empty; want a msgpack map")
	}
	var m map[string]any
	if err := messages.Unmarshal(body, &m); err != nil {
		return nil, badField(http.StatusBadRequest, "body", "not a msgpack map with string keys: %v", err)
	}
	if m == nil {
		return nil, badField(http.StatusBadRequest, "body", "nil; want a msgpack map")
	}
	return m, nil
}

// decodeTyped decodes body into v after the generic checks passed; a failure
// here means a field had a shape the checks did not anticipate.
func decodeTyped(body []byte, v any) error {
	if err := messages.Unmarshal(body, v); err != nil {
		return badField(http.StatusUnprocessableEntity, "body", "does not fit the expected shape: %v", err)
	}
	return nil
}

// decodeChecked decodes a msgpack body into v once its generic map passes
// checks, so a fault is named by its field before the typed decode.
func decodeChecked(body []byte, checks []check, v any) error {
	raw, err := decodeMsgpackMap(body)
	if err == nil {
		err = runChecks(raw, checks)
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

// decodeJSON decodes one JSON object from body into v. An empty body is an
// empty object.
// readJSON reads a small operator request body and decodes it into v.
func readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := readBody(w, r, limitSmall)
	if err != nil {
		return err
	}
	return decodeJSON(body, v)
}

func decodeJSON(body []byte, v any) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		body = []byte("{}")
	}
	if body[0] != '{' {
		return badField(http.StatusBadRequest, "body", "not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return badField(http.StatusBadRequest, te.Field, "must be %s, not JSON %s", te.Type, te.Value)
		}
		return badField(http.StatusBadRequest, "body", "malformed JSON: %v", err)
	}
	if dec.More() {
		return badField(http.StatusBadRequest, "body", "trailing data after the JSON object")
	}
	return nil
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

// --- generic-map checks ---

// lookup finds a dotted path in a generic map. present is false when any key
// on the way is absent; a non-map on the way is reported through err.
func lookup(m map[string]any, path string) (v any, present bool, err error) {
	cur := any(m)
	walked := ""
	for _, k := range strings.Split(path, ".") {
		if cur == nil {
			// A nil parent (error: nil on a successful ack) has no fields.
			return nil, false, nil
		}
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil, false, badField(http.StatusUnprocessableEntity, walked, "must be a map")
		}
		if walked != "" {
			walked += "."
		}
		walked += k
		cur, ok = mm[k]
		if !ok {
			return nil, false, nil
		}
	}
	return cur, true, nil
}

// check describes one field of a generic body.
type check struct {
	path     string
	required bool // the key must be present and not nil
	kind     string
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

func runChecks(m map[string]any, checks []check) error {
	for _, c := range checks {
		v, present, err := lookup(m, c.path)
		if err != nil {
			return err
		}
		if !present || v == nil {
			if c.required {
				return badField(http.StatusUnprocessableEntity, c.path, "missing")
			}
			continue
		}
		if !fits(v, c.kind) {
			return badField(http.StatusUnprocessableEntity, c.path, "must be a %s", c.kind)
		}
	}
	return nil
}

func fits(v any, kind string) bool {
	switch kind {
	case kString:
		_, ok := v.(string)
		return ok
	case kNonEmpty:
		s, ok := v.(string)
		return ok && s != ""
	case kStrings:
		l, ok := v.([]any)
		if !ok {
			return false
		}
		for _, e := range l {
			if _, ok := e.(string); !ok {
				return false
			}
		}
		return true
	case kMapsList:
		l, ok := v.([]any)
		if !ok {
			return false
		}
		for _, e := range l {
			if _, ok := e.(map[string]any); !ok {
				return false
			}
		}
		return true
	case kMap:
		_, ok := v.(map[string]any)
		return ok
	case kNumber:
		f, ok := asFloat(v)
		return ok && !math.IsNaN(f) && !math.IsInf(f, 0)
	case kUint32:
		n, ok := asInt(v)
		return ok && n >= 0 && n <= math.MaxUint32
	case kUint64:
		n, ok := asInt(v)
		return ok && n >= 0
	case kInt32:
		n, ok := asInt(v)
		return ok && n >= math.MinInt32 && n <= math.MaxInt32
	case kStrOrUint:
		if _, ok := v.(string); ok {
			return true
		}
		n, ok := asInt(v)
		return ok && n >= 0
	case kBool:
		_, ok := v.(bool)
		return ok
	case kBytes:
		switch b := v.(type) {
		case []byte, string:
			return true
		case []any:
			for _, e := range b {
				n, ok := asInt(e)
				if !ok || n < 0 || n > 255 {
					return false
				}
			}
			return true
		}
		return false
	}
	return false
}

// asInt reads any msgpack integer; a uint64 above MaxInt64 does not fit.
func asInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case int:
		return int64(n), true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		if n > math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	case uint:
		if uint64(n) > math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	}
	return 0, false
}

func asFloat(v any) (float64, bool) {
	switch f := v.(type) {
	case float32:
		return float64(f), true
	case float64:
		return f, true
	}
	if n, ok := asInt(v); ok {
		return float64(n), true
	}
	if n, ok := v.(uint64); ok {
		return float64(n), true
	}
	return 0, false
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
