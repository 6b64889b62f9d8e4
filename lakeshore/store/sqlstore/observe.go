package sqlstore

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// OpObserver is told of each statement the store ran: its operation (the
// statement's verb and table, "select_workers"; "pipeline" for statements
// an engine sent together), how long it took (a query until its rows
// were closed) and whether it failed.
type OpObserver func(op string, took time.Duration, failed bool)

// opHook holds the observer; nil inside means none, and a statement then
// costs no clock read.
type opHook struct {
	p atomic.Pointer[OpObserver]
	// names caches opName per query text; the queries are this package's
	// constants, so it holds as many entries as there are statements.
	names sync.Map
}

// ObserveOps sets the observer of every statement from now on (nil: none).
func (db *DB) ObserveOps(o OpObserver) {
	if o == nil {
		db.hook.p.Store(nil)
		return
	}
	db.hook.p.Store(&o)
}

// begin returns what to call once the statement query is over, or nil.
func (h *opHook) begin(query string) func(failed bool) {
	if h == nil {
		return nil
	}
	o := h.p.Load()
	if o == nil {
		return nil
	}
	start := time.Now()
	return func(failed bool) { (*o)(h.name(query), time.Since(start), failed) }
}

func (h *opHook) name(query string) string {
	if n, ok := h.names.Load(query); ok {
		return n.(string)
	}
	n := opName(query)
	h.names.Store(query, n)
	return n
}

// pipelineOp is the query text, and the operation, of statements sent
// together (Pipeliner.ExecAll).
const pipelineOp = "pipeline"

// opName is a statement's verb and the table it names first, lower case:
// a label with as many values as the schema has tables, whatever the
// arguments.
func opName(query string) string {
	words := strings.Fields(strings.ToLower(query))
	if len(words) == 0 {
		return "unknown"
	}
	verb := words[0]
	var after string
	switch verb {
	case "insert":
		after = "into"
	case "update":
		if len(words) > 1 {
			return verb + "_" + tableName(words[1])
		}
		return verb
	case "delete", "select", "with":
		after = "from"
	default:
		return verb
	}
	if verb == "with" {
		// WITH x AS (...) SELECT|UPDATE|DELETE|INSERT: named for what
		// the CTE reads first.
		verb = "select"
	}
	for i, w := range words[1:] {
		if w == after && i+2 < len(words) {
			if t := tableName(words[i+2]); t != "" {
				return verb + "_" + t
			}
			break
		}
	}
	return verb
}

// tableName is the identifier at the start of w ("workers", from
// "workers(id," or "workers,"); "" when w starts a subquery.
func tableName(w string) string {
	end := strings.IndexFunc(w, func(r rune) bool {
		return !(r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9')
	})
	if end >= 0 {
		w = w[:end]
	}
	return w
}
