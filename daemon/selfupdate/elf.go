package selfupdate

import (
	"debug/elf"
	"fmt"
	"io"
	"runtime"
)

// elfMachines maps GOARCH to the ELF machine a binary for it declares.
var elfMachines = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"386":     elf.EM_386,
	"arm":     elf.EM_ARM,
	"riscv64": elf.EM_RISCV,
	"ppc64le": elf.EM_PPC64,
	"ppc64":   elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"loong64": elf.EM_LOONGARCH,
}

// checkExecutable refuses a download that hashes correctly but could never
// run here — the wrong release triple, or a file that is not a program at
// all. Installing it would keep this process alive (the failed exec leaves
// the old image running) but make the next start fail. Only Linux is
// checked; elsewhere the checksum is the whole guard.
func checkExecutable(r io.ReaderAt) error {
	if runtime.GOOS != "linux" {
		return nil
	}
	ef, err := elf.NewFile(r)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotExecutable, err)
	}
	if ef.Type != elf.ET_EXEC && ef.Type != elf.ET_DYN {
		return fmt.Errorf("%w: ELF type %s", ErrNotExecutable, ef.Type)
	}
	if want, ok := elfMachines[runtime.GOARCH]; ok && ef.Machine != want {
		return fmt.Errorf("%w: built for %s, this machine is %s (%s)", ErrNotExecutable, ef.Machine, runtime.GOARCH, want)
	}
	return nil
}
