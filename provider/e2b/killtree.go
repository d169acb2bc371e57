package e2b

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// KillTreeScript is the bash script that kills process pid and every
// descendant it has. envd starts a command without a process group of its
// own (it stays in envd's) and its SendSignal signals the pid alone
// (e2b-dev/infra packages/envd/internal/services/process/handler), so
// killing an exec at its deadline that way would leave its children (a
// build's compilers, a backgrounded server) running. The script freezes
// the tree (SIGSTOP) from the root down, walking parent links in
// /proc/<pid>/status, repeats the walk until no new process appears (a
// child forked between walks is caught next round), then SIGKILLs it.
// It needs only bash and /proc. A process that left the tree before the
// walk (a daemon that double-forked to init) is not found.
func KillTreeScript(pid int) string {
	return `root=` + strconv.Itoa(pid) + `
declare -A seen
walk() {
  declare -A kids=()
  local f p k v
  for f in /proc/[0-9]*/status; do
    p=${f#/proc/}; p=${p%/status}
    while read -r k v; do
      if [ "$k" = PPid: ]; then kids[$v]+=" $p"; break; fi
    done <"$f" 2>/dev/null
  done
  local queue=($root) new=0 q c
  while [ ${#queue[@]} -gt 0 ]; do
    q=${queue[0]}; queue=("${queue[@]:1}")
    if [ -z "${seen[$q]}" ]; then seen[$q]=1; new=1; kill -STOP "$q" 2>/dev/null; fi
    for c in ${kids[$q]}; do queue+=("$c"); done
  done
  return $((1-new))
}
for i in 1 2 3 4 5; do walk || break; done
kill -KILL ${!seen[@]} 2>/dev/null
exit 0
`
}

// killTree kills an exec that outlived its deadline or was cancelled, in
// the background: its whole tree through KillTreeScript, then its pid
// through SendSignal in case the script could not run. It is bounded by
// Config.KillTimeout, logs its outcome, and Close waits for it; the exec
// returns without waiting (a kill through envd can take as long as any
// request, more on a busy sandbox) unless Config.ExecWaitsForKill.
//
// The returned channel is closed when the kill is over.
func (p *Provider) killTree(sandboxID string, srv *cmdServer) <-chan struct{} {
	srv.mu.Lock()
	pid := srv.pid
	srv.mu.Unlock()
	done := make(chan struct{})
	p.killMu.Lock()
	if p.kills == nil {
		p.kills = map[chan struct{}]struct{}{}
	}
	p.kills[done] = struct{}{}
	p.killMu.Unlock()
	go func() {
		defer func() {
			p.killMu.Lock()
			delete(p.kills, done)
			p.killMu.Unlock()
			close(done)
		}()
		start := time.Now()
		err := p.killTreeNow(sandboxID, srv, pid)
		if err != nil {
			p.cfg.Logger.Warn("e2b: could not kill an exec's process tree", "sandbox", sandboxID,
				"tag", srv.tag, "pid", pid, "took", time.Since(start), "err", err)
			return
		}
		p.cfg.Logger.Debug("e2b: killed an exec's process tree", "sandbox", sandboxID,
			"tag", srv.tag, "pid", pid, "took", time.Since(start))
	}()
	return done
}

// killTreeNow is killTree's work. It fails only when neither the script
// nor the signal reached envd.
func (p *Provider) killTreeNow(sandboxID string, srv *cmdServer, pid uint32) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.KillTimeout)
	defer cancel()
	var scriptErr error
	if pid != 0 {
		f := false
		killer := &cmdServer{tag: newTag(execPrefix)}
		cmd, err := p.start(ctx, sandboxID, startRequest{
			Process: processConfig{Cmd: "bash", Args: []string{"-c", KillTreeScript(int(pid))}},
			Tag:     killer.tag, Stdin: &f,
		}, killer)
		if err == nil {
			_, err = sandbox.CollectExecMax(ctx, cmd, true, p.cfg.KillTimeout, 64<<10, normalize)
			_ = cmd.Stop()
		}
		scriptErr = err
	}
	sigErr := p.unary(ctx, sandboxID, "SendSignal", map[string]any{"process": srv.selector(), "signal": "SIGNAL_SIGKILL"}, nil)
	if scriptErr != nil && sigErr != nil {
		return errors.Join(scriptErr, sigErr)
	}
	return nil
}
