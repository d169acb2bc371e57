package cgroups

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

// procState is the state letter of /proc/<pid>/stat.
func procState(pid int) byte {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// Freeze holds a process and the child it forked, through the v2 freezer
// and, on a group with v1 directories only, through SIGSTOP to each.
func TestFreeze(t *testing.T) {
	testenv.RequireRoot(t)
	l, err := Detect()
	testenv.Require(t, err == nil, fmt.Sprintf("no cgroups: %v", err))
	name := "managoat-test-freeze-" + strconv.Itoa(os.Getpid())
	cases := map[string]*Group{}
	if l.V2 != "" {
		cases["v2"] = &Group{Name: name, V1: map[string]string{}, V2: filepath.Join(l.V2, name)}
	}
	if d := l.V1["pids"]; d != "" {
		cases["v1"] = &Group{Name: name, V1: map[string]string{"pids": filepath.Join(d, name)}}
	}
	testenv.Require(t, len(cases) > 0, "neither a cgroup2 tree nor a v1 pids hierarchy")
	for which, g := range cases {
		t.Run(which, func(t *testing.T) {
			for _, d := range g.Dirs() {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { g.Kill(); _ = g.Remove(context.Background()) })
			// The shell forks once it is in the group (a line on stdin).
			cmd := exec.Command("sh", "-c", "read go; sleep 60 & wait")
			in, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			defer cmd.Process.Kill()
			for _, d := range g.Dirs() {
				if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
					t.Fatal(err)
				}
			}
			in.Write([]byte("go\n"))
			var pids []int
			for i := 0; i < 1000 && len(pids) < 2; i++ {
				pids = Procs(g.Dirs()[0])
				if len(pids) < 2 {
					_ = exec.Command("true").Run() // a pause that is not a sleep
				}
			}
			if len(pids) < 2 {
				t.Fatalf("group holds %v, want the shell and its child", pids)
			}
			if err := g.Freeze(context.Background(), true); err != nil {
				t.Fatal(err)
			}
			frozen := func() bool {
				if which == "v2" {
					ev, _ := os.ReadFile(filepath.Join(g.V2, "cgroup.events"))
					return strings.Contains(string(ev), "frozen 1")
				}
				for _, p := range pids {
					if procState(p) != 'T' {
						return false
					}
				}
				return true
			}
			if !frozen() {
				t.Fatalf("%v not frozen", pids)
			}
			if err := g.Freeze(context.Background(), false); err != nil {
				t.Fatal(err)
			}
			if frozen() {
				t.Fatalf("%v still frozen", pids)
			}
		})
	}
}
