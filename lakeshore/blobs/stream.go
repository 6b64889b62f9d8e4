package blobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
)

// DefaultContentType is what a blob stored without a content type is.
const DefaultContentType = "application/octet-stream"

// validate refuses options no Put could honour, before any byte moves.
func (o PutOptions) validate() error {
	if o.Size < -1 {
		return fmt.Errorf("%w: size %d: must be -1 (any) or a byte count", ErrSize, o.Size)
	}
	if o.Max < 0 {
		return fmt.Errorf("%w: max %d: must be 0 (no cap) or a byte count", ErrSize, o.Max)
	}
	if o.SHA256 != "" {
		if b, err := hex.DecodeString(o.SHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("%w: declared sha256 %q is not 64 hex digits", ErrChecksum, o.SHA256)
		}
	}
	if len(o.ContentType) > 200 {
		return fmt.Errorf("content type of %d bytes: at most 200", len(o.ContentType))
	}
	return nil
}

// limit is the most bytes a Put under o may take; -1 is no limit.
func (o PutOptions) limit() int64 {
	switch {
	case o.Size >= 0:
		return o.Size
	case o.Max > 0:
		return o.Max
	}
	return -1
}

func (o PutOptions) contentType() string {
	if o.ContentType == "" {
		return DefaultContentType
	}
	return o.ContentType
}

// errOver is the ErrSize of a body that ran past o's limit.
func (o PutOptions) errOver(key string) error {
	if o.Size >= 0 {
		return fmt.Errorf("%w: %s: declared %d bytes, got more", ErrSize, key, o.Size)
	}
	return fmt.Errorf("%w: %s: over the %d byte cap", ErrSize, key, o.Max)
}

// verify checks what came (n bytes hashing to sum, hex) against what o
// declared.
func (o PutOptions) verify(key string, n int64, sum string) error {
	if l := o.limit(); l >= 0 && n > l {
		return o.errOver(key)
	}
	if o.Size >= 0 && n != o.Size {
		return fmt.Errorf("%w: %s: declared %d bytes, got %d", ErrSize, key, o.Size, n)
	}
	if o.SHA256 != "" && o.SHA256 != sum {
		return fmt.Errorf("%w: %s: declared sha256 %s, got %s", ErrChecksum, key, o.SHA256, sum)
	}
	return nil
}

// copyHashed copies r to w, at most o's limit and one byte more (so a
// body over the limit is seen as such without reading all of it), and
// checks what came against o.
func copyHashed(ctx context.Context, key string, w io.Writer, r io.Reader, o PutOptions) (int64, string, error) {
	h := sha256.New()
	src := io.Reader(ctxReader{ctx, r})
	if l := o.limit(); l >= 0 {
		src = io.LimitReader(src, l+1)
	}
	n, err := io.Copy(io.MultiWriter(w, h), src)
	if err != nil {
		return n, "", fmt.Errorf("%s: reading the body: %w", key, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	return n, sum, o.verify(key, n, sum)
}

// ctxReader stops a long copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// verifyingReader hashes what it reads and, at EOF, fails with ErrChecksum
// when the bytes are not the size and sha256 they were stored with, so a
// reader never takes a corrupted blob for a complete one.
type verifyingReader struct {
	rc   io.ReadCloser
	key  string
	want string // hex; "" checks nothing
	size int64  // -1 checks nothing
	h    hash.Hash
	n    int64
	err  error
}

func newVerifyingReader(rc io.ReadCloser, key string, info Info) *verifyingReader {
	return &verifyingReader{rc: rc, key: key, want: info.SHA256, size: info.Size, h: sha256.New()}
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if errors.Is(err, io.EOF) {
		if v.size >= 0 && v.n != v.size {
			err = fmt.Errorf("%w: %s: stored as %d bytes, read %d", ErrChecksum, v.key, v.size, v.n)
		} else if got := hex.EncodeToString(v.h.Sum(nil)); v.want != "" && got != v.want {
			err = fmt.Errorf("%w: %s: stored with sha256 %s, read %s", ErrChecksum, v.key, v.want, got)
		}
		v.err = err
	}
	return n, err
}

func (v *verifyingReader) Close() error { return v.rc.Close() }
