//go:build !amd64

package seccompbpf

import (
	"errors"
	"runtime"
	"sync"

	"github.com/managoat/managoat/mechanism/internal/denylist/policy"
	"golang.org/x/sys/unix"
)

var jail = sync.OnceValues(func() ([]unix.SockFilter, error) {
	return policy.Assemble(policy.Jail(runtime.GOARCH))
})

var jailMounts = sync.OnceValues(func() ([]unix.SockFilter, error) {
	return policy.Assemble(policy.JailMounts(runtime.GOARCH))
})

func filterExec() ([]unix.SockFilter, error) {
	return nil, errors.New("the filter-exec helper exists for amd64 only")
}
