// Package localdaemon finds and stops the nymph processes running on this
// machine, for `lakeshore daemon status` and `lakeshore daemon stop`. It
// reads /proc: a process is a nymph when the base name of its executable or
// of its argv[0] is "nymph". Nothing here talks to the control plane.
package localdaemon
