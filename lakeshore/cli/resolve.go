package cli

import (
	"fmt"
	"sort"
	"strings"

	"nymph/lakeshore/operatorapi"
)

// AmbiguousError is a daemon argument that matches more than one worker.
type AmbiguousError struct {
	Arg        string
	Candidates []operatorapi.Worker
}

func (e *AmbiguousError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "daemon %q is ambiguous; it matches:", e.Arg)
	for _, w := range e.Candidates {
		fmt.Fprintf(&b, "\n  %s  %s  %s", w.ID, w.Label, w.State)
	}
	b.WriteString("\nname one by its full label or id (or pass --id)")
	return b.String()
}

// NoMatchError is a daemon argument that matches no worker.
type NoMatchError struct{ Arg string }

func (e *NoMatchError) Error() string {
	return fmt.Sprintf("no daemon matches %q (by id, label or label prefix); see `lakeshore daemon list`", e.Arg)
}

// ResolveDaemon picks the worker a daemon argument names, in this order:
// an exact id; an exact label (when several workers share it, the single
// live one, i.e. neither gone nor stale); a label prefix matching exactly
// one worker. Anything else is a NoMatchError or an AmbiguousError listing
// the candidates.
func ResolveDaemon(workers []operatorapi.Worker, arg string) (operatorapi.Worker, error) {
	if arg == "" {
		return operatorapi.Worker{}, fmt.Errorf("empty daemon argument")
	}
	for _, w := range workers {
		if w.ID == arg {
			return w, nil
		}
	}
	var exact, prefix []operatorapi.Worker
	for _, w := range workers {
		switch {
		case w.Label == arg:
			exact = append(exact, w)
		case strings.HasPrefix(w.Label, arg):
			prefix = append(prefix, w)
		}
	}
	if len(exact) == 1 {
		return exact[0], nil
	}
	if len(exact) > 1 {
		var live []operatorapi.Worker
		for _, w := range exact {
			if isLive(w) {
				live = append(live, w)
			}
		}
		if len(live) == 1 {
			return live[0], nil
		}
		return operatorapi.Worker{}, &AmbiguousError{Arg: arg, Candidates: sortedWorkers(exact)}
	}
	switch len(prefix) {
	case 0:
		return operatorapi.Worker{}, &NoMatchError{Arg: arg}
	case 1:
		return prefix[0], nil
	default:
		return operatorapi.Worker{}, &AmbiguousError{Arg: arg, Candidates: sortedWorkers(prefix)}
	}
}

func isLive(w operatorapi.Worker) bool {
	return w.State != operatorapi.StateGone && w.State != operatorapi.StateStale
}

// sortedWorkers orders a copy by label, then id, so every listing and
// every JSON document is stable.
func sortedWorkers(ws []operatorapi.Worker) []operatorapi.Worker {
	out := append(make([]operatorapi.Worker, 0, len(ws)), ws...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Label != out[j].Label {
			return out[i].Label < out[j].Label
		}
		return out[i].ID < out[j].ID
	})
	return out
}
