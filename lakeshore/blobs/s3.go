package blobs

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// S3 keeps blobs as objects of one bucket, under a prefix, through the AWS
// SDK: AWS S3 itself or any S3-compatible service (Cloudflare R2, MinIO,
// moto). Each object carries its sha256 (hex) as the user metadata
// "sha256" and its content type, so Stat and Open know what the bytes
// must hash to; Put also sends the checksum header, so a service that
// verifies checksums refuses corrupted bytes itself.
type S3 struct {
	client   *s3.Client
	presign  *s3.PresignClient
	creds    aws.CredentialsProvider
	bucket   string
	prefix   string // "" or without slashes at either end
	endpoint string // "" is AWS
	region   string
	now      func() time.Time
}

// S3Config configures OpenS3.
type S3Config struct {
	Bucket string
	// Prefix is where the store's keys live in the bucket ("" for its
	// root), without slashes at either end.
	Prefix string
	// Endpoint is an S3-compatible service's URL; "" is AWS. With one the
	// store addresses buckets by path (moto and MinIO need it).
	Endpoint string
	// Region overrides the standard chain's; us-east-1 when none is
	// configured anywhere.
	Region string
	// Profile picks a shared-config profile; "" is the chain's default.
	Profile string
	// Now is the clock presigned URLs are signed at; time.Now if nil.
	Now        func() time.Time
	HTTPClient *http.Client
	// MaxAttempts is how many times a request that fails as S3 says to
	// retry (a 500, a 503, a throttle) is tried; 0 is the SDK's 3.
	MaxAttempts int
}

// checkTimeout bounds Check: serve must not hang at start on an endpoint
// that takes connections and never answers.
const checkTimeout = 15 * time.Second

var bucketRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`) })
var ipLikeRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\d+\.\d+\.\d+\.\d+$`) })

// ParseS3URL splits s3://bucket/prefix, refusing what S3 would: a bucket
// name outside its rules, and anything a URL may carry that a bucket
// address has no use for (credentials, a port, a query).
func ParseS3URL(s string) (bucket, prefix string, err error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("blob store URL %q: "+format, append([]any{s}, a...)...)
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", "", bad("%v", err)
	}
	switch {
	case u.Scheme != "s3":
		return "", "", bad("must start with s3://")
	case u.Opaque != "" || u.User != nil:
		return "", "", bad("must be s3://bucket/prefix, with no credentials in it (they come from the AWS credential chain)")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return "", "", bad("takes no query or fragment; the endpoint and region have their own flags")
	}
	bucket = u.Host
	if err := checkBucket(bucket); err != nil {
		return "", "", bad("%v", err)
	}
	prefix = strings.Trim(u.Path, "/")
	if prefix != "" && !ValidKey(prefix) {
		return "", "", bad("prefix %q: segments joined by single '/', each letters, digits, '.', '_', '+' or '-' starting with a letter or digit", prefix)
	}
	return bucket, prefix, nil
}

func checkBucket(b string) error {
	switch {
	case b == "":
		return errors.New("no bucket name")
	case !bucketRe().MatchString(b):
		return fmt.Errorf("bucket name %q: 3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit", b)
	case strings.Contains(b, ".."):
		return fmt.Errorf("bucket name %q: no two dots in a row", b)
	case ipLikeRe().MatchString(b):
		return fmt.Errorf("bucket name %q: may not look like an IP address", b)
	}
	return nil
}

// OpenS3 configures a client from the standard AWS chain (environment,
// shared files, profile, instance role). It sends nothing: Check does.
func OpenS3(ctx context.Context, c S3Config) (*S3, error) {
	if err := checkBucket(c.Bucket); err != nil {
		return nil, fmt.Errorf("blobs: s3: %w", err)
	}
	c.Prefix = strings.Trim(c.Prefix, "/")
	if c.Prefix != "" && !ValidKey(c.Prefix) {
		return nil, fmt.Errorf("blobs: s3: prefix %q: segments joined by '/', each letters, digits, '.', '_', '+' or '-' starting with a letter or digit", c.Prefix)
	}
	if c.Endpoint != "" {
		if u, err := url.Parse(c.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("blobs: s3: endpoint %q: must be an http:// or https:// URL", c.Endpoint)
		}
	}
	var opts []func(*config.LoadOptions) error
	if c.Region != "" {
		opts = append(opts, config.WithRegion(c.Region))
	}
	if c.Profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(c.Profile))
	}
	if c.HTTPClient != nil {
		opts = append(opts, config.WithHTTPClient(c.HTTPClient))
	}
	if c.MaxAttempts > 0 {
		opts = append(opts, config.WithRetryMaxAttempts(c.MaxAttempts))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("blobs: s3: AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	s := &S3{creds: cfg.Credentials, bucket: c.Bucket, prefix: c.Prefix, endpoint: c.Endpoint, region: cfg.Region, now: c.Now}
	if s.now == nil {
		s.now = time.Now
	}
	s.client = s3.NewFromConfig(cfg, func(o *s3.Options) {
		if c.Endpoint != "" {
			o.BaseEndpoint = aws.String(c.Endpoint)
			o.UsePathStyle = true
		}
		// Open verifies every read against the sha256 the object was
		// stored with; the SDK's own validation would fail first, with
		// an error of its own kind.
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	s.presign = s3.NewPresignClient(s.client, func(o *s3.PresignOptions) {
		o.Presigner = clockPresigner{signer: v4.NewSigner(), now: s.now}
	})
	return s, nil
}

// clockPresigner signs at the store's clock, not the SDK's, and keeps
// every signed header a header: hoisted into the query, x-amz-meta-sha256
// would be a query parameter that some services (moto) do not store.
type clockPresigner struct {
	signer *v4.Signer
	now    func() time.Time
}

func (p clockPresigner) PresignHTTP(ctx context.Context, creds aws.Credentials, r *http.Request, payloadHash, service, region string, _ time.Time, optFns ...func(*v4.SignerOptions)) (string, http.Header, error) {
	optFns = append(optFns, func(o *v4.SignerOptions) { o.DisableHeaderHoisting = true })
	return p.signer.PresignHTTP(ctx, creds, r, payloadHash, service, region, p.now(), optFns...)
}

func (s *S3) String() string {
	if s.prefix == "" {
		return "s3://" + s.bucket
	}
	return "s3://" + s.bucket + "/" + s.prefix
}

// where names the service for errors.
func (s *S3) where() string {
	if s.endpoint == "" {
		return "AWS S3 (region " + s.region + ")"
	}
	return s.endpoint
}

func (s *S3) objectKey(key string) string {
	if s.prefix == "" {
		return key
	}
	return s.prefix + "/" + key
}

// isNotFound: the service says the object (or bucket) is not there.
func isNotFound(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NotFound", "NoSuchKey", "NoSuchBucket":
			return true
		}
	}
	var re *awshttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound
}

func metaSHA256(m map[string]string) string {
	for k, v := range m {
		if strings.EqualFold(k, "sha256") {
			return v
		}
	}
	return ""
}

// Put reads the body once before it sends a byte, hashing and counting it
// against o, so a body that breaks o is refused with nothing uploaded and
// the upload can carry its checksum. A body that cannot be rewound is
// spooled to a temporary file for that, never held in memory: over plain
// HTTP (MinIO, moto) the SDK cannot sign a body it cannot rewind. The
// upload is hashed again as it goes; bytes that changed between the two
// reads are deleted and refused.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, o PutOptions) (Info, error) {
	if err := checkKey(key); err != nil {
		return Info{}, err
	}
	if err := o.validate(); err != nil {
		return Info{}, err
	}
	var (
		body  io.ReadSeeker
		start int64
		n     int64
		sum   string
	)
	if rs, ok := r.(io.ReadSeeker); ok {
		var err error
		if start, err = rs.Seek(0, io.SeekCurrent); err != nil {
			return Info{}, fmt.Errorf("blobs: %s: %w", key, err)
		}
		if n, sum, err = copyHashed(ctx, key, io.Discard, rs, o); err != nil {
			return Info{}, err
		}
		if _, err := rs.Seek(start, io.SeekStart); err != nil {
			return Info{}, fmt.Errorf("blobs: %s: %w", key, err)
		}
		body = rs
	} else {
		f, err := os.CreateTemp("", "lakeshore-blob-*")
		if err != nil {
			return Info{}, fmt.Errorf("blobs: %s: spool file: %w", key, err)
		}
		defer func() {
			f.Close()
			os.Remove(f.Name())
		}()
		if n, sum, err = copyHashed(ctx, key, f, r, o); err != nil {
			return Info{}, err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return Info{}, fmt.Errorf("blobs: %s: spool file: %w", key, err)
		}
		body = f
	}
	raw, _ := hex.DecodeString(sum)
	hs := &hashingSeeker{rs: body, start: start, h: sha256.New()}
	ct := o.contentType()
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:         aws.String(s.bucket),
		Key:            aws.String(s.objectKey(key)),
		Body:           hs,
		ContentLength:  aws.Int64(n),
		ContentType:    aws.String(ct),
		Metadata:       map[string]string{"sha256": sum},
		ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(raw)),
	})
	if err != nil {
		return Info{}, fmt.Errorf("blobs: put %s in %s: %w", key, s, err)
	}
	if got := hex.EncodeToString(hs.h.Sum(nil)); hs.n != n || got != sum {
		if derr := s.Delete(ctx, key); derr != nil {
			return Info{}, fmt.Errorf("%w: %s: the body changed while it was sent (sha256 %s, then %s), and deleting what was sent failed: %v", ErrChecksum, key, sum, got, derr)
		}
		return Info{}, fmt.Errorf("%w: %s: the body changed while it was sent (sha256 %s, then %s)", ErrChecksum, key, sum, got)
	}
	return Info{Key: key, Size: n, SHA256: sum, ContentType: ct, Modified: s.now().UTC()}, nil
}

// hashingSeeker hashes what the SDK reads of a body; the SDK rewinds it to
// where it started (to hash it for the signature, to retry), and each
// rewind starts the hash over, so it ends as the hash of the last read.
type hashingSeeker struct {
	rs    io.ReadSeeker
	start int64
	h     hash.Hash
	n     int64
}

func (s *hashingSeeker) Read(p []byte) (int, error) {
	n, err := s.rs.Read(p)
	s.h.Write(p[:n])
	s.n += int64(n)
	return n, err
}

func (s *hashingSeeker) Seek(off int64, whence int) (int64, error) {
	pos, err := s.rs.Seek(off, whence)
	if err == nil && pos == s.start && !(whence == io.SeekCurrent && off == 0) {
		s.h.Reset()
		s.n = 0
	}
	return pos, err
}

func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	if err := checkKey(key); err != nil {
		return Info{}, err
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.objectKey(key))})
	if err != nil {
		if isNotFound(err) {
			return Info{}, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return Info{}, fmt.Errorf("blobs: stat %s in %s: %w", key, s, err)
	}
	return Info{Key: key, Size: aws.ToInt64(out.ContentLength), SHA256: metaSHA256(out.Metadata), ContentType: aws.ToString(out.ContentType), Modified: aws.ToTime(out.LastModified)}, nil
}

// Open checks the bytes against the object's sha256 metadata as they are
// read; an object this store did not write (no such metadata) is checked
// for its length only.
func (s *S3) Open(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	if err := checkKey(key); err != nil {
		return nil, Info{}, err
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.objectKey(key))})
	if err != nil {
		if isNotFound(err) {
			return nil, Info{}, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return nil, Info{}, fmt.Errorf("blobs: open %s in %s: %w", key, s, err)
	}
	info := Info{Key: key, Size: aws.ToInt64(out.ContentLength), SHA256: metaSHA256(out.Metadata), ContentType: aws.ToString(out.ContentType), Modified: aws.ToTime(out.LastModified)}
	if out.ContentLength == nil {
		info.Size = -1
	}
	return newVerifyingReader(out.Body, key, info), info, nil
}

func (s *S3) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.objectKey(key))})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("blobs: delete %s in %s: %w", key, s, err)
	}
	return nil
}

// List pages through ListObjectsV2, which returns keys in the order this
// package's keys sort (UTF-8 byte order). S3 lists no user metadata or
// content type, so each Info has an empty SHA256 and ContentType; Stat
// gives them. Objects whose names are not valid keys (not written here)
// are skipped.
func (s *S3) List(ctx context.Context, prefix string, fn func(Info) error) error {
	full := s.objectKey(prefix)
	if prefix == "" && s.prefix != "" {
		full = s.prefix + "/"
	}
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(full)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("blobs: list %q in %s: %w", prefix, s, err)
		}
		for _, obj := range page.Contents {
			key := aws.ToString(obj.Key)
			if s.prefix != "" {
				var ok bool
				if key, ok = strings.CutPrefix(key, s.prefix+"/"); !ok {
					continue
				}
			}
			if !ValidKey(key) {
				continue
			}
			if err := fn(Info{Key: key, Size: aws.ToInt64(obj.Size), Modified: aws.ToTime(obj.LastModified)}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *S3) PresignGet(ctx context.Context, key string, ttl time.Duration) (Presigned, error) {
	if _, err := s.Stat(ctx, key); err != nil {
		return Presigned{}, err
	}
	if err := checkTTL(key, ttl); err != nil {
		return Presigned{}, err
	}
	now := s.now()
	req, err := s.presign.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.objectKey(key))}, s3.WithPresignExpires(ttl))
	if err != nil {
		return Presigned{}, fmt.Errorf("blobs: presign get %s in %s: %w", key, s, err)
	}
	return Presigned{URL: req.URL, Method: req.Method, Headers: signedHeaders(req.SignedHeader), Expires: now.Add(ttl).UTC()}, nil
}

// PresignPut signs the upload's length and content type, and with a
// sha256 the metadata and checksum headers, so the service refuses other
// bytes (where it checks them) and Open catches them where it does not.
func (s *S3) PresignPut(ctx context.Context, key string, o PutOptions, ttl time.Duration) (Presigned, error) {
	if err := checkKey(key); err != nil {
		return Presigned{}, err
	}
	if err := o.validate(); err != nil {
		return Presigned{}, err
	}
	if o.Size < 0 {
		return Presigned{}, fmt.Errorf("%w: presign put %s: S3 cannot cap an upload of unknown size; presign with the exact size", ErrSize, key)
	}
	if err := checkTTL(key, ttl); err != nil {
		return Presigned{}, err
	}
	in := &s3.PutObjectInput{
		Bucket:        aws.String(s.bucket),
		Key:           aws.String(s.objectKey(key)),
		ContentLength: aws.Int64(o.Size),
		ContentType:   aws.String(o.contentType()),
	}
	if o.SHA256 != "" {
		raw, _ := hex.DecodeString(o.SHA256)
		in.Metadata = map[string]string{"sha256": o.SHA256}
		in.ChecksumSHA256 = aws.String(base64.StdEncoding.EncodeToString(raw))
	}
	now := s.now()
	req, err := s.presign.PresignPutObject(ctx, in, s3.WithPresignExpires(ttl))
	if err != nil {
		return Presigned{}, fmt.Errorf("blobs: presign put %s in %s: %w", key, s, err)
	}
	return Presigned{URL: req.URL, Method: req.Method, Headers: signedHeaders(req.SignedHeader), Expires: now.Add(ttl).UTC()}, nil
}

// checkTTL: SigV4 URLs live a second to seven days.
func checkTTL(key string, ttl time.Duration) error {
	if ttl < time.Second || ttl > 7*24*time.Hour {
		return fmt.Errorf("blobs: presign %s: ttl %s: S3 presigns for 1s to 7 days", key, ttl)
	}
	return nil
}

// signedHeaders is what the client must send: every signed header but
// Host, which its HTTP client sets from the URL.
func signedHeaders(h http.Header) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		if strings.EqualFold(k, "Host") || len(v) == 0 {
			continue
		}
		out[k] = strings.Join(v, ",")
	}
	return out
}

// Check asks for the bucket (HeadBucket) and says which of the three
// usual faults it is: the bucket, the credentials, the endpoint.
func (s *S3) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	creds, err := s.creds.Retrieve(ctx)
	if err != nil {
		return fmt.Errorf("blob store %s: no AWS credentials: %w; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an instance role", s, err)
	}
	_, err = s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(s.bucket)}, func(o *s3.Options) {
		o.RetryMaxAttempts = 1 // the fault is reported, not retried into the timeout
	})
	if err == nil {
		return nil
	}
	var ae smithy.APIError
	code := ""
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	status := 0
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	var oe *net.OpError
	switch {
	case isNotFound(err):
		return fmt.Errorf("blob store %s: bucket %s does not exist at %s: create it (aws s3 mb s3://%s) or fix --blobs", s, s.bucket, s.where(), s.bucket)
	case status == http.StatusForbidden || code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" || code == "AccessDenied":
		return fmt.Errorf("blob store %s: the credentials (access key %s, from %s) were refused by %s: %w; fix them (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE) or grant them the bucket", s, creds.AccessKeyID, creds.Source, s.where(), err)
	case errors.As(err, &oe) && oe.Op == "dial", errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("blob store %s: endpoint %s does not answer: %w; start it or fix --blobs-endpoint", s, s.where(), err)
	}
	return fmt.Errorf("blob store %s: %s refused HeadBucket: %w", s, s.where(), err)
}

var _ Store = (*S3)(nil)
