// Package providerspec owns what a provider is, as an operator registers
// it and the control plane stores it: its kind and each kind's settings,
// and whether those are valid (every problem named by the `provider add`
// flag that sets it). It links no provider's SDK, so the operator CLI can
// bind the settings to its flags and still start small; the launchers are
// in package providers.
package providerspec

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
)

// Kind names a provider implementation.
type Kind string

// The provider kinds.
const (
	KindEC2    Kind = "ec2"
	KindPodman Kind = "podman"
	KindScript Kind = "script"
)

// Spec is one registered provider, as the control plane stores it (JSON)
// and `lakeshore provider show` prints it. It holds no credential: ec2
// reads the serve process's AWS credential chain (Profile names a shared
// config profile, not a secret).
type Spec struct {
	Name   string      `json:"name"`
	Kind   Kind        `json:"kind"`
	EC2    *EC2Spec    `json:"ec2,omitempty"`
	Podman *PodmanSpec `json:"podman,omitempty"`
	Script *ScriptSpec `json:"script,omitempty"`
}

// EC2Spec is an ec2 provider's defaults; a launch's capacity object may
// override InstanceType and friends (see the ec2 launcher).
type EC2Spec struct {
	Region             string   `json:"region"`
	Endpoint           string   `json:"endpoint,omitempty"`
	Profile            string   `json:"profile,omitempty"`
	ImageID            string   `json:"image_id"`
	InstanceType       string   `json:"instance_type,omitempty"`
	SubnetID           string   `json:"subnet_id,omitempty"`
	SecurityGroupIDs   []string `json:"security_group_ids,omitempty"`
	KeyName            string   `json:"key_name,omitempty"`
	IAMInstanceProfile string   `json:"iam_instance_profile,omitempty"`
}

// PodmanSpec is a podman provider: every daemon is a container of Image on
// this host (host network), run by CLI (default "podman") with RunArgs
// added to `run`.
type PodmanSpec struct {
	Image   string   `json:"image"`
	CLI     string   `json:"cli,omitempty"`
	RunArgs []string `json:"run_args,omitempty"`
}

// ScriptSpec is a script provider: Command is run as
// `Command launch|terminate|console-log`.
type ScriptSpec struct {
	Command string `json:"command"`
}

// DefaultEC2InstanceType is the instance type of a launch when neither the
// provider (--instance-type) nor the launch's capacity names one: small
// and offered in every region.
const DefaultEC2InstanceType = "t3.micro"

// Shapes of the ids EC2 uses. They are checked so that a typo is an error
// naming the flag at `provider add`, not an API error at the first launch.
// The patterns compile on first use: counted repetitions ({1,512}) make
// programs of hundreds of kilobytes, and every run of the lakeshore
// binary (a one-shot CLI verb too) would otherwise pay for them at start.
var (
	ec2RegionRE          = lazyRE(`^[A-Za-z0-9][A-Za-z0-9-]{0,63}$`)
	ec2ImageIDRE         = lazyRE(`^ami-[0-9a-f]{8,17}$`)
	ec2InstanceTypeRE    = lazyRE(`^[a-z0-9][a-z0-9-]*\.[a-z0-9][a-z0-9-]*$`)
	ec2SubnetIDRE        = lazyRE(`^subnet-[0-9a-f]{8,17}$`)
	ec2SecurityGroupIDRE = lazyRE(`^sg-[0-9a-f]{8,17}$`)
	// An instance profile is named by its name or its ARN (IAM's name
	// alphabet; an ARN carries a path).
	ec2ProfileNameRE = lazyRE(`^[\w+=,.@-]{1,128}$`)
	ec2ProfileARNRE  = lazyRE(`^arn:[a-z-]+:iam::[0-9]{12}:instance-profile/[\w+=,.@/-]{1,512}$`)
)

// Validate checks that s names a kind and carries that kind's settings,
// valid; the error names the flag to fix.
func (s Spec) Validate() error {
	switch s.Kind {
	case KindEC2:
		if s.EC2 == nil {
			return errors.New("ec2 provider without ec2 settings")
		}
		return s.EC2.Validate()
	case KindPodman:
		if s.Podman == nil {
			return errors.New("podman provider without podman settings")
		}
		return s.Podman.Validate()
	case KindScript:
		if s.Script == nil {
			return errors.New("script provider without script settings")
		}
		return s.Script.Validate()
	}
	return fmt.Errorf("unknown provider kind %q: use ec2, podman or script", s.Kind)
}

// Validate checks an ec2 provider's description; each problem is named by
// the `provider add ec2` flag that sets it.
func (s EC2Spec) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch {
	case s.Region == "":
		bad("--region: required (e.g. us-east-1)")
	case !ec2RegionRE().MatchString(s.Region):
		bad("--region: %q is not a region name (e.g. us-east-1)", s.Region)
	}
	if s.Endpoint != "" {
		if err := checkEC2Endpoint(s.Endpoint); err != nil {
			bad("--endpoint: %v", err)
		}
	}
	if s.Profile != "" && (strings.TrimSpace(s.Profile) != s.Profile || strings.ContainsAny(s.Profile, "[]\r\n\t") || len(s.Profile) > 128) {
		bad("--profile: %q is not a profile name of the shared AWS config", s.Profile)
	}
	if s.ImageID == "" {
		bad("--image-id: required (an AMI id of the region, ami-...)")
	} else if err := CheckEC2ImageID(s.ImageID); err != nil {
		bad("--image-id: %v", err)
	}
	if s.InstanceType != "" {
		if err := CheckEC2InstanceType(s.InstanceType); err != nil {
			bad("--instance-type: %v", err)
		}
	}
	if s.SubnetID != "" {
		if err := CheckEC2SubnetID(s.SubnetID); err != nil {
			bad("--subnet-id: %v", err)
		}
	}
	for _, g := range s.SecurityGroupIDs {
		if err := CheckEC2SecurityGroupID(g); err != nil {
			bad("--security-group-id: %v", err)
		}
	}
	if s.KeyName != "" {
		if err := CheckEC2KeyName(s.KeyName); err != nil {
			bad("--key-name: %v", err)
		}
	}
	if s.IAMInstanceProfile != "" {
		if err := CheckEC2InstanceProfile(s.IAMInstanceProfile); err != nil {
			bad("--iam-instance-profile: %v", err)
		}
	}
	return errors.Join(errs...)
}

func checkEC2Endpoint(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL of an EC2-compatible API (e.g. http://127.0.0.1:5000)", s)
	}
	return nil
}

// CheckEC2ImageID checks one ec2 setting, for the provider's flags and a
// launch's capacity alike.
func CheckEC2ImageID(s string) error {
	if !ec2ImageIDRE().MatchString(s) {
		return fmt.Errorf("%q is not an AMI id (ami- and 8 or 17 hex digits)", s)
	}
	return nil
}

// CheckEC2InstanceType checks one ec2 setting, for the provider's flags and a
// launch's capacity alike.
func CheckEC2InstanceType(s string) error {
	if !ec2InstanceTypeRE().MatchString(s) {
		return fmt.Errorf("%q is not an instance type (e.g. t3.micro)", s)
	}
	return nil
}

// CheckEC2SubnetID checks one ec2 setting, for the provider's flags and a
// launch's capacity alike.
func CheckEC2SubnetID(s string) error {
	if !ec2SubnetIDRE().MatchString(s) {
		return fmt.Errorf("%q is not a subnet id (subnet-...)", s)
	}
	return nil
}

// CheckEC2SecurityGroupID checks one ec2 setting, for the provider's flags and a
// launch's capacity alike.
func CheckEC2SecurityGroupID(s string) error {
	if !ec2SecurityGroupIDRE().MatchString(s) {
		return fmt.Errorf("%q is not a security group id (sg-...; a group's name will not do)", s)
	}
	return nil
}

// CheckEC2KeyName checks one ec2 setting, for the provider's flags and a
// launch's capacity alike.
func CheckEC2KeyName(s string) error {
	if len(s) > 255 || strings.TrimSpace(s) != s {
		return fmt.Errorf("%q is not a key pair name", s)
	}
	for _, r := range s {
		if r < 0x20 || r > 0x7e {
			return fmt.Errorf("%q is not a key pair name (printable ASCII only)", s)
		}
	}
	return nil
}

// CheckEC2InstanceProfile checks one ec2 setting, for the provider's flags and a
// launch's capacity alike.
func CheckEC2InstanceProfile(s string) error {
	if !ec2ProfileNameRE().MatchString(s) && !ec2ProfileARNRE().MatchString(s) {
		return fmt.Errorf("%q is neither an instance profile name nor its ARN", s)
	}
	return nil
}

// Validate checks a podman provider's description; each error names the
// `provider add podman` flag at fault.
func (s PodmanSpec) Validate() error {
	switch {
	case strings.TrimSpace(s.Image) == "":
		return errors.New("--image is required: the image every daemon's container runs")
	case strings.HasPrefix(s.Image, "-") || strings.ContainsAny(s.Image, " \t\n"):
		return fmt.Errorf("--image %q is not an image name", s.Image)
	case s.CLI != "" && len(strings.Fields(s.CLI)) == 0:
		return errors.New("--cli is blank: give the podman command (default podman)")
	}
	for _, a := range s.RunArgs {
		if strings.TrimSpace(a) == "" {
			return errors.New("--run-arg must not be empty")
		}
	}
	return nil
}

// Validate checks a script provider's description; errors name the
// `provider add script` flag.
func (s ScriptSpec) Validate() error {
	c := strings.TrimSpace(s.Command)
	switch {
	case c == "":
		return errors.New("--command is required: the executable the control plane runs as COMMAND launch|terminate|console-log")
	case c != s.Command:
		return fmt.Errorf("--command %q has surrounding spaces", s.Command)
	case strings.Contains(c, "/") && !strings.HasPrefix(c, "/"):
		return fmt.Errorf("--command %s must be an absolute path, or a name on the PATH of lakeshore serve: the control plane runs it, from its own directory", c)
	}
	return nil
}

// ScriptProtocol is the contract between the control plane and a script
// provider's command, as `lakeshore provider add script --help` prints it.
const ScriptProtocol = `The control plane runs COMMAND (as the user running lakeshore serve, with
its environment) with one argument, the operation, writes one JSON request
to its stdin and reads one JSON object from its stdout:

  COMMAND launch
    stdin:  {"version":1, "worker_id":"...", "name":"...",
             "bootstrap":"#!/bin/bash ...", "capacity":{...} or null}
    stdout: {"instance_id":"..."}
  COMMAND terminate
    stdin:  {"version":1, "instance_id":"..."}
    stdout: {}                        (an instance already gone is success)
  COMMAND console-log
    stdin:  {"version":1, "instance_id":"...", "latest":true}
    stdout: {"output":"..."}          or {"gone":true} for an unknown instance

launch starts one machine that runs "bootstrap" as root on its first boot
(user data, a startup script); the script carries the daemon's token, so
keep it off command lines and out of logs. "worker_id" is the daemon's id:
tag the machine with it. "name" is the daemon's name, "capacity" the
--capacity object of daemon launch, verbatim. "instance_id" is your name for
the machine; terminate and console-log get it back. "latest":false asks for
the whole console rather than its most recent part. Unknown request fields
are to be ignored; answer fields other than these are ignored.

Exit 0 with the answer on stdout. Exit 75 means throttled: the call is made
again after a backoff (1 s, doubling up to 30 s, with jitter) until the
launch is given up. Any other exit status is a failure, reported with the
last 4 KiB of stderr. A launch may run 5 minutes and the other calls 1
minute; then the command's process group gets SIGTERM, and SIGKILL 5 s
later. Launches of one daemon launch run concurrently (--concurrency).
`

// lazyRE compiles expr once, the first time the returned func is called.
func lazyRE(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
