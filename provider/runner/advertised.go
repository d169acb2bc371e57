package runner

import (
	"context"
	"time"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// Advertised is p as its online runners advertise it: p itself (a
// sandbox.FileReader) when every online runner reports read_file
// (wire.CapReadFile), else p without ReadFile, so that a caller which
// asks the provider's type whether it reads files (the conformance
// suite, the registry) is told no instead of getting not_supported from
// every read. Fountain's daemon has no read_file and reports no caps.
// With no runner online, p is returned: nothing can be told yet.
//
// ReadFile itself is refused with ErrNotSupported, without a frame sent,
// on a runner that does not report read_file (Conn.accepts), whichever
// of the two a caller holds.
func (p *Provider) Advertised(ctx context.Context) sandbox.Provider {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rs, err := p.c.Runners(ctx)
	if err != nil || len(rs) == 0 {
		return p
	}
	for _, r := range rs {
		if !r.HasCap(wire.CapReadFile) {
			return withoutReadFile{p}
		}
	}
	return p
}

// withoutReadFile is a Provider that does not claim sandbox.FileReader:
// every other method of Provider is promoted, ReadFile is not.
type withoutReadFile struct{ noReadFile }

// noReadFile is the method set of Provider less ReadFile.
type noReadFile interface {
	sandbox.Provider
	sandbox.SessionTerminator
	sandbox.HostPather
	sandbox.SandboxCapabilities
	sandbox.PartialLister
	sandbox.CommandSignaler
}
