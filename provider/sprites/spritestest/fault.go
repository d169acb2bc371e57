package spritestest

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// Fault changes the answer to matching requests. A Fault with only Stall
// set delays the real answer; any other field replaces it.
type Fault struct {
	// Method matches the request method; "" matches any.
	Method string
	// Path matches the percent-encoded request path exactly, or as a
	// prefix when it ends in '*'; "" matches any.
	Path string
	// Times is how many matching requests the fault serves; 0 means all.
	Times int

	// Status is the answer's status (200 when zero and a body is given).
	// On the exec WebSocket it refuses the upgrade with this status.
	Status int
	// Header adds headers to the answer, e.g. Location or Retry-After.
	Header map[string]string
	// Body is the answer's body.
	Body []byte
	// Oversize appends this many filler bytes to Body.
	Oversize int
	// Stall waits this long, or until the client goes away, before
	// answering (or before the real answer when nothing else is set).
	Stall time.Duration
	// Truncate declares a Content-Length larger than the body sent, then
	// closes the connection.
	Truncate bool
	// Drop closes the connection without any answer.
	Drop bool
	// CloseWithoutExit, on the exec WebSocket, accepts the upgrade, sends
	// Body as stdout, then closes the socket normally with no exit frame.
	CloseWithoutExit bool
	// Silent, on the exec WebSocket, accepts the upgrade and then sends
	// nothing at all (no session_info) until the client goes away.
	Silent bool
}

func (f *Fault) replaces() bool {
	return f.Status != 0 || f.Body != nil || f.Oversize > 0 || f.Truncate || f.Drop || f.CloseWithoutExit || f.Silent || len(f.Header) > 0
}

// Inject adds a fault; faults are tried in the order they were added.
func (s *Server) Inject(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &f)
}

// ClearFaults removes every fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

func (s *Server) matchFaultLocked(r *http.Request) *Fault {
	for i, f := range s.faults {
		if f.Method != "" && f.Method != r.Method {
			continue
		}
		p := r.URL.EscapedPath()
		if f.Path != "" {
			if pre, ok := strings.CutSuffix(f.Path, "*"); ok {
				if !strings.HasPrefix(p, pre) {
					continue
				}
			} else if f.Path != p {
				continue
			}
		}
		if f.Times > 0 {
			f.Times--
			if f.Times == 0 {
				s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
			}
		}
		return f
	}
	return nil
}

// applyFault answers r as f says; false means "go on with the real answer".
func (s *Server) applyFault(w http.ResponseWriter, r *http.Request, f *Fault, isWS bool) bool {
	if f.Stall > 0 {
		t := time.NewTimer(f.Stall)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			s.mu.Lock()
			s.abandoned++
			s.mu.Unlock()
			return true
		case <-s.ctx.Done():
			return true
		}
	}
	if !f.replaces() {
		return false
	}
	body := f.Body
	if f.Oversize > 0 {
		body = append(append([]byte(nil), body...), bytes.Repeat([]byte("x"), f.Oversize)...)
	}
	if f.Drop {
		hijackClose(w)
		return true
	}
	if isWS && f.Silent {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return true
		}
		ctx, cancel := context.WithCancel(s.ctx)
		defer cancel()
		for {
			if _, _, err := c.Read(ctx); err != nil {
				break
			}
		}
		_ = c.CloseNow()
		return true
	}
	if isWS && f.CloseWithoutExit {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return true
		}
		if len(body) > 0 {
			_ = c.Write(r.Context(), websocket.MessageBinary, append([]byte{1}, body...))
		}
		_ = c.Close(websocket.StatusNormalClosure, "")
		return true
	}
	for k, v := range f.Header {
		w.Header().Set(k, v)
	}
	status := f.Status
	if status == 0 {
		status = http.StatusOK
	}
	if f.Truncate {
		hj, ok := w.(http.Hijacker)
		if !ok {
			return true
		}
		conn, buf, err := hj.Hijack()
		if err != nil {
			return true
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 " + strconv.Itoa(status) + " " + http.StatusText(status) + "\r\n")
		for k, v := range f.Header {
			_, _ = buf.WriteString(k + ": " + v + "\r\n")
		}
		_, _ = buf.WriteString("Content-Length: " + strconv.Itoa(len(body)+100) + "\r\n\r\n")
		_, _ = buf.Write(body)
		_ = buf.Flush()
		return true
	}
	if w.Header().Get("Content-Type") == "" && len(body) > 0 {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
	return true
}

func hijackClose(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
		}
	}
}
