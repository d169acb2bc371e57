package seccompbpf

import "golang.org/x/sys/unix"

//go:generate go run gen.go

func jail() ([]unix.SockFilter, error)       { return jailAMD64, nil }
func jailMounts() ([]unix.SockFilter, error) { return jailMountsAMD64, nil }
func filterExec() ([]unix.SockFilter, error) { return filterExecAMD64, nil }
