//go:build !unix

package controlplane

import "syscall"

// canPeek: without MSG_PEEK a parked poll could not tell a closed
// connection from a waiting one, so polls wait in their handlers.
const canPeek = false

func peekSocket(syscall.RawConn) socketState { return socketGone }

func waitReadable(syscall.RawConn) socketState { return socketGone }
