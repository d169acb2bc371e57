package oci

import (
	"encoding/binary"
	"fmt"
	"runtime"

	"github.com/managoat/managoat/mechanism/internal/seccompbpf"
)

// filterExecPath is where the shared rootfs holds the filter-exec helper.
const filterExecPath = "/.managoat/filter-exec"

// filterExecCode is the x86-64 machine code of the filter-exec helper, a
// static executable of 112 bytes that gVisor's exec'd commands go through:
// runsc exec does not apply the bundle's seccomp filter to the processes it
// starts, so the helper loads it itself and execs the command. Assembled
// with GNU as from (Intel syntax):
//
//	_start: mov eax, 157            ; prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
//	        mov edi, 38
//	        mov esi, 1
//	        xor edx, edx
//	        xor r10d, r10d
//	        xor r8d, r8d
//	        syscall
//	        mov eax, 317            ; seccomp(SECCOMP_SET_MODE_FILTER, 0, &fprog)
//	        mov edi, 1
//	        xor esi, esi
//	        lea rdx, [rip + fprog]
//	        syscall
//	        test rax, rax
//	        jnz fail
//	        mov rcx, [rsp]          ; argc >= 3: helper, path, argv0 [args...]
//	        cmp rcx, 3
//	        jb fail
//	        mov rdi, [rsp+16]       ; execve(argv[1], &argv[2], envp)
//	        lea rsi, [rsp+24]
//	        lea rdx, [rsp+rcx*8+16]
//	        mov eax, 59
//	        syscall
//	fail:   mov edi, 126            ; exit_group(126)
//	        mov eax, 231
//	        syscall
//	        .balign 8
//	fprog:  .short 0, 0, 0, 0       ; sock_fprog: len (patched), padding
//	        .quad 0                 ; filter address (patched)
//
// It is generated rather than built from a Go program because it must run
// inside the container from the read-only rootfs with nothing else (a Go
// binary would need the managing binary's cooperation, like the jail's
// Init hook, and would be megabytes).
var filterExecCode = []byte{
	0xb8, 0x9d, 0x00, 0x00, 0x00, 0xbf, 0x26, 0x00, 0x00, 0x00, 0xbe, 0x01,
	0x00, 0x00, 0x00, 0x31, 0xd2, 0x45, 0x31, 0xd2, 0x45, 0x31, 0xc0, 0x0f,
	0x05, 0xb8, 0x3d, 0x01, 0x00, 0x00, 0xbf, 0x01, 0x00, 0x00, 0x00, 0x31,
	0xf6, 0x48, 0x8d, 0x15, 0x34, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x85,
	0xc0, 0x75, 0x20, 0x48, 0x8b, 0x0c, 0x24, 0x48, 0x83, 0xf9, 0x03, 0x72,
	0x16, 0x48, 0x8b, 0x7c, 0x24, 0x10, 0x48, 0x8d, 0x74, 0x24, 0x18, 0x48,
	0x8d, 0x54, 0xcc, 0x10, 0xb8, 0x3b, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xbf,
	0x7e, 0x00, 0x00, 0x00, 0xb8, 0xe7, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x90,
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x00, 0x00,
}

const (
	fprogOffset = 0x60 // of fprog in filterExecCode
	elfBase     = 0x400000
	elfHeaders  = 64 + 56 // ELF header and one program header
)

// filterExecELF returns the helper executable: an ELF header, one loadable
// segment holding the code, and the assembled filter after it.
func filterExecELF() ([]byte, error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("oci: the filter-exec helper exists for amd64 only")
	}
	raw, err := seccompbpf.FilterExec()
	if err != nil {
		return nil, fmt.Errorf("oci: seccomp filter: %w", err)
	}
	codeOff := elfHeaders
	filterOff := codeOff + len(filterExecCode)
	total := filterOff + 8*len(raw)
	b := make([]byte, total)
	le := binary.LittleEndian
	copy(b, []byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0})
	le.PutUint16(b[16:], 2)    // ET_EXEC
	le.PutUint16(b[18:], 0x3e) // EM_X86_64
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[24:], uint64(elfBase+codeOff)) // entry
	le.PutUint64(b[32:], 64)                      // phoff
	le.PutUint16(b[52:], 64)                      // ehsize
	le.PutUint16(b[54:], 56)                      // phentsize
	le.PutUint16(b[56:], 1)                       // phnum
	ph := b[64:]
	le.PutUint32(ph[0:], 1) // PT_LOAD
	le.PutUint32(ph[4:], 5) // R+X
	le.PutUint64(ph[8:], 0)
	le.PutUint64(ph[16:], elfBase)
	le.PutUint64(ph[24:], elfBase)
	le.PutUint64(ph[32:], uint64(total))
	le.PutUint64(ph[40:], uint64(total))
	le.PutUint64(ph[48:], 0x1000)
	copy(b[codeOff:], filterExecCode)
	le.PutUint16(b[codeOff+fprogOffset:], uint16(len(raw)))
	le.PutUint64(b[codeOff+fprogOffset+8:], uint64(elfBase+filterOff))
	for i, r := range raw {
		o := filterOff + 8*i
		le.PutUint16(b[o:], r.Code)
		b[o+2], b[o+3] = r.Jt, r.Jf
		le.PutUint32(b[o+4:], r.K)
	}
	return b, nil
}
