package oci

import (
	"bytes"
	"debug/elf"
	"runtime"
	"testing"
)

func TestFilterExecELF(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the helper exists for amd64 only")
	}
	b, err := filterExecELF()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC || len(f.Progs) != 1 || f.Entry != elfBase+elfHeaders {
		t.Fatalf("header: %+v", f.FileHeader)
	}
	p := f.Progs[0]
	if p.Type != elf.PT_LOAD || p.Filesz != uint64(len(b)) || p.Flags != elf.PF_R|elf.PF_X {
		t.Fatalf("segment: %+v", p.ProgHeader)
	}
	n := int(b[elfHeaders+fprogOffset]) | int(b[elfHeaders+fprogOffset+1])<<8
	if n == 0 || elfHeaders+len(filterExecCode)+8*n != len(b) {
		t.Fatalf("filter length %d for a %d-byte file", n, len(b))
	}
}
