// Package opclient is the Go client of the operator API (package
// operatorapi): one method per route, JSON over HTTP with the admin token as
// a bearer. A non-2xx answer comes back as an *Error carrying the HTTP status
// and the server's {error, field} body; a failure to reach the server at all
// is wrapped as-is, so callers can tell "the server said no" from "there was
// no server".
package opclient
