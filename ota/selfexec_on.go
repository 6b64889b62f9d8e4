//go:build !nymph_no_self_exec

package ota

const selfExecBuild = "true"
