// Package pgtest starts a throwaway PostgreSQL server for a test, from
// Debian's postgresql package (which .ci/run installs): initdb into a
// directory under the test's temporary directory, then postgres listening
// only on a Unix socket in that directory (no TCP port, nothing another
// test or host can reach), with trust authentication for the one role.
// Cleanup stops the server and removes the cluster.
//
// Written here rather than taken from a library because the ones made for
// the job start Postgres in Docker (no engine on these machines) or
// download binaries (no network); this is the few lines that drive
// Debian's own initdb and postgres.
//
// postgres refuses to run as root, so as root the server runs as the
// package's postgres user, and the directories above the cluster are made
// traversable (not listable) by it.
//
// A test that needs what only a TCP connection has (the server's TCP
// keepalives, say) asks for a loopback port too with the TCP option;
// TCPDSN then names it.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// Role is the superuser role of every cluster pgtest makes.
const Role = "managoat"

// Server is one running throwaway cluster.
type Server struct {
	Dir string // the cluster's directory; its socket is here too

	bin    string
	cred   *syscall.Credential
	cmd    *exec.Cmd
	exited chan error
	log    *strings.Builder
	port   int // the loopback TCP port, 0 without the TCP option
}

// Option is an option of Start.
type Option func(*Server)

// TCP makes the server listen on a free port of 127.0.0.1 besides its
// socket (trust authentication there too: the port is for this host's
// tests alone).
func TCP() Option {
	return func(s *Server) { s.port = -1 }
}

// TCPDSN is a connection string to database db over the loopback port;
// "" without the TCP option.
func (s *Server) TCPDSN(db string) string {
	if s.port <= 0 {
		return ""
	}
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=disable", s.port, Role, db)
}

// freePort is a TCP port of 127.0.0.1 free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// DSN is a connection string (libpq keyword form, which pgx reads) for
// database db on s.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", s.Dir, s.pgPort(), Role, db)
}

// URL is the same as DSN in URL form (postgres://...), for a program that
// tells a database URL from a file path by its scheme.
func (s *Server) URL(db string) string {
	return "postgres://" + Role + "@/" + db + "?host=" + url.QueryEscape(s.Dir) + "&port=" + fmt.Sprint(s.pgPort()) + "&sslmode=disable"
}

// pgPort is the server's port: its socket is named for it too
// (.s.PGSQL.<port>), so 5432 unless it listens on TCP.
func (s *Server) pgPort() int {
	if s.port > 0 {
		return s.port
	}
	return 5432
}

// binDir finds Debian's PostgreSQL server binaries, newest version first.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server in /usr/lib/postgresql/*/bin (Debian package postgresql)")
}

// Start starts a cluster for tb, or skips it (fails under CI=true) when
// the postgresql package is missing.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	bin, err := binDir()
	testenv.Require(tb, err == nil, fmt.Sprint(err))
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		testenv.Require(tb, err == nil, "as root, PostgreSQL needs the postgres user of Debian's postgresql package")
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", "pg-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if cred != nil {
		// The directories above the cluster (not the cluster's own, which
		// Postgres wants 0700) are traversable for the postgres user.
		if err := testenv.Traversable(filepath.Dir(dir)); err != nil {
			tb.Fatal(err)
		}
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			tb.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := &Server{Dir: dir, bin: bin, cred: cred}
	if out, err := initdb.command("initdb", "-D", data, "-U", Role, "--auth=trust", "--no-sync", "-E", "UTF8", "--no-instructions").CombinedOutput(); err != nil {
		tb.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	srv := &Server{Dir: dir, bin: bin, cred: cred}
	for _, o := range opts {
		o(srv)
	}
	if srv.port < 0 {
		if srv.port, err = freePort(); err != nil {
			tb.Fatal(err)
		}
		hba := filepath.Join(data, "pg_hba.conf")
		b, err := os.ReadFile(hba)
		if err != nil {
			tb.Fatal(err)
		}
		if !strings.Contains(string(b), "127.0.0.1/32") {
			b = append(b, "host all all 127.0.0.1/32 trust\n"...)
			if err := os.WriteFile(hba, b, 0o600); err != nil {
				tb.Fatal(err)
			}
		}
	}
	tb.Cleanup(func() { srv.stop(syscall.SIGQUIT) }) // immediate: the cluster is thrown away
	srv.start(tb)
	return srv
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(s.bin, name), args...)
	c.Dir = s.Dir
	c.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "TZ=UTC"}
	c.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	return c
}

// start runs postgres on the cluster and waits until it accepts.
func (s *Server) start(tb testing.TB) {
	tb.Helper()
	listen := ""
	if s.port > 0 {
		listen = "127.0.0.1"
	}
	port := fmt.Sprint(s.pgPort())
	s.cmd = s.command("postgres", "-D", filepath.Join(s.Dir, "data"), "-k", s.Dir, "-p", port, "-c", "listen_addresses="+listen, "-c", "fsync=off",
		"-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=200")
	s.log = &strings.Builder{}
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		tb.Fatalf("pgtest: postgres: %v", err)
	}
	exited := make(chan error, 1)
	s.exited = exited
	cmd := s.cmd
	go func() { exited <- cmd.Wait() }()
	sock := filepath.Join(s.Dir, ".s.PGSQL."+port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err := os.Stat(sock); err == nil {
			// The socket exists before the server accepts; pg_isready says.
			if s.command("pg_isready", "-h", s.Dir, "-p", port, "-U", Role, "-q").Run() == nil {
				return
			}
		}
		select {
		case err := <-exited:
			tb.Fatalf("pgtest: postgres exited: %v\n%s", err, s.log.String())
		case <-ctx.Done():
			tb.Fatalf("pgtest: postgres did not start in 30 s\n%s", s.log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop ends the server with sig (SIGINT: fast shutdown; SIGQUIT:
// immediate), SIGKILL after 10 s.
func (s *Server) stop(sig syscall.Signal) {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
}

// Stop shuts the server down (its cluster stays), as a database that
// went away would; Restart brings it back.
func (s *Server) Stop() { s.stop(syscall.SIGINT) }

// Restart starts a stopped server again on the same cluster.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.stop(syscall.SIGINT)
	s.start(tb)
}
