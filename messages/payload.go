package messages

import "github.com/vmihailenco/msgpack/v5"

// Payload limits.
const (
	InlineThreshold      = 256 << 10
	MaxPayload           = 100 << 20
	PresignFetchTimeoutS = 60
)

// PayloadRef points at a blob in the payload store. Decoding accepts both
// content_type and contentType.
type PayloadRef struct {
	Bucket      string  `msgpack:"bucket" json:"bucket"`
	Key         string  `msgpack:"key" json:"key"`
	Size        uint64  `msgpack:"size" json:"size"`
	ContentType string  `msgpack:"content_type" json:"content_type"`
	SHA256      *string `msgpack:"sha256" json:"sha256"`
}

type payloadRefWire struct {
	Bucket           string  `msgpack:"bucket"`
	Key              string  `msgpack:"key"`
	Size             uint64  `msgpack:"size"`
	ContentType      string  `msgpack:"content_type"`
	ContentTypeCamel string  `msgpack:"contentType"`
	SHA256           *string `msgpack:"sha256"`
}

var _ msgpack.CustomDecoder = (*PayloadRef)(nil)

// DecodeMsgpack implements msgpack.CustomDecoder.
func (p *PayloadRef) DecodeMsgpack(dec *msgpack.Decoder) error {
	var w payloadRefWire
	if err := dec.Decode(&w); err != nil {
		return err
	}
	*p = PayloadRef{Bucket: w.Bucket, Key: w.Key, Size: w.Size, ContentType: w.ContentType, SHA256: w.SHA256}
	if p.ContentType == "" {
		p.ContentType = w.ContentTypeCamel
	}
	return nil
}

// PresignRequest is the body of POST /v1/namespaces/{ns}/payloads/presign,
// camelCase on the wire.
type PresignRequest struct {
	Op    string  `msgpack:"op" json:"op"`
	Key   *string `msgpack:"key" json:"key"`
	Size  *uint64 `msgpack:"size" json:"size"`
	JobID *string `msgpack:"jobId" json:"jobId"`
	Kind  *string `msgpack:"kind" json:"kind"`
	// SHA256 (hex) is what a put's bytes must hash to; an extension of
	// the spec's fields, left out when unset so a daemon's body is the
	// spec's byte for byte. A bucket keeps it as the object's checksum.
	SHA256 *string `msgpack:"sha256,omitempty" json:"sha256,omitempty"`
}

// Presign operations.
const (
	PresignGet = "get"
	PresignPut = "put"
)

// PresignResponse gives the URL to GET (or PUT) the blob at.
type PresignResponse struct {
	URL        string `msgpack:"url" json:"url"`
	Key        string `msgpack:"key" json:"key"`
	ExpiresAtS Epoch  `msgpack:"expires_at_epoch_s" json:"expires_at_epoch_s"`
	// Headers must be sent with the request as they are: a bucket's
	// presigned put signs its length and checksum headers. Absent for a
	// get, and from a control plane that serves its payloads itself.
	Headers map[string]string `msgpack:"headers,omitempty" json:"headers,omitempty"`
}
