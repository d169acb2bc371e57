package connlimit_test

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/connlimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFloodFromOneSourceLeavesOthersServed: 300 idle connections from
// 127.0.0.2 get at most PerSource slots (the rest are closed at once),
// and a request from 127.0.0.1 is served meanwhile; closing the flood
// gives its slots back.
func TestFloodFromOneSourceLeavesOthersServed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.New(ln, 100, 20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	defer srv.Close()

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 300 {
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, c)
	}
	// The server closes every connection over the bound as it accepts
	// it: wait until it has seen them all, then count those still open
	// from the flood's side.
	for deadline := time.Now().Add(20 * time.Second); l.Refused.Load() < 280 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // polling the accept loop
	}
	open := 0
	for _, c := range flood {
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && err != io.EOF {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				open++
			}
		}
	}
	t.Logf("flood: 300 connections from 127.0.0.2, %d held by the server, %d refused", open, l.Refused.Load())
	if open > 20 || l.Refused.Load() < 280 {
		t.Fatalf("the flood holds %d connections (refused %d), want at most 20", open, l.Refused.Load())
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatalf("a request from another source during the flood: %v", err)
	}
	resp.Body.Close()
	for _, c := range flood {
		c.Close()
	}
	flood = nil
	deadline := time.Now().Add(5 * time.Second)
	for l.Open() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling: the server notices the closes
	}
	if n := l.Open(); n != 0 {
		t.Fatalf("%d connections still counted after the flood closed", n)
	}
}

// TestTotalBound: with the total reached, a new connection from any source
// is refused, and accepted again once one closes.
func TestTotalBound(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.New(ln, 2, 0)
	defer l.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	var cs []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cs = append(cs, c)
	}
	a1, a2 := <-accepted, <-accepted
	deadline := time.Now().Add(5 * time.Second)
	for l.Refused.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if l.Refused.Load() != 1 || l.Open() != 2 {
		t.Fatalf("refused %d open %d, want 1 and 2", l.Refused.Load(), l.Open())
	}
	a1.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case a3 := <-accepted:
		a3.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted after one closed")
	}
	a2.Close()
	_ = cs
}
