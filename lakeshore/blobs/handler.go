package blobs

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Handler serves this store's presigned URLs: GET and HEAD of
// URLPrefix{token} for a presigned get, PUT for a presigned put. The
// control plane's own payload routes use Authorize and render their own
// answers; this one answers JSON, {"error": ...} on failure: 403 for a
// URL that is not valid or (saying "expired") has expired, 404 for a blob
// that is gone, 400 for a body of another size or sha256 than signed (naming
// which), 413 for one over its signed size or cap.
func (l *Local) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.URL.Path, l.prefix)
		if !ok || token == "" || strings.Contains(token, "/") {
			writeError(w, http.StatusNotFound, "no such presigned URL")
			return
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			l.serveGet(w, r, token)
		case http.MethodPut:
			l.servePut(w, r, token)
		default:
			w.Header().Set("Allow", "GET, HEAD, PUT")
			writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+": a presigned URL takes GET, HEAD or PUT")
		}
	})
}

func (l *Local) serveGet(w http.ResponseWriter, r *http.Request, token string) {
	g, err := l.Authorize(token, opGet)
	if err != nil {
		writeStoreError(w, err)
		return
	}
	rc, info, err := l.Open(r.Context(), g.Key)
	if err != nil {
		writeStoreError(w, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", info.ContentType)
	h.Set("Content-Length", strconv.FormatInt(info.Size, 10))
	h.Set("X-Checksum-Sha256", info.SHA256)
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if err := copyHoldingLast(w, rc); err != nil {
		// The status is sent; a body cut short of its Content-Length is
		// the one way left to tell the client these bytes are not the
		// blob (or that the disk failed it).
		panic(http.ErrAbortHandler)
	}
}

// copyHoldingLast copies r to w one read behind, so the last bytes go out
// only once r has reached a clean EOF: a blob that fails its sha256 at EOF
// never reaches the client whole.
func copyHoldingLast(w io.Writer, r io.Reader) error {
	buf := make([]byte, 32<<10)
	pend := make([]byte, 0, len(buf))
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if len(pend) > 0 {
				if _, werr := w.Write(pend); werr != nil {
					return werr
				}
			}
			pend = append(pend[:0], buf[:n]...)
		}
		if errors.Is(err, io.EOF) {
			_, werr := w.Write(pend)
			return werr
		}
		if err != nil {
			return err
		}
	}
}

// putResult is the answer to a presigned PUT.
type putResult struct {
	Key         string `json:"key"`
	Size        int64  `json:"size"`
	SHA256      string `json:"sha256"`
	ContentType string `json:"contentType"`
}

func (l *Local) servePut(w http.ResponseWriter, r *http.Request, token string) {
	g, err := l.Authorize(token, opPut)
	if err != nil {
		writeStoreError(w, err)
		return
	}
	o := g.Put
	// A Content-Length that already breaks the grant is refused before a
	// byte is read.
	if cl := r.ContentLength; cl >= 0 {
		if l := o.limit(); l >= 0 && cl > l {
			writeError(w, http.StatusRequestEntityTooLarge, "size: Content-Length "+strconv.FormatInt(cl, 10)+" is over the "+strconv.FormatInt(l, 10)+" bytes this URL allows")
			return
		}
		if o.Size >= 0 && cl != o.Size {
			writeError(w, http.StatusBadRequest, "size: presigned for "+strconv.FormatInt(o.Size, 10)+" bytes, Content-Length says "+strconv.FormatInt(cl, 10))
			return
		}
	}
	if o.ContentType == "" {
		if ct := r.Header.Get("Content-Type"); len(ct) <= 200 {
			o.ContentType = ct
		}
	}
	body := &countingReader{r: r.Body}
	info, err := l.Put(r.Context(), g.Key, body, o)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, putResult{Key: info.Key, Size: info.Size, SHA256: info.SHA256, ContentType: info.ContentType})
	case errors.Is(err, ErrSize) && o.limit() >= 0 && body.n > o.limit():
		writeError(w, http.StatusRequestEntityTooLarge, "size: "+err.Error())
	case errors.Is(err, ErrSize):
		writeError(w, http.StatusBadRequest, "size: "+err.Error())
	case errors.Is(err, ErrChecksum):
		writeError(w, http.StatusBadRequest, "sha256: "+err.Error())
	case body.err != nil:
		writeError(w, http.StatusBadRequest, "body: could not be read: "+body.err.Error())
	default:
		writeStoreError(w, err)
	}
}

type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		c.err = err
	}
	return n, err
}

// writeStoreError answers err with the status its kind calls for; an
// error of no known kind is the store's own failure.
func writeStoreError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrExpired), errors.Is(err, ErrDenied):
		writeError(w, http.StatusForbidden, "token: "+err.Error())
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, "key: "+err.Error())
	default:
		writeError(w, http.StatusServiceUnavailable, "the blob store could not complete the request; retry")
	}
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
