package dist

import (
	"debug/elf"
	"fmt"
	"io"
	"runtime"
	"strings"
)

// FallbackTriple is the triple of the fleet's usual host, used when nothing
// better is known.
const FallbackTriple = "x86_64-unknown-linux-gnu"

// archTriples maps both `uname -m` names (what a daemon reports as
// versions.arch) and GOARCH names to the gnu triple a release is published
// under.
var archTriples = map[string]string{
	"x86_64":  "x86_64-unknown-linux-gnu",
	"amd64":   "x86_64-unknown-linux-gnu",
	"aarch64": "aarch64-unknown-linux-gnu",
	"arm64":   "aarch64-unknown-linux-gnu",
	"riscv64": "riscv64gc-unknown-linux-gnu",
	"armv7l":  "armv7-unknown-linux-gnueabihf",
	"arm":     "armv7-unknown-linux-gnueabihf",
	"i686":    "i686-unknown-linux-gnu",
	"386":     "i686-unknown-linux-gnu",
	"ppc64le": "powerpc64le-unknown-linux-gnu",
	"s390x":   "s390x-unknown-linux-gnu",
}

var elfTriples = map[elf.Machine]string{
	elf.EM_X86_64:  "x86_64-unknown-linux-gnu",
	elf.EM_AARCH64: "aarch64-unknown-linux-gnu",
	elf.EM_RISCV:   "riscv64gc-unknown-linux-gnu",
	elf.EM_ARM:     "armv7-unknown-linux-gnueabihf",
	elf.EM_386:     "i686-unknown-linux-gnu",
	elf.EM_S390:    "s390x-unknown-linux-gnu",
}

// TripleForArch returns the release triple for a machine architecture as
// `uname -m` or GOARCH spells it ("x86_64", "amd64", "aarch64", ...).
func TripleForArch(arch string) (string, error) {
	if t, ok := archTriples[strings.ToLower(strings.TrimSpace(arch))]; ok {
		return t, nil
	}
	return "", fmt.Errorf("dist: no release triple known for architecture %q", arch)
}

// DefaultTriple is the triple of a linux binary for the architecture this
// process runs on, or FallbackTriple.
func DefaultTriple() string {
	if t, err := TripleForArch(runtime.GOARCH); err == nil {
		return t
	}
	return FallbackTriple
}

// TripleOfELF reads the triple a linux ELF binary was built for. ok is
// false for anything that is not an ELF file of a known machine.
func TripleOfELF(r io.ReaderAt) (string, bool) {
	f, err := elf.NewFile(r)
	if err != nil {
		return "", false
	}
	if f.Machine == elf.EM_PPC64 {
		if f.Data == elf.ELFDATA2LSB {
			return "powerpc64le-unknown-linux-gnu", true
		}
		return "", false
	}
	t, ok := elfTriples[f.Machine]
	return t, ok
}
