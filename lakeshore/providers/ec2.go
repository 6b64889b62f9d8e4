package providers

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/rs/zerolog"

	"nymph/lakeshore/providers/providerspec"
)

// DefaultEC2InstanceType is the instance type of a launch when neither the
// provider nor the launch's capacity names one.
const DefaultEC2InstanceType = providerspec.DefaultEC2InstanceType

// EC2 tag keys the launcher sets on every instance, so an operator (or a
// later cleanup) can match an instance in the console to its Worker row.
const (
	EC2TagName     = "Name"
	EC2TagWorkerID = "lakeshore:worker-id"
)

// ec2MaxAttempts is how many times the SDK's retryer tries one API call
// before giving up: the SDK's default of 3 gives up on a throttled burst
// (RequestLimitExceeded) within seconds, while a fleet launch of many
// daemons is exactly what gets throttled. Ten attempts with the retryer's
// exponential backoff (1 s base for a throttle, full jitter, capped at
// 20 s between attempts) ride out a minute or so of throttling; the
// caller's ctx bounds it all the same.
const ec2MaxAttempts = 10

// ec2CheckAttempts bounds Check's one call: an operator waiting on
// `provider add` wants to hear at once that the endpoint is unreachable,
// not after a minute of backoff.
const ec2CheckAttempts = 3

// ec2MaxUserData is EC2's limit on user data, in raw form before base64.
const ec2MaxUserData = 16 * 1024

// EC2 launches daemons as EC2 instances through the AWS SDK, with the
// credentials of the serve process's standard chain. It is safe for
// concurrent use.
type EC2 struct {
	name   string
	spec   EC2Spec
	client *ec2.Client
	creds  aws.CredentialsProvider
	log    zerolog.Logger
}

var _ Launcher = (*EC2)(nil)

// Shapes of the ids only a launch checks (the provider's settings are
// checked in providerspec). They compile on first use, as there.
var (
	ec2InstanceIDRE = lazyRE(`^i-[0-9a-f]{8,17}$`)
	ec2AZRE         = lazyRE(`^[a-z]{2}(-[a-z]+)+-[0-9]+[a-z]$`)
)

// NewEC2 returns the launcher of the ec2 provider name. It loads the AWS
// configuration of this process (environment, shared config and
// credentials files, spec.Profile, the instance role) without calling
// anything; Check proves it works. Nothing of it is stored: credentials
// are resolved, and refreshed, by the SDK as calls need them.
func NewEC2(ctx context.Context, name string, spec EC2Spec, log zerolog.Logger) (*EC2, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("ec2 provider %s: %w", name, err)
	}
	opts := []func(*config.LoadOptions) error{
		config.WithRegion(spec.Region),
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = ec2MaxAttempts
				// The standard retryer also spends a client-wide retry
				// quota, which a throttled fleet launch drains in a few
				// dozen retries and then fails every call at once; the
				// attempt cap and ctx bound the retries instead.
				o.RateLimiter = ratelimit.None
			})
		}),
	}
	if spec.Profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(spec.Profile))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		var noProfile config.SharedConfigProfileNotExistError
		if errors.As(err, &noProfile) {
			return nil, fmt.Errorf("ec2 provider %s: --profile: profile %q is not in the serve process's shared AWS config or credentials files (AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE; ~/.aws/config and ~/.aws/credentials by default): add it there or name another: %w", name, spec.Profile, err)
		}
		return nil, fmt.Errorf("ec2 provider %s: loading the AWS configuration of the serve process: %w", name, err)
	}
	client := ec2.NewFromConfig(cfg, func(o *ec2.Options) {
		if spec.Endpoint != "" {
			o.BaseEndpoint = aws.String(spec.Endpoint)
		}
	})
	return &EC2{
		name:   name,
		spec:   spec,
		client: client,
		creds:  cfg.Credentials,
		log:    log.With().Str("provider", name).Str("kind", string(KindEC2)).Logger(),
	}, nil
}

// Check resolves the credentials and describes the provider's image: a
// read-only call that proves the credentials are accepted, the endpoint
// and region answer, and the AMI exists there.
func (e *EC2) Check(ctx context.Context) error {
	if e.creds == nil {
		return e.noCredentials(errors.New("no credential source is configured"))
	}
	if _, err := e.creds.Retrieve(ctx); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("ec2 provider %s: resolving AWS credentials: %w", e.name, ctx.Err())
		}
		return e.noCredentials(err)
	}
	out, err := e.client.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{e.spec.ImageID}},
		func(o *ec2.Options) { o.RetryMaxAttempts = ec2CheckAttempts })
	if err != nil {
		return e.apiError("DescribeImages", e.spec.ImageID, err)
	}
	if len(out.Images) == 0 {
		return fmt.Errorf("ec2 provider %s: --image-id: image %s not found in region %s (an AMI id belongs to one region; copy the image or name the region's own)", e.name, e.spec.ImageID, e.spec.Region)
	}
	if st := out.Images[0].State; st != "" && st != types.ImageStateAvailable {
		return fmt.Errorf("ec2 provider %s: --image-id: image %s is %s, not available", e.name, e.spec.ImageID, st)
	}
	return nil
}

func (e *EC2) noCredentials(cause error) error {
	hint := "set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, in its environment, put keys in its shared credentials file (~/.aws/credentials), give the provider --profile, or run it on an instance with an IAM role"
	if e.spec.Profile != "" {
		hint = fmt.Sprintf("profile %q gives none: check its keys, SSO session (aws sso login) or role in the shared AWS config of the serve process", e.spec.Profile)
	}
	return fmt.Errorf("ec2 provider %s: no AWS credentials for the serve process: %s (%w)", e.name, hint, cause)
}

// ec2Launch is one RunInstances: the provider's defaults with the
// launch's capacity applied.
type ec2Launch struct {
	ImageID            string
	InstanceType       string
	SubnetID           string
	SecurityGroupIDs   []string
	KeyName            string
	IAMInstanceProfile string
	AvailabilityZone   string
	Spot               bool
	Tags               map[string]string
}

// ec2CapacityKeys are the keys a launch's --capacity object may hold for an
// ec2 provider, each overriding the provider's value of the same name
// (availability_zone, spot and tags have none):
//
//	instance_type        string    e.g. "g5.xlarge"
//	image_id             string    an AMI of the region
//	subnet_id            string
//	security_group_ids   [string]  replaces the provider's list
//	key_name             string
//	iam_instance_profile string    a name or an ARN
//	availability_zone    string    placement when no subnet decides it
//	spot                 bool      a one-time spot instance, terminated on interruption
//	tags                 {string: string}  more instance tags (not Name, lakeshore:*, aws:*)
var ec2CapacityKeys = []string{"instance_type", "image_id", "subnet_id", "security_group_ids", "key_name", "iam_instance_profile", "availability_zone", "spot", "tags"}

// EC2CapacityKeys returns the keys an ec2 launch's --capacity object may
// hold (for help texts).
func EC2CapacityKeys() []string { return append([]string(nil), ec2CapacityKeys...) }

// launchParams applies capacity (a JSON object or nil) to the provider's
// defaults. Every error names the capacity key at fault.
func (e *EC2) launchParams(capacity []byte) (ec2Launch, error) {
	p := ec2Launch{
		ImageID:            e.spec.ImageID,
		InstanceType:       e.spec.InstanceType,
		SubnetID:           e.spec.SubnetID,
		SecurityGroupIDs:   e.spec.SecurityGroupIDs,
		KeyName:            e.spec.KeyName,
		IAMInstanceProfile: e.spec.IAMInstanceProfile,
	}
	if p.InstanceType == "" {
		p.InstanceType = DefaultEC2InstanceType
	}
	if len(strings.TrimSpace(string(capacity))) == 0 || strings.TrimSpace(string(capacity)) == "null" {
		return p, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(capacity, &obj); err != nil {
		return p, fmt.Errorf("--capacity: not a JSON object: %w", err)
	}
	str := func(key string, raw json.RawMessage, check func(string) error) (string, error) {
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return "", fmt.Errorf("--capacity: %s: want a string, got %s", key, raw)
		}
		if err := check(v); err != nil {
			return "", fmt.Errorf("--capacity: %s: %w", key, err)
		}
		return v, nil
	}
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(obj)) {
		raw := obj[key]
		var err error
		switch key {
		case "instance_type":
			p.InstanceType, err = str(key, raw, providerspec.CheckEC2InstanceType)
		case "image_id":
			p.ImageID, err = str(key, raw, providerspec.CheckEC2ImageID)
		case "subnet_id":
			p.SubnetID, err = str(key, raw, providerspec.CheckEC2SubnetID)
		case "key_name":
			p.KeyName, err = str(key, raw, providerspec.CheckEC2KeyName)
		case "iam_instance_profile":
			p.IAMInstanceProfile, err = str(key, raw, providerspec.CheckEC2InstanceProfile)
		case "availability_zone":
			p.AvailabilityZone, err = str(key, raw, func(s string) error {
				if !ec2AZRE().MatchString(s) {
					return fmt.Errorf("%q is not an availability zone (e.g. us-east-1a)", s)
				}
				return nil
			})
		case "security_group_ids":
			var v []string
			if jerr := json.Unmarshal(raw, &v); jerr != nil {
				err = fmt.Errorf("--capacity: %s: want an array of strings, got %s", key, raw)
				break
			}
			for _, g := range v {
				if cerr := providerspec.CheckEC2SecurityGroupID(g); cerr != nil {
					err = fmt.Errorf("--capacity: %s: %w", key, cerr)
					break
				}
			}
			p.SecurityGroupIDs = v
		case "spot":
			if jerr := json.Unmarshal(raw, &p.Spot); jerr != nil {
				err = fmt.Errorf("--capacity: %s: want true or false, got %s", key, raw)
			}
		case "tags":
			if jerr := json.Unmarshal(raw, &p.Tags); jerr != nil {
				err = fmt.Errorf("--capacity: %s: want an object of string values, got %s", key, raw)
				break
			}
			for k, v := range p.Tags {
				if cerr := ec2CheckExtraTag(k, v); cerr != nil {
					err = fmt.Errorf("--capacity: %s: %w", key, cerr)
					break
				}
			}
		default:
			err = fmt.Errorf("--capacity: unknown key %q for an ec2 provider (known: %s)", key, strings.Join(ec2CapacityKeys, ", "))
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return p, errors.Join(errs...)
}

func ec2CheckExtraTag(k, v string) error {
	lk := strings.ToLower(k)
	switch {
	case k == "" || len(k) > 128:
		return fmt.Errorf("tag key %q: 1 to 128 characters", k)
	case k == EC2TagName || strings.HasPrefix(lk, "lakeshore:") || strings.HasPrefix(lk, "aws:"):
		return fmt.Errorf("tag key %q is reserved (the launcher sets Name and lakeshore:*, AWS owns aws:*)", k)
	case len(v) > 256:
		return fmt.Errorf("tag %q: value longer than 256 characters", k)
	}
	return nil
}

// Launch runs one instance of the provider's image with the bootstrap as
// its user data, tagged with the daemon's name and Worker id. The request
// carries a client token derived from the Worker id, so a RunInstances
// that the SDK retries after a lost answer, or a Launch called again for
// the same Worker, starts no second instance.
func (e *EC2) Launch(ctx context.Context, req LaunchRequest) (Instance, error) {
	p, err := e.launchParams(req.Capacity)
	if err != nil {
		return Instance{}, fmt.Errorf("ec2 provider %s: %w", e.name, err)
	}
	switch {
	case req.WorkerID == "":
		return Instance{}, fmt.Errorf("ec2 provider %s: launch without a worker id", e.name)
	case req.Name == "" || len(req.Name) > 256:
		return Instance{}, fmt.Errorf("ec2 provider %s: --name: %q: an instance's Name tag holds 1 to 256 characters", e.name, req.Name)
	case len(req.Bootstrap) > ec2MaxUserData:
		return Instance{}, fmt.Errorf("ec2 provider %s: the rendered bootstrap is %d bytes and EC2 user data holds at most %d: shorten --bootstrap-script", e.name, len(req.Bootstrap), ec2MaxUserData)
	}
	tags := []types.Tag{
		{Key: aws.String(EC2TagName), Value: aws.String(req.Name)},
		{Key: aws.String(EC2TagWorkerID), Value: aws.String(req.WorkerID)},
	}
	for _, k := range slices.Sorted(maps.Keys(p.Tags)) {
		tags = append(tags, types.Tag{Key: aws.String(k), Value: aws.String(p.Tags[k])})
	}
	in := &ec2.RunInstancesInput{
		ImageId:      aws.String(p.ImageID),
		InstanceType: types.InstanceType(p.InstanceType),
		MinCount:     aws.Int32(1),
		MaxCount:     aws.Int32(1),
		UserData:     aws.String(base64.StdEncoding.EncodeToString([]byte(req.Bootstrap))),
		ClientToken:  aws.String(ec2ClientToken(req.WorkerID)),
		TagSpecifications: []types.TagSpecification{
			{ResourceType: types.ResourceTypeInstance, Tags: tags},
		},
	}
	if p.SubnetID != "" {
		in.SubnetId = aws.String(p.SubnetID)
	}
	if len(p.SecurityGroupIDs) > 0 {
		in.SecurityGroupIds = p.SecurityGroupIDs
	}
	if p.KeyName != "" {
		in.KeyName = aws.String(p.KeyName)
	}
	if p.IAMInstanceProfile != "" {
		if strings.HasPrefix(p.IAMInstanceProfile, "arn:") {
			in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Arn: aws.String(p.IAMInstanceProfile)}
		} else {
			in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Name: aws.String(p.IAMInstanceProfile)}
		}
	}
	if p.AvailabilityZone != "" {
		in.Placement = &types.Placement{AvailabilityZone: aws.String(p.AvailabilityZone)}
	}
	if p.Spot {
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{
			MarketType: types.MarketTypeSpot,
			SpotOptions: &types.SpotMarketOptions{
				SpotInstanceType:             types.SpotInstanceTypeOneTime,
				InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate,
			},
		}
	}
	out, err := e.client.RunInstances(ctx, in)
	if err != nil {
		return Instance{}, e.apiError("RunInstances", p.ImageID, err)
	}
	if len(out.Instances) != 1 || aws.ToString(out.Instances[0].InstanceId) == "" {
		return Instance{}, fmt.Errorf("ec2 provider %s: RunInstances answered %d instances for a request of one", e.name, len(out.Instances))
	}
	id := aws.ToString(out.Instances[0].InstanceId)
	e.log.Info().Str("worker_id", req.WorkerID).Str("name", req.Name).Str("instance", id).
		Str("instance_type", p.InstanceType).Str("image_id", p.ImageID).Msg("ec2 instance launched")
	return Instance{ID: id}, nil
}

// ec2ClientToken is RunInstances' idempotency token for a Worker: its id when
// it fits EC2's 64 ASCII characters, else a digest of it.
func ec2ClientToken(workerID string) string {
	if len(workerID) <= 64 && ec2PrintableASCII(workerID) {
		return workerID
	}
	sum := sha256.Sum256([]byte(workerID))
	return hex.EncodeToString(sum[:])
}

func ec2PrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Terminate terminates the instance. One EC2 no longer knows is already
// gone, which is what was asked; a terminated one EC2 still lists
// terminates again without error.
func (e *EC2) Terminate(ctx context.Context, instanceID string) error {
	if !ec2InstanceIDRE().MatchString(instanceID) {
		return fmt.Errorf("ec2 provider %s: %q is not an instance id (i-...)", e.name, instanceID)
	}
	_, err := e.client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{instanceID}})
	if ec2InstanceNotFound(err) {
		e.log.Info().Str("instance", instanceID).Msg("ec2 instance already gone")
		return nil
	}
	if err != nil {
		return e.apiError("TerminateInstances", instanceID, err)
	}
	e.log.Info().Str("instance", instanceID).Msg("ec2 instance terminated")
	return nil
}

// ConsoleLog returns the instance's serial console output, decoded; empty
// while EC2 has none yet. latest asks for the most recent output, which
// only Nitro instances keep: on the others it falls back to the buffer
// EC2 captured at boot and shutdown.
func (e *EC2) ConsoleLog(ctx context.Context, instanceID string, latest bool) (string, error) {
	if !ec2InstanceIDRE().MatchString(instanceID) {
		return "", fmt.Errorf("ec2 provider %s: %q is not an instance id (i-...)", e.name, instanceID)
	}
	in := &ec2.GetConsoleOutputInput{InstanceId: aws.String(instanceID)}
	if latest {
		in.Latest = aws.Bool(true)
	}
	out, err := e.client.GetConsoleOutput(ctx, in)
	if latest && ec2APICode(err) == "UnsupportedOperation" {
		e.log.Debug().Str("instance", instanceID).Msg("latest console output unsupported by the instance type; reading the captured buffer")
		in.Latest = nil
		out, err = e.client.GetConsoleOutput(ctx, in)
	}
	if ec2InstanceNotFound(err) {
		return "", fmt.Errorf("ec2 provider %s: instance %s: %w", e.name, instanceID, ErrInstanceGone)
	}
	if err != nil {
		return "", e.apiError("GetConsoleOutput", instanceID, err)
	}
	enc := aws.ToString(out.Output)
	if enc == "" {
		return "", nil
	}
	b, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return "", fmt.Errorf("ec2 provider %s: console output of %s is not base64: %w", e.name, instanceID, err)
	}
	return string(b), nil
}

func ec2APICode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func ec2InstanceNotFound(err error) bool {
	return ec2APICode(err) == "InvalidInstanceID.NotFound"
}

// apiError turns an SDK error of op (about subject, an id) into one that
// says what is wrong and which flag or setting fixes it, ending with the
// API's own code and message (wrapped, for errors.As) rather than the
// SDK's whole operation dump.
func (e *EC2) apiError(op, subject string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("ec2 provider %s: %s: gave up (the call's time ran out or it was canceled): %w", e.name, op, err)
	}
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		var send *smithyhttp.RequestSendError
		if errors.As(err, &send) {
			where := "the EC2 API of region " + e.spec.Region
			if e.spec.Endpoint != "" {
				where = "the EC2 API at " + e.spec.Endpoint
			}
			return fmt.Errorf("ec2 provider %s: %s: cannot reach %s: check --endpoint and --region, and the network of the serve host: %w", e.name, op, where, send.Err)
		}
		// The SDK resolves credentials before signing and reports a
		// failure only as text ("get identity: ..."), with no type.
		if strings.Contains(err.Error(), "get identity: ") {
			return e.noCredentials(err)
		}
		return fmt.Errorf("ec2 provider %s: %s: %w", e.name, op, err)
	}
	code := ae.ErrorCode()
	var hint string
	switch {
	case code == "AuthFailure" || code == "InvalidClientTokenId" || code == "SignatureDoesNotMatch" ||
		code == "UnrecognizedClientException" || code == "IncompleteSignature" || code == "InvalidAccessKeyId":
		hint = "the AWS credentials of the serve process were refused: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the keys of " + e.profileName()
	case code == "ExpiredToken" || code == "RequestExpired" || code == "ExpiredTokenException":
		hint = "the AWS credentials of the serve process have expired (or its clock is wrong): renew the session of " + e.profileName()
	case code == "UnauthorizedOperation" || code == "AccessDenied" || code == "AccessDeniedException":
		hint = fmt.Sprintf("the credentials are valid but may not call %s: grant ec2:%s to the serve process's IAM identity", op, op)
	case strings.HasPrefix(code, "InvalidAMIID."):
		hint = fmt.Sprintf("--image-id: image %s not found in region %s (an AMI id belongs to one region)", subject, e.spec.Region)
	case strings.HasPrefix(code, "InvalidSubnetID.") || strings.HasPrefix(code, "InvalidSubnet"):
		hint = "--subnet-id (or capacity subnet_id): the subnet is not in this region or account"
	case strings.HasPrefix(code, "InvalidGroup.") || strings.HasPrefix(code, "InvalidSecurityGroupID"):
		hint = "--security-group-id (or capacity security_group_ids): a group is not in this region, or not in the subnet's VPC"
	case strings.HasPrefix(code, "InvalidKeyPair."):
		hint = "--key-name (or capacity key_name): no such key pair in this region"
	case code == "NoSuchEntity" || strings.Contains(strings.ToLower(code+" "+ae.ErrorMessage()), "instanceprofile") ||
		strings.Contains(strings.ToLower(ae.ErrorMessage()), "instance profile"):
		hint = "--iam-instance-profile (or capacity iam_instance_profile): the instance profile is unknown or the serve process may not pass its role (iam:PassRole)"
	case code == "InsufficientInstanceCapacity":
		hint = "EC2 has no capacity of this instance type here now: try another instance_type or availability_zone, or later"
	case code == "InstanceLimitExceeded" || code == "VcpuLimitExceeded" || code == "MaxSpotInstanceCountExceeded":
		hint = "the account's quota for this instance type is used up: ask AWS to raise it, or launch fewer"
	case code == "Unsupported" || code == "InvalidInstanceType":
		hint = "the instance type is not offered here (region, availability zone or image architecture): choose another instance_type"
	case code == "IdempotentParameterMismatch":
		hint = "this worker was already launched with other parameters (the client token is the worker id)"
	case code == "InvalidUserData.Malformed":
		hint = "the rendered bootstrap was refused as user data"
	case code == "RequestLimitExceeded" || code == "Throttling":
		hint = fmt.Sprintf("still throttled by EC2 after %d attempts: launch fewer at once (--concurrency)", ec2MaxAttempts)
	case strings.HasPrefix(code, "InvalidInstanceID."):
		hint = fmt.Sprintf("instance %s", subject)
	default:
		hint = "EC2 refused the call"
	}
	return fmt.Errorf("ec2 provider %s: %s: %s: %w", e.name, op, hint, ae)
}

func (e *EC2) profileName() string {
	if e.spec.Profile != "" {
		return fmt.Sprintf("profile %q", e.spec.Profile)
	}
	return "its profile (AWS_PROFILE, or default)"
}

// lazyRE compiles expr once, the first time the returned func is called.
func lazyRE(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
