//go:build nymph_no_self_exec

package selfupdate

const selfExecBuild = "false"
