// Package dashboard owns the control plane's web pages: the login form
// and its sessions (kept in the store, so they hold across replicas and
// restarts), CSRF protection, the fleet, one daemon with its actions, and
// exec and invocation pages whose output streams in over server-sent
// events.
//
// It is an operator client: every read and action goes through the
// operator API, called in-process with the admin token (so validation,
// authorization order and errors are the API's own), never the store,
// which it uses only for sessions. Pages are rendered on the server with
// html/template; the few lines of JavaScript that swap server-rendered
// fragments in, and the stylesheet, are embedded in the binary, as these
// hosts have no internet.
package dashboard
