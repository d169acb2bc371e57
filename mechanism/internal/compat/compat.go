// Package compat makes a system call through the i386 interface of an
// x86-64 kernel (int $0x80): the tests that check a seccomp filter refuses
// the calls of another architecture use it, and so does hostfacts' probe
// of whether the kernel runs such calls at all (without IA32 emulation
// int $0x80 faults, so call it only in a process you can lose).
package compat
