package opclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// Error is a non-2xx answer from the control plane: its HTTP status and its
// operatorapi.Error body. A request refused before it was sent (an empty
// path parameter) has Status 0.
type Error struct {
	Status  int
	Message string
	Field   string
	Method  string
	Path    string
}

func (e *Error) Error() string {
	msg := e.Message
	if e.Field != "" {
		msg = fmt.Sprintf("%s (field %q)", msg, e.Field)
	}
	if e.Status == 0 {
		return msg
	}
	return fmt.Sprintf("%s (HTTP %d)", msg, e.Status)
}

// TransportError means the request never got an HTTP answer: the server is
// down, unreachable, or the connection broke mid-response.
type TransportError struct {
	Method string
	URL    string
	Err    error
}

func (e *TransportError) Error() string {
	return fmt.Sprintf("cannot reach the control plane (%s %s): %v", e.Method, e.URL, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// StatusOf returns the HTTP status carried by err, or 0 when err is not an
// answer from the server.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// IsNotFound reports whether the server answered 404.
func IsNotFound(err error) bool { return StatusOf(err) == http.StatusNotFound }

// IsUnauthorized reports whether the server refused the token (401 or 403).
func IsUnauthorized(err error) bool {
	s := StatusOf(err)
	return s == http.StatusUnauthorized || s == http.StatusForbidden
}

// IsTransport reports whether err is a failure to get any answer.
func IsTransport(err error) bool {
	var e *TransportError
	return errors.As(err, &e)
}

// Retryable reports whether repeating a read could succeed: no answer at
// all, or a gateway/availability status while a server restarts.
func Retryable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if IsTransport(err) {
		return true
	}
	switch StatusOf(err) {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}
