package local

import (
	"context"
	"syscall"

	"github.com/managoat/managoat/provider/local/supervisor"
	"github.com/managoat/managoat/sandbox"
)

func supervisorPid(ctx context.Context, p *Provider, h *sandbox.Handle) (int, error) {
	return supervisor.Client{Dir: p.sandboxDir(h.Name)}.Ping(ctx)
}

func syscallKill(pid int) { _ = syscall.Kill(pid, syscall.SIGKILL) }
