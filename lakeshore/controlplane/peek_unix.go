//go:build unix

package controlplane

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// canPeek: a socket can be looked at without being read (MSG_PEEK).
const canPeek = true

// peekSocket looks at a socket without reading from it or waiting. It
// does not take the connection's read lock (Control, not Read), so it may
// look while watchSocket waits on the socket.
func peekSocket(rc syscall.RawConn) socketState {
	st := socketGone
	err := rc.Control(func(fd uintptr) {
		st = peekFD(fd)
	})
	if err != nil {
		return socketGone
	}
	return st
}

// waitReadable waits until the socket has bytes to read or is closed, or
// its read deadline passes (socketQuiet then), reading nothing.
func waitReadable(rc syscall.RawConn) socketState {
	st := socketGone
	err := rc.Read(func(fd uintptr) bool {
		st = peekFD(fd)
		return st != socketQuiet
	})
	if err != nil {
		return socketQuiet
	}
	return st
}

func peekFD(fd uintptr) socketState {
	var b [1]byte
	for {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return socketQuiet
		case err != nil, n == 0:
			return socketGone
		}
		return socketData
	}
}
