// Package seccompbpf holds managoat's seccomp filters as assembled BPF
// programs, ready to load.
//
// The filters are stated once, as go-seccomp-bpf policies, in package
// denylist/policy. On x86-64 the programs are assembled ahead of time by
// gen.go (go generate) into programs_amd64.go, and a test checks that they
// are still what the policies assemble to: linking go-seccomp-bpf costs
// every managoat process about 0.4 ms at start (its syscall tables are
// built by its package initialisation), and assembling a filter costs a
// sandbox start another 0.2 ms. On other architectures the programs are
// assembled at run time, once per process.
//
// The returned programs are shared: callers must not modify them.
package seccompbpf

import "golang.org/x/sys/unix"

// Jail returns the jail's filter (policy.Jail) for this architecture.
func Jail() ([]unix.SockFilter, error) { return jail() }

// JailMounts returns the filter of a jail sandbox with a read-write host
// mount (policy.JailMounts: Jail, and no set-user-ID or set-group-ID
// mode) for this architecture.
func JailMounts() ([]unix.SockFilter, error) { return jailMounts() }

// FilterExec returns the filter the OCI bundles' filter-exec helper loads
// (policy.FilterExec; x86-64 only).
func FilterExec() ([]unix.SockFilter, error) { return filterExec() }
