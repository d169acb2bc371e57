package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/managoat/managoat/mechanism"
)

// The control socket lets another process (the one that calls
// UpdateEgress) change the policy of a proxy this process serves: one
// JSON request {"allow": [...]} per connection, one JSON reply.
type controlReq struct {
	Allow []string `json:"allow"`
}

type controlReply struct {
	Cut   int    `json:"cut"`
	Error string `json:"error,omitempty"`
}

// ServeControl listens on the unix socket path (mode 0600) for policy
// changes until p is closed. path's directory must be this user's and
// writable by no other (a socket another user could replace would take
// the policy changes meant for this proxy).
func (p *Proxy) ServeControl(path string) error {
	if err := private(filepath.Dir(path), 0o022); err != nil {
		return fmt.Errorf("egress control socket: %w", err)
	}
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return err
	}
	ln.SetUnlinkOnClose(true)
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		<-p.done
		ln.Close()
	}()
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.control(c)
		}
	}()
	return nil
}

func (p *Proxy) control(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var req controlReq
	var rep controlReply
	if err := json.NewDecoder(io.LimitReader(c, 1<<20)).Decode(&req); err != nil {
		rep.Error = "bad request: " + err.Error()
	} else if pol, err := ParsePolicy(req.Allow); err != nil {
		rep.Error = err.Error()
	} else {
		var err error
		if rep.Cut, err = p.SetPolicy(pol); err != nil {
			rep.Error = err.Error()
		}
	}
	_ = json.NewEncoder(c).Encode(rep)
}

// Serving reports whether a proxy answers on the control socket path.
func Serving(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Apply asks the proxy serving the control socket path to put allow in
// force, and returns once it is (new connections are checked against it,
// and the open ones it does not allow are cut). An invalid list is an
// *mechanism.InvalidError before anything is sent; no proxy on path is
// mechanism.ErrNotRunning; a socket in a directory another user can
// write is refused.
func Apply(ctx context.Context, path string, allow []string) error {
	if _, err := ParsePolicy(allow); err != nil {
		return err
	}
	if allow == nil {
		allow = []string{}
	}
	if err := private(filepath.Dir(path), 0o022); err != nil {
		return fmt.Errorf("egress control socket: %w", err) // another user's socket could be there
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return fmt.Errorf("%w: no egress proxy answers (%v)", mechanism.ErrNotRunning, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	if err := json.NewEncoder(c).Encode(controlReq{Allow: allow}); err != nil {
		return err
	}
	var rep controlReply
	if err := json.NewDecoder(io.LimitReader(c, 1<<20)).Decode(&rep); err != nil {
		return fmt.Errorf("egress proxy: %w", err)
	}
	if rep.Error != "" {
		return errors.New("egress proxy: " + rep.Error)
	}
	return nil
}
