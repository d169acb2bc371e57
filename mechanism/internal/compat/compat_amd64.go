package compat

// Syscall32 makes i386 system call nr with up to three arguments through
// int $0x80 and returns what the kernel put in eax. The numbers are
// i386's (getpid is 20), not x86-64's.
func Syscall32(nr, a1, a2, a3 uintptr) uintptr
