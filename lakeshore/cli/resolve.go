package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"nymph/lakeshore/opclient"
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
	shared := true
	for _, w := range e.Candidates {
		fmt.Fprintf(&b, "\n  %s  %s  %s", w.ID, w.Label, w.State)
		shared = shared && w.Label == e.Arg
	}
	// When the full label is what several daemons share, only an id tells
	// them apart: say so, with one to copy.
	if shared && len(e.Candidates) > 0 {
		fmt.Fprintf(&b, "\nthey share the label %q and more than one is live, or none is: name one by its id with --id, e.g. --id %s",
			e.Arg, e.Candidates[0].ID)
		return b.String()
	}
	b.WriteString("\nname one by its full label or its id (--id takes an id only)")
	return b.String()
}

// workerByID fetches the worker whose id is arg. The control plane also
// answers a worker route for a label that names one worker; --id means an
// id, so a worker found under another id is refused here, naming the way to
// address it by label.
func workerByID(ctx context.Context, c *opclient.Client, arg string) (operatorapi.Worker, error) {
	if arg == "" {
		return operatorapi.Worker{}, usagef("empty daemon id")
	}
	w, err := c.GetWorker(ctx, arg)
	switch {
	case opclient.IsNotFound(err):
		return operatorapi.Worker{}, fmt.Errorf("no daemon has the id %q (--id takes a worker id as `lakeshore daemon list` shows it; without --id a label or label prefix works too): %w", arg, err)
	case err != nil:
		return operatorapi.Worker{}, err
	case w.ID != arg:
		return operatorapi.Worker{}, usagef("--id %s: %q is not a worker id but the label of daemon %s; drop --id to name a daemon by its label (the positional <daemon> takes an id, a label or a label prefix), or pass --id %s",
			arg, arg, w.ID, w.ID)
	}
	return w, nil
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
