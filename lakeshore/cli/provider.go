package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/providers/providerspec"
)

func (a *app) providerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "provider",
		Aliases: []string{"providers"},
		Short:   "Register the providers 'lakeshore daemon launch' starts machines through",
		Long: `A provider is how the control plane starts a machine for a daemon:

  ec2     an EC2 (or EC2-compatible) API, with the AWS credentials of the
          'lakeshore serve' process (environment, shared config and
          credentials files, --profile, instance role); none is stored here
  podman  a container on the control plane's own host (host network), from
          an image you name; a fleet of test daemons on one box
  script  your executable, for every other cloud (see 'provider add script
          --help' for what it is asked and must answer)

'lakeshore daemon launch --provider NAME' then launches daemons through it;
'lakeshore daemon launch-log' reads their console, and 'lakeshore daemon kill'
terminates their machines.`,
		Example: `  lakeshore provider add ec2 aws-prod --region us-east-1 --image-id ami-0abc --instance-type g5.2xlarge
  lakeshore provider add podman local --image localhost/nymph-host
  lakeshore provider add script gcp --command ./gcloud-launcher
  lakeshore provider list`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRun,
	}
	add := &cobra.Command{
		Use:   "add KIND NAME [flags]",
		Short: "Register a provider (kinds: ec2, podman, script)",
		Long: `Register a provider. Before storing it the control plane checks that it
works as configured (credentials accepted, image present); --no-check skips
that. Each kind has its own subcommand and flags.`,
		Example: `  lakeshore provider add ec2 aws-prod --region us-east-1 --image-id ami-0abc
  lakeshore provider add podman local --image localhost/nymph-host`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRun,
	}
	add.AddCommand(a.providerAddEC2Cmd(), a.providerAddPodmanCmd(), a.providerAddScriptCmd())
	cmd.AddCommand(add, a.providerListCmd(), a.providerShowCmd(), a.providerRemoveCmd())
	return cmd
}

// providerAdd registers name with kind's settings and prints the result.
func (a *app) providerAdd(kind providerspec.Kind, cfg any, noCheck, jsonOut *bool) func(*cobra.Command, []string) error {
	return a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
		raw, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		if !*jsonOut {
			what := "checking it first"
			if *noCheck {
				what = "without checking it"
			}
			fmt.Fprintf(a.env.Stderr, "lakeshore: registering %s provider %s (%s)...\n", kind, args[0], what)
		}
		p, err := c.CreateProvider(ctx, operatorapi.ProviderRequest{Name: args[0], Kind: string(kind), Config: raw, NoCheck: *noCheck})
		if err != nil {
			return err
		}
		if *jsonOut {
			return writeJSON(a.env.Stdout, p)
		}
		_, err = fmt.Fprintf(a.env.Stdout, "registered %s provider %s; launch with: lakeshore daemon launch --provider %s\n", p.Kind, p.Name, p.Name)
		return err
	})
}

func (a *app) providerAddEC2Cmd() *cobra.Command {
	var (
		spec             providerspec.EC2Spec
		noCheck, jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "ec2 NAME --region R --image-id AMI [flags]",
		Short: "Register an EC2 provider",
		Long: `Register an EC2 provider. The control plane calls the EC2 API with the AWS
credentials of its own 'lakeshore serve' process: the standard chain
(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, the shared config and credentials
files, the instance role). --profile names a profile of the shared files.
No secret is stored, and none is ever shown.

--endpoint points it at any EC2-compatible API. Throttled calls
(RequestLimitExceeded) are retried with backoff. A launch's --capacity
object overrides instance_type, image_id, subnet_id, security_group_ids,
key_name, iam_instance_profile, availability_zone, spot and tags.

--json prints the provider as stored.`,
		Example: `  lakeshore provider add ec2 aws-prod --region us-east-1 --image-id ami-0abc \
    --instance-type g5.2xlarge --subnet-id subnet-1 --security-group-id sg-1
  lakeshore provider add ec2 moto --region us-east-1 --endpoint http://127.0.0.1:5000 --image-id ami-12c6146b`,
		Args: exactArgs(1, "one NAME"),
	}
	fs := cmd.Flags()
	fs.StringVar(&spec.Region, "region", "", "AWS region (required)")
	fs.StringVar(&spec.Endpoint, "endpoint", "", "EC2 API endpoint URL (default: the region's)")
	fs.StringVar(&spec.Profile, "profile", "", "shared config profile of the serve process's credentials")
	fs.StringVar(&spec.ImageID, "image-id", "", "AMI the machines boot (required)")
	fs.StringVar(&spec.InstanceType, "instance-type", "", "instance type a launch gets unless its --capacity names one (none: "+providerspec.DefaultEC2InstanceType+")")
	fs.StringVar(&spec.SubnetID, "subnet-id", "", "subnet to launch into")
	fs.StringArrayVar(&spec.SecurityGroupIDs, "security-group-id", nil, "security group (repeatable)")
	fs.StringVar(&spec.KeyName, "key-name", "", "EC2 key pair name")
	fs.StringVar(&spec.IAMInstanceProfile, "iam-instance-profile", "", "IAM instance profile name or ARN")
	fs.BoolVar(&noCheck, "no-check", false, "register without checking credentials and image")
	fs.BoolVar(&jsonOut, "json", false, "print JSON")
	cmd.RunE = a.providerAdd(providerspec.KindEC2, &spec, &noCheck, &jsonOut)
	return cmd
}

func (a *app) providerAddPodmanCmd() *cobra.Command {
	var (
		spec             providerspec.PodmanSpec
		noCheck, jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "podman NAME --image IMAGE [flags]",
		Short: "Register a provider that boots daemons as containers on this host",
		Long: `Register a podman provider: each launched daemon is a container of IMAGE on
the control plane's host (host network), running the rendered bootstrap as
root with bash; the image needs bash and a downloader (curl or wget).
'daemon kill' removes the container; 'daemon launch-log' is its output.

--cli names the podman executable, with any global flags it needs
(e.g. --cli "podman --runtime runc --cgroup-manager cgroupfs"); --run-arg
adds an argument to 'podman run' (repeatable).

--json prints the provider as stored.`,
		Example: `  lakeshore provider add podman local --image localhost/nymph-host
  lakeshore provider add podman local --image localhost/nymph-host \
    --cli "podman --runtime runc" --run-arg --ulimit --run-arg nofile=1024:1024`,
		Args: exactArgs(1, "one NAME"),
	}
	fs := cmd.Flags()
	fs.StringVar(&spec.Image, "image", "", "image every daemon's container runs (required)")
	fs.StringVar(&spec.CLI, "cli", "", "podman command, with global flags (default podman)")
	fs.StringArrayVar(&spec.RunArgs, "run-arg", nil, "argument added to podman run (repeatable)")
	fs.BoolVar(&noCheck, "no-check", false, "register without checking that the image exists")
	fs.BoolVar(&jsonOut, "json", false, "print JSON")
	cmd.RunE = a.providerAdd(providerspec.KindPodman, &spec, &noCheck, &jsonOut)
	return cmd
}

func (a *app) providerAddScriptCmd() *cobra.Command {
	var (
		spec             providerspec.ScriptSpec
		noCheck, jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "script NAME --command PATH",
		Short: "Register a provider that is your own executable",
		Long: `Register a script provider: the control plane runs PATH (on its own host) as

  PATH launch | PATH terminate | PATH console-log

with a JSON request on standard input, and reads a JSON answer on standard
output.

` + providerspec.ScriptProtocol + `

--json prints the provider as stored.`,
		Example: `  lakeshore provider add script gcp --command /opt/launchers/gcloud-launcher`,
		Args:    exactArgs(1, "one NAME"),
	}
	fs := cmd.Flags()
	fs.StringVar(&spec.Command, "command", "", "the launcher executable (required; a relative path is made absolute)")
	fs.BoolVar(&noCheck, "no-check", false, "register without checking that the command exists")
	fs.BoolVar(&jsonOut, "json", false, "print JSON")
	run := a.providerAdd(providerspec.KindScript, &spec, &noCheck, &jsonOut)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		// The control plane runs it from its own directory.
		if spec.Command != "" && !filepath.IsAbs(spec.Command) && strings.ContainsRune(spec.Command, filepath.Separator) {
			abs, err := filepath.Abs(spec.Command)
			if err != nil {
				return usagef("--command %q: %v", spec.Command, err)
			}
			spec.Command = abs
		}
		return run(cmd, args)
	}
	return cmd
}

func (a *app) providerListCmd() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the registered providers",
		Long: `List the registered providers: name, kind, what they launch, and how many
daemons they launched still have a row.

--json prints {"providers": [{name, kind, config, createdAt, workers}]}.`,
		Example: `  lakeshore provider list
  lakeshore provider list --json | jq -r '.providers[].name'`,
		Args: noArgs,
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, _ []string) error {
			ps, err := c.ListProviders(ctx)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, operatorapi.ProviderList{Providers: ps})
			}
			if len(ps) == 0 {
				_, err := fmt.Fprintln(a.env.Stdout, "no providers registered (lakeshore provider add --help)")
				return err
			}
			tw := newTable(a.env.Stdout)
			fmt.Fprintln(tw, "NAME\tKIND\tLAUNCHES\tDAEMONS\tREGISTERED")
			now := a.env.Now()
			for _, p := range ps {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", p.Name, p.Kind, providerSummary(p), p.Workers, ago(now, p.CreatedAt))
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

// providerSummary says in a few words what p launches.
func providerSummary(p operatorapi.Provider) string {
	var cfg map[string]any
	_ = json.Unmarshal(p.Config, &cfg)
	get := func(k string) string { s, _ := cfg[k].(string); return s }
	switch p.Kind {
	case string(providerspec.KindEC2):
		s := get("image_id") + " in " + get("region")
		if t := get("instance_type"); t != "" {
			s = t + " " + s
		}
		return s
	case string(providerspec.KindPodman):
		return get("image")
	case string(providerspec.KindScript):
		return get("command")
	}
	return "-"
}

func (a *app) providerShowCmd() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "show NAME",
		Short: "Show one provider's settings",
		Long: `Show one provider: its kind, every setting, and how many daemons it
launched still have a row. No secret is ever shown (none is stored).

--json prints {name, kind, config, createdAt, workers}.`,
		Example: `  lakeshore provider show aws-prod
  lakeshore provider show aws-prod --json | jq .config`,
		Args: exactArgs(1, "one NAME"),
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			p, err := c.GetProvider(ctx, args[0])
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, p)
			}
			tw := newTable(a.env.Stdout)
			fmt.Fprintf(tw, "name:\t%s\nkind:\t%s\nregistered:\t%s\ndaemons:\t%d\n", p.Name, p.Kind, stamp(a.env.Now(), p.CreatedAt), p.Workers)
			var cfg map[string]any
			_ = json.Unmarshal(p.Config, &cfg)
			for _, k := range slices.Sorted(maps.Keys(cfg)) {
				v := cfg[k]
				if list, ok := v.([]any); ok {
					parts := make([]string, 0, len(list))
					for _, x := range list {
						parts = append(parts, fmt.Sprint(x))
					}
					v = strings.Join(parts, ", ")
				}
				fmt.Fprintf(tw, "%s:\t%v\n", k, v)
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

func (a *app) providerRemoveCmd() *cobra.Command {
	var jsonOut, force bool
	cmd := &cobra.Command{
		Use:     "remove NAME",
		Aliases: []string{"rm"},
		Short:   "Remove a provider",
		Long: `Remove a provider. One whose launched daemons still have rows is refused:
'lakeshore daemon kill' them first (that terminates their machines), or
--force removes it anyway and leaves their machines to you.

--json prints the provider removed.`,
		Example: `  lakeshore provider remove aws-prod
  lakeshore provider remove aws-prod --force`,
		Args: exactArgs(1, "one NAME"),
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			p, err := c.DeleteProvider(ctx, args[0], force)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, p)
			}
			_, err = fmt.Fprintf(a.env.Stdout, "removed %s provider %s\n", p.Kind, p.Name)
			return err
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	cmd.Flags().BoolVar(&force, "force", false, "remove it even though daemons it launched still have rows")
	return cmd
}
