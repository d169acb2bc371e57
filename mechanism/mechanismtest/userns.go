package mechanismtest

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
)

// checkUserns: the workload runs under a uid range of its own. Read from
// inside (/proc/self/uid_map and id -u) and from the host (the
// workload's /proc/<pid>/status found by a unique command line): the
// workload's host uid is neither root's nor any user's of the host's
// /etc/passwd nor the caller's, and root of the sandbox is not the
// host's root. A mechanism whose workload keeps the host's ids (no user
// namespace, "0 0 4294967295"), or is the caller's own uid (a rootless
// manager maps only itself), does not map: not applicable, with the
// reason.
func checkUserns(t *testing.T, k *kit, m mechanism.Mechanism) {
	k.claims(t, m, mechanism.PrivilegeSeparation)
	id := k.sandbox(t, m, "userns", mechanism.Spec{})
	c := mustSh(t, m, id, "id -u; cat /proc/self/uid_map")
	lines := strings.Split(strings.TrimSpace(string(c.Stdout)), "\n")
	inside, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || len(lines) < 2 {
		t.Fatalf("id -u; cat /proc/self/uid_map: %q %q", c.Stdout, c.Stderr)
	}
	hostOf := func(u int) (int, bool) {
		for _, l := range lines[1:] {
			f := strings.Fields(l)
			if len(f) != 3 {
				continue
			}
			in, _ := strconv.Atoi(f[0])
			out, _ := strconv.Atoi(f[1])
			n, _ := strconv.Atoi(f[2])
			if u >= in && u-in < n {
				return out + u - in, true
			}
		}
		return 0, false
	}
	if strings.Join(strings.Fields(lines[1]), " ") == "0 0 4294967295" {
		k.notApplicable(t, "%s does not map the workload to ids of its own (uid_map %q): it runs as host uid %d", m.Name(), lines[1], inside)
	}
	host, ok := hostOf(inside)
	if !ok {
		t.Fatalf("the workload's uid %d is not in its uid_map %q", inside, lines[1:])
	}
	if os.Geteuid() != 0 && host == os.Geteuid() {
		k.notApplicable(t, "%s maps only the caller's own uid %d (no root: no range of its own to give)", m.Name(), host)
	}
	users := hostIDs("/etc/passwd")
	if host == 0 || users[host] || host == os.Geteuid() {
		t.Errorf("BREACHED: the workload (uid %d inside) is host uid %d, a host user's", inside, host)
	}
	if r, ok := hostOf(0); ok && r == 0 {
		t.Errorf("BREACHED: root of the sandbox is host root (uid_map %q)", lines[1:])
	}
	// From the host: the workload's process and its ids.
	tag := fmt.Sprintf("3597.%d", time.Now().UnixNano()%1000000)
	mustSh(t, m, id, "setsid sleep "+tag+" </dev/null >/dev/null 2>&1 &")
	pid := findHostProcess("sleep " + tag)
	if pid == 0 {
		t.Logf("the workload's process is not a host process here: checked from inside only (host uid %d)", host)
		return
	}
	ids := statusUids(pid)
	for _, u := range ids {
		if u != host {
			t.Errorf("the workload's host ids %v, want all %d (its uid_map)", ids, host)
			break
		}
		if u == 0 || users[u] {
			t.Errorf("BREACHED: the workload runs as host uid %d, a host user's", u)
			break
		}
	}
	t.Logf("the workload: uid %d inside, host uid %d (Uid line %v); root inside maps to %v", inside, host, ids, func() any { r, _ := hostOf(0); return r }())
}

// hostIDs are the ids (third field) of a passwd-like file.
func hostIDs(path string) map[int]bool {
	out := map[int]bool{}
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Split(l, ":"); len(f) > 2 {
			if n, err := strconv.Atoi(f[2]); err == nil {
				out[n] = true
			}
		}
	}
	return out
}

// findHostProcess returns the pid of the host process whose command line
// is argv, waiting up to 5 s; 0 when there is none.
func findHostProcess(argv string) int {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ") == argv {
				return pid
			}
		}
	}
	return 0
}

// statusUids is the Uid line of /proc/pid/status (real, effective,
// saved, fs).
func statusUids(pid int) []int {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
			var out []int
			for _, s := range strings.Fields(v) {
				n, _ := strconv.Atoi(s)
				out = append(out, n)
			}
			return out
		}
	}
	return nil
}
