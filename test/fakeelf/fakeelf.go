// Package fakeelf makes the tests' stand-in binaries: a minimal
// little-endian 64-bit ELF header for a machine, then random bytes. That is
// enough for the release store's triple detection and the self-updater's
// executable check, without building a real binary.
package fakeelf

import (
	"bytes"
	"crypto/rand"
	"debug/elf"
	"encoding/binary"
	"testing"
)

// New is size bytes: an ELF header declaring machine, then random bytes.
func New(t testing.TB, machine elf.Machine, size int) []byte {
	t.Helper()
	hdr := elf.Header64{
		Ident:   [elf.EI_NIDENT]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)},
		Type:    uint16(elf.ET_EXEC),
		Machine: uint16(machine),
		Version: uint32(elf.EV_CURRENT),
		Ehsize:  64,
	}
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.LittleEndian, hdr); err != nil {
		t.Fatal(err)
	}
	rest := make([]byte, size-buf.Len())
	if _, err := rand.Read(rest); err != nil {
		t.Fatal(err)
	}
	buf.Write(rest)
	return buf.Bytes()
}
