//go:build scale

package scale

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// conn is one simulated daemon's HTTP/1.1 keep-alive connection: one
// request at a time on one socket, as a daemon whose poller waits for each
// answer holds it. It is written by hand over a net.Conn, not through an
// http.Transport, so that it is provably one connection per daemon and
// costs one goroutine (the daemon's) and one 4 KB read buffer: a Transport
// adds a read and a write goroutine per connection, tens of thousands of
// them for a big fleet, on the two cores the control plane needs. The
// answers are parsed by net/http (http.ReadResponse), the server is the
// real one.
type conn struct {
	addr   string // host:port of the control plane
	local  *net.TCPAddr
	header []byte // the request headers after the path, up to Content-Length
	nc     net.Conn
	br     *bufio.Reader
	wbuf   []byte
	rbuf   []byte
	dials  int
}

// requestTimeout bounds one request, a held long-poll included (its
// timeout_s is 20): the daemon's HTTP client allows 120 s.
const requestTimeout = 120 * time.Second

func newConn(addr string, local *net.TCPAddr, token string) *conn {
	h := "Host: " + addr + "\r\nContent-Type: application/x-msgpack\r\nAccept: application/x-msgpack\r\nUser-Agent: nymph-scale\r\nAuthorization: Bearer " + token + "\r\nContent-Length: "
	return &conn{addr: addr, local: local, header: []byte(h), wbuf: make([]byte, 0, 1024), rbuf: make([]byte, 0, 1024)}
}

// statusError is a non-2xx answer.
type statusError struct {
	path   string
	status int
	body   string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("POST %s: HTTP %d: %s", e.path, e.status, e.body)
}

// post sends body to path and returns the answer's body, valid until the
// next post. A transport failure closes the connection; the next post
// dials a new one (and counts the dial).
func (c *conn) post(ctx context.Context, path string, body []byte) ([]byte, error) {
	if c.nc == nil {
		d := net.Dialer{LocalAddr: c.local, Timeout: 30 * time.Second}
		nc, err := d.DialContext(ctx, "tcp", c.addr)
		if err != nil {
			return nil, fmt.Errorf("dial %s from %s: %w", c.addr, c.local.IP, err)
		}
		c.nc, c.dials = nc, c.dials+1
		if c.br == nil {
			c.br = bufio.NewReaderSize(nc, 4096)
		} else {
			c.br.Reset(nc)
		}
	}
	out, err := c.roundTrip(path, body)
	if err != nil {
		if errors.As(err, new(*statusError)) {
			return nil, err // the connection is still good
		}
		c.close()
		return nil, fmt.Errorf("POST %s: %w", path, err)
	}
	return out, nil
}

func (c *conn) roundTrip(path string, body []byte) ([]byte, error) {
	w := append(c.wbuf[:0], "POST "...)
	w = append(w, path...)
	w = append(w, " HTTP/1.1\r\n"...)
	w = append(w, c.header...)
	w = strconv.AppendInt(w, int64(len(body)), 10)
	w = append(w, "\r\n\r\n"...)
	w = append(w, body...)
	c.wbuf = w
	if err := c.nc.SetDeadline(time.Now().Add(requestTimeout)); err != nil {
		return nil, err
	}
	if _, err := c.nc.Write(w); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return nil, err
	}
	c.rbuf, err = readAll(resp.Body, c.rbuf[:0])
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if resp.Close {
		c.close()
	}
	if resp.StatusCode/100 != 2 {
		return nil, &statusError{path: path, status: resp.StatusCode, body: string(c.rbuf[:min(len(c.rbuf), 200)])}
	}
	return c.rbuf, nil
}

// readAll is io.ReadAll into a reused buffer.
func readAll(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

func (c *conn) close() {
	if c.nc != nil {
		_ = c.nc.Close()
		c.nc = nil
	}
}
