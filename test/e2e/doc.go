// Package e2e tests nymph and lakeshore end to end, as an operator uses
// them: the real binaries, a real control plane on a temporary SQLite file,
// real daemons running real child processes, all over loopback HTTP.
package e2e
