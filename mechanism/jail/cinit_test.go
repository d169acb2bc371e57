package jail

import (
	"context"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
)

// Under CI the binary is built with cgo, so the C init is what runs.
func TestCInitLinked(t *testing.T) {
	testenv.Require(t, cInitLinked, "built without cgo: the C init (cinit.c) is not linked, only the Go init runs")
}

func TestProtocolRoundTrip(t *testing.T) {
	reqs := []request{
		{Ping: true},
		{Signal: 15},
		{Argv: []string{"sh", "-c", "echo hi"}, Env: []string{"A=1", "B="}, Dir: "/tmp", KillOnClose: true},
		{Argv: []string{""}, Env: nil, Dir: "", Collect: true},
	}
	for _, r := range reqs {
		b, err := r.marshal()
		if err != nil {
			t.Fatal(err)
		}
		var got request
		if err := got.unmarshal(b); err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if !slices.Equal(got.Argv, r.Argv) || !slices.Equal(got.Env, r.Env) || got.Dir != r.Dir ||
			got.KillOnClose != r.KillOnClose || got.Collect != r.Collect || got.Signal != r.Signal || got.Ping != r.Ping {
			t.Fatalf("round trip %+v -> %+v", r, got)
		}
	}
	for _, r := range []reply{{Pong: true}, {Started: true, Pid: 7}, {Error: "no", NotFound: true}, {Exited: true, Code: 137, Sig: 9}} {
		var got reply
		if err := got.unmarshal(r.marshal()); err != nil || got != r {
			t.Fatalf("round trip %+v -> %+v, %v", r, got, err)
		}
	}
	if _, err := (request{Argv: []string{strings.Repeat("x", maxPacket)}}).marshal(); err == nil {
		t.Fatal("a request over the packet limit was encoded")
	}
}

// abusePackets are malformed requests a buggy or hostile client could
// send; each must get an error reply or a closed connection, and the init
// must go on serving.
func abusePackets() map[string][]byte {
	le := func(vs ...uint32) []byte {
		var b []byte
		for _, v := range vs {
			b = ne.AppendUint32(b, v)
		}
		return b
	}
	spawnHdr := []byte{kindSpawn, 0, 0, 0, 0, 0, 0, 0}
	return map[string][]byte{
		"short":                 {kindSpawn, 0, 0},
		"unknown kind":          {'Z', 0, 0, 0, 0, 0, 0, 0},
		"signal before a spawn": append([]byte{kindSignal, 0, 0, 0}, le(9)...),
		"argc huge":             append(slices.Clone(spawnHdr), le(0xffffffff)...),
		"string past the end":   append(slices.Clone(spawnHdr), le(1, 1000, 'a')...),
		"no directory":          append(slices.Clone(spawnHdr), le(1, 4, 0x65757274, 0)...),
		"NUL in argv":           append(slices.Clone(spawnHdr), append(le(1, 3), append([]byte("a\x00b"), le(0, 1, '/')...)...)...),
		"trailing bytes":        append(slices.Clone(spawnHdr), le(1, 4, 0x65757274, 0, 1, '/', 99)...),
		"empty argv":            append(slices.Clone(spawnHdr), le(0, 0, 1, '/')...),
	}
}

// TestInitRefusesMalformedRequests sends every abuse packet, with and
// without descriptors, to each init, then checks it still serves.
func TestInitRefusesMalformedRequests(t *testing.T) {
	testenv.RequireRoot(t)
	for _, mode := range []string{"c", "go"} {
		if mode == "c" && !cInitLinked {
			continue
		}
		t.Run(mode, func(t *testing.T) {
			if mode == "go" {
				t.Setenv(initEnv, "go")
			}
			j, err := New(Config{StateDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := j.Provision(ctx, "abuse", mechanism.Spec{}); err != nil {
				t.Fatal(err)
			}
			if err := j.Start(ctx, "abuse"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = j.Destroy(context.Background(), "abuse") })
			st, err := readState(j.dir("abuse"))
			if err != nil {
				t.Fatal(err)
			}
			devnull, err := os.Open(os.DevNull)
			if err != nil {
				t.Fatal(err)
			}
			defer devnull.Close()
			for name, pkt := range abusePackets() {
				for _, withFDs := range []bool{false, true} {
					c, err := net.Dial("unixpacket", st.Socket)
					if err != nil {
						t.Fatalf("%s: dial: %v", name, err)
					}
					_ = c.SetDeadline(time.Now().Add(5 * time.Second))
					var oob []byte
					if withFDs {
						fd := int(devnull.Fd())
						oob = unix.UnixRights(fd, fd, fd)
					}
					if _, _, err := c.(*net.UnixConn).WriteMsgUnix(pkt, oob, nil); err != nil {
						t.Fatalf("%s: send: %v", name, err)
					}
					b := make([]byte, 4096)
					n, err := c.Read(b)
					c.Close()
					if err != nil {
						continue // the init hung up: fine
					}
					var r reply
					if err := r.unmarshal(b[:n]); err != nil {
						t.Fatalf("%s (fds %v): unreadable reply %q: %v", name, withFDs, b[:n], err)
					}
					if r.Started || r.Exited || r.Pong {
						t.Fatalf("%s (fds %v): accepted: %+v", name, withFDs, r)
					}
				}
			}
			if err := ping(ctx, st.Socket); err != nil {
				t.Fatalf("the init stopped serving: %v", err)
			}
			c, err := j.Execute(ctx, "abuse", []string{"sh", "-c", "ls -l /proc/self/fd/ | grep -c -e socket: -e anon_inode; true"}, mechanism.ExecOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// No workload inherits the control socket, a connection, the
			// epoll or the signalfd: its only descriptors are 0, 1, 2
			// (pipes and /dev/null) and ls's own directory.
			if got := strings.TrimSpace(string(c.Stdout)); got != "0" {
				t.Fatalf("a workload holds %s of the init's sockets or anon inodes:\n%s", got, c.Stderr)
			}
		})
	}
}
