package selfupdate

import "strconv"

// selfExec is the build's self-exec switch, a string so the linker can set
// it with -X nymph/daemon/selfupdate.selfExec=false. It starts from the build tag's choice
// (selfExecBuild); nothing assigns it at run time.
var selfExec = selfExecBuild

// SelfExecDefault reports whether this build lets Exec replace the process
// image. Only a value that parses as false ("false", "0", "f", ...) turns it
// off; the spec's default build has it on.
func SelfExecDefault() bool {
	on, err := strconv.ParseBool(selfExec)
	return err != nil || on
}
