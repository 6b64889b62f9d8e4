package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// showOutputCap is how much of a run's output `invocations show` prints.
const showOutputCap = operatorapi.DefaultLogBytes

func (a *app) invocationsLogsCmd() *cobra.Command {
	var follow, jsonOut bool
	cmd := &cobra.Command{
		Use:   "logs <id>",
		Short: "Print the output of an invocation; --follow while it runs",
		Long: `Print what an invocation's function wrote, as its daemon streamed it: its
stdout to stdout and its stderr to stderr, in the order they were written.

--follow keeps printing as the output arrives and returns once the invocation
is over (succeeded, failed, killed or cancelled); a failure is then reported
on stderr. Without it, the output there is so far is printed and the command
returns.

--json prints one JSON object per piece of output instead, each on a line:
{"seq", "stream", "ts", "text", "dropped"} (text is the bytes as UTF-8,
dropped counts the bytes the daemon had to drop before this piece because it
could not post them in time: the control plane was out of reach for long, or
the function wrote faster than it could be carried).`,
		Example: `  lakeshore invocations logs 01J9Z8Q4T3N5V6W7X8Y9Z0A1B2
  lakeshore invocations logs 01J9Z8Q4T3N5V6W7X8Y9Z0A1B2 --follow
  lakeshore invocations logs 01J9Z8Q4T3N5V6W7X8Y9Z0A1B2 --json | jq -r 'select(.stream == "stderr") | .text'
  id=$(lakeshore run --no-wait --script ./train.sh) && lakeshore invocations logs "$id" -f`,
		Args: exactArgs(1, "one <id>"),
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			id := args[0]
			p := a.logPrinter(jsonOut)
			if !follow {
				after := int64(0)
				for {
					page, err := c.InvocationLogs(ctx, id, after, operatorapi.MaxLogBytes, 0)
					if opclient.IsNotFound(err) {
						return fmt.Errorf("no invocation %q in namespace %q: %w", id, c.Namespace(), err)
					}
					if err != nil {
						return err
					}
					if err := p.page(page); err != nil {
						return err
					}
					if !page.More {
						return nil
					}
					after = page.Next
				}
			}
			var perr error
			_, err := c.FollowInvocationLogs(ctx, id, 0, func(page operatorapi.InvocationLogs, err error) {
				if err != nil {
					fmt.Fprintf(a.env.Stderr, "lakeshore: %v (retrying)\n", err)
					return
				}
				if perr == nil {
					perr = p.page(page)
				}
			})
			if opclient.IsNotFound(err) {
				return fmt.Errorf("no invocation %q in namespace %q: %w", id, c.Namespace(), err)
			}
			if err != nil {
				return err
			}
			if perr != nil {
				return perr
			}
			inv, err := c.GetInvocation(ctx, id, 0)
			if err != nil {
				return err
			}
			if inv.State != operatorapi.InvocationSucceeded {
				a.printFailure(inv)
			}
			return nil
		}),
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing until the invocation is over")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print one JSON object per piece of output")
	return cmd
}

// logPrinter prints pieces of output as they come: raw to the stream they
// came from, or as JSON lines on stdout.
type logPrinter struct {
	stdout, stderr io.Writer
	jsonOut        bool
	// onFirst, when set, runs before the first piece is printed (to take a
	// progress line off the terminal).
	onFirst func()
	printed bool
}

func (a *app) logPrinter(jsonOut bool) *logPrinter {
	return &logPrinter{stdout: a.env.Stdout, stderr: a.env.Stderr, jsonOut: jsonOut}
}

// logLine is the --json form of one piece of output.
type logLine struct {
	Seq     int64     `json:"seq"`
	Stream  string    `json:"stream"`
	TS      time.Time `json:"ts"`
	Text    string    `json:"text"`
	Dropped uint64    `json:"dropped,omitempty"`
}

func (p *logPrinter) page(page operatorapi.InvocationLogs) error {
	for _, ev := range page.Events {
		if !p.printed && p.onFirst != nil {
			p.onFirst()
		}
		p.printed = true
		if p.jsonOut {
			if err := writeJSONLine(p.stdout, logLine{Seq: ev.Seq, Stream: ev.Stream, TS: ev.TS,
				Text: strings.ToValidUTF8(string(ev.Data), "\uFFFD"), Dropped: ev.Dropped}); err != nil {
				return err
			}
			continue
		}
		if ev.Dropped > 0 {
			fmt.Fprintf(p.stderr, "lakeshore: [%d bytes of output lost here: the daemon could not post them in time]\n", ev.Dropped)
		}
		w := p.stdout
		if ev.Stream == messages.StreamStderr {
			w = p.stderr
		}
		if _, err := w.Write(ev.Data); err != nil {
			return err
		}
	}
	return nil
}

// followRun waits for a run to end while its output is printed live
// (unless quiet), and returns the finished invocation. onState sees each
// state the run passes through (and each read that failed, to be retried).
func (a *app) followRun(ctx context.Context, c *opclient.Client, id string, quiet bool, onFirst func(),
	onState func(operatorapi.Invocation, error)) (operatorapi.Invocation, error) {
	p := a.logPrinter(false)
	p.onFirst = onFirst
	state := ""
	var perr error
	_, err := c.FollowInvocationLogs(ctx, id, 0, func(page operatorapi.InvocationLogs, err error) {
		if err != nil {
			onState(operatorapi.Invocation{}, err)
			return
		}
		if !quiet && perr == nil {
			perr = p.page(page)
		}
		if page.State != state && !operatorapi.InvocationTerminal(page.State) {
			// A new state: the invocation says where it runs.
			state = page.State
			if inv, err := c.GetInvocation(ctx, id, 0); err == nil {
				onState(inv, nil)
			}
		}
	})
	if err != nil {
		return operatorapi.Invocation{}, err
	}
	if perr != nil {
		return operatorapi.Invocation{}, perr
	}
	// Over: one read for the result (retried like the follow).
	return c.WaitInvocation(ctx, id, nil)
}

// printOutput prints the run output page of `invocations show`, or the
// last stdout tail when the daemon streamed none.
func printOutput(out io.Writer, inv operatorapi.Invocation, page *operatorapi.InvocationLogs) {
	if page == nil || len(page.Events) == 0 {
		if inv.StdoutTail != "" {
			fmt.Fprintf(out, "output (tail):\n%s\n", indent(strings.TrimRight(inv.StdoutTail, "\n"), "  "))
		}
		return
	}
	var b strings.Builder
	capped := page.More
	for _, ev := range page.Events {
		if ev.Dropped > 0 {
			fmt.Fprintf(&b, "[%d bytes of output lost here: the daemon could not post them in time]\n", ev.Dropped)
		}
		// A page holds one piece at least, and a piece may be larger than
		// the cap.
		if room := showOutputCap - b.Len(); len(ev.Data) > room {
			b.Write(ev.Data[:max(room, 0)])
			capped = true
			break
		}
		b.Write(ev.Data)
	}
	fmt.Fprintf(out, "output:\n%s\n", indent(strings.ToValidUTF8(strings.TrimRight(b.String(), "\n"), "\uFFFD"), "  "))
	if capped {
		fmt.Fprintf(out, "… output capped at %d KiB; see `lakeshore invocations logs %s`\n", showOutputCap>>10, inv.ID)
	}
}
