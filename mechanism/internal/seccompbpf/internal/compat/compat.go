// Package compat makes a system call through the i386 interface of an
// x86-64 kernel (int $0x80), for the tests that check a seccomp filter
// refuses the calls of another architecture.
package compat
