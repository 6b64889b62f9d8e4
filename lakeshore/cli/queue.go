package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

func (a *app) queueCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "queue",
		Aliases: []string{"queues"},
		Short:   "Create and list the queues of the namespace",
		Long: `A queue exists once it is created here or a daemon joins it (a lane in its
config, or the queue it polls). 'lakeshore exec --queue Q' and 'lakeshore run
--queue Q' run on a member: a daemon is one by a lane, by the queue it polls
(the default queue when it names none), or by
'lakeshore daemon update <daemon> --add-queue Q', whatever it polls;
--remove-queue takes it off a queue, the one it polls included.`,
		Example: `  lakeshore queue create training
  lakeshore queue list`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRun,
	}
	cmd.AddCommand(a.queueCreateCmd(), a.queueListCmd())
	return cmd
}

func (a *app) queueCreateCmd() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a queue daemons can be added to",
		Long: `Create a queue: 1-128 letters, digits, '.', '_', ':' or '-', starting with a
letter or digit. Creating a queue that exists is not an error.

--json prints {queue: {name, createdAt, members}, created}.`,
		Example: `  lakeshore queue create training
  lakeshore daemon update gpu-rig --add-queue training`,
		Args: exactArgs(1, "one NAME"),
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			qc, err := c.CreateQueue(ctx, args[0])
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, qc)
			}
			verb := "created"
			if !qc.Created {
				verb = "already exists:"
			}
			_, err = fmt.Fprintf(a.env.Stdout, "%s queue %s in namespace %q\n", verb, qc.Queue.Name, c.Namespace())
			return err
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

func (a *app) queueListCmd() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the namespace's queues and their members",
		Long: `List every queue: those created with 'lakeshore queue create' and those
daemons joined. ORIGIN says which; MEMBERS counts the daemons that take its
work.

--json prints {"queues": [{name, createdAt, members: [worker ids]}]}.`,
		Example: `  lakeshore queue list
  lakeshore queue list --json | jq -r '.queues[].name'`,
		Args: noArgs,
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, _ []string) error {
			qs, err := c.ListQueues(ctx)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, operatorapi.QueueList{Queues: qs})
			}
			if len(qs) == 0 {
				_, err := fmt.Fprintf(a.env.Stdout, "no queues in namespace %q\n", c.Namespace())
				return err
			}
			now := a.env.Now()
			tw := newTable(a.env.Stdout)
			fmt.Fprintln(tw, "NAME\tORIGIN\tMEMBERS")
			for _, q := range qs {
				origin := "joined by a daemon"
				if q.CreatedAt != nil {
					origin = "created " + ago(now, *q.CreatedAt)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\n", q.Name, origin, len(q.Members))
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}
