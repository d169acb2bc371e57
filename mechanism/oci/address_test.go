package oci_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
)

// TestAddress: a port a container publishes (Spec.Publish; runc with
// network none, runsc with its egress network) is reached from the
// host's loopback at Address, 127.0.0.1 only; Address is "" for a port
// not published and once the container is stopped, where the port no
// longer answers; a Start publishes it again.
func TestAddress(t *testing.T) {
	for rt, network := range map[string]string{"runc": mechanism.NetworkNone, "runsc": mechanism.NetworkEgress} {
		t.Run(rt, func(t *testing.T) { testAddress(t, rt, network) })
	}
}

func testAddress(t *testing.T, rt, network string) {
	requireRuntime(t, rt)
	_, err := os.Stat("/usr/bin/python3")
	testenv.Require(t, err == nil, "/usr/bin/python3 (Debian package python3) to serve inside the container")
	m := newMech(t, rt, t.TempDir())
	ctx := context.Background()
	id := tid("pub")
	started(t, m, id, mechanism.Spec{Network: network, Publish: []int{8080}})
	serve := func() {
		t.Helper()
		p, err := m.HostPath(id, "index.html")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("hello from the container\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		proc, err := m.StartProcess(ctx, id, mechanism.ProcessSpec{Argv: []string{"/usr/bin/python3", "-m", "http.server", "8080", "--bind", "127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = proc.Signal(syscall.SIGKILL)
			_, _ = proc.Wait()
		})
	}
	get := func(addr string) string {
		t.Helper()
		var body string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			resp, err := http.Get("http://" + addr + "/index.html")
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if body = string(b); resp.StatusCode == 200 {
				break
			}
		}
		return body
	}
	serve()
	addr, err := m.Address(ctx, id, 8080)
	if err != nil || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("Address = %q, %v; want 127.0.0.1:PORT", addr, err)
	}
	if got := get(addr); got != "hello from the container\n" {
		t.Fatalf("GET through the published port = %q", got)
	}
	if a, err := m.Address(ctx, id, 9999); a != "" || err != nil {
		t.Errorf("Address of a port not published = %q, %v", a, err)
	}
	if err := m.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if a, err := m.Address(ctx, id, 8080); a != "" || err != nil {
		t.Errorf("Address of a stopped container = %q, %v", a, err)
	}
	if resp, err := http.Get("http://" + addr + "/"); err == nil {
		resp.Body.Close()
		t.Errorf("the published port still answers after Stop")
	}
	if err := m.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	serve()
	addr2, err := m.Address(ctx, id, 8080)
	if err != nil || addr2 == "" {
		t.Fatalf("Address after a restart = %q, %v", addr2, err)
	}
	if got := get(addr2); got != "hello from the container\n" {
		t.Fatalf("GET after a restart = %q", got)
	}
	if _, err := m.Address(ctx, tid("none"), 8080); !errors.Is(err, mechanism.ErrNotFound) {
		t.Errorf("Address of no container = %v, want not found", err)
	}
	if err := m.Provision(ctx, tid("bad"), mechanism.Spec{Publish: []int{0}}); !errors.Is(err, mechanism.ErrInvalid) {
		t.Errorf("publish port 0 = %v, want invalid", err)
	}
}

// TestAddressRunscRefused: with network none a runsc container's
// loopback is gVisor's own stack, which the host cannot enter: it
// publishes nothing and says so at Provision.
func TestAddressRunscRefused(t *testing.T) {
	m := newMech(t, "runsc", t.TempDir())
	err := m.Provision(context.Background(), tid("pub"), mechanism.Spec{Network: mechanism.NetworkNone, Publish: []int{8080}})
	if !errors.Is(err, mechanism.ErrCapabilityUnavailable) || !strings.Contains(err.Error(), "only with an egress network") {
		t.Fatalf("runsc with Publish = %v, want a refusal naming why", err)
	}
}
