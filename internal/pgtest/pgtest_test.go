package pgtest_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/pgtest"
)

// TestStart: a cluster starts, answers a query over its socket, and is
// gone after the test.
func TestStart(t *testing.T) {
	srv := pgtest.Start(t)
	out, err := exec.Command("psql", srv.DSN("postgres"), "-Atc", "select 40+2").CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	if strings.TrimSpace(string(out)) != "42" {
		t.Fatalf("psql said %q", out)
	}
}

// TestTCP: with the TCP option the cluster answers on a loopback port as
// well as on its socket.
func TestTCP(t *testing.T) {
	srv := pgtest.Start(t, pgtest.TCP())
	for _, dsn := range []string{srv.TCPDSN("postgres"), srv.DSN("postgres")} {
		out, err := exec.Command("psql", dsn, "-Atc", "select coalesce(host(inet_client_addr()), 'socket')").CombinedOutput()
		if err != nil {
			t.Fatalf("psql %s: %v\n%s", dsn, err, out)
		}
		want := "socket"
		if strings.Contains(dsn, "127.0.0.1") {
			want = "127.0.0.1"
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Fatalf("psql %s: client address %q, want %q", dsn, got, want)
		}
	}
	if pgtest.Start(t).TCPDSN("postgres") != "" {
		t.Fatal("a cluster without the TCP option names a TCP DSN")
	}
}
