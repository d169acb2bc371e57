package egresstest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// socketHelperEnv marks mechanism/egress's socket helper (rootless
// publishing; its publish_rootless.go).
const socketHelperEnv = "MANAGOAT_EGRESS_SOCKET_HELPER="

// SocketHelpers are the pids of this process's descendants that are
// mechanism/egress's socket helpers (the processes that make the sockets
// of a rootless sandbox's published ports): a test checks that none is
// left once the sandbox or its ports are gone.
func SocketHelpers() []int {
	var found []int
	var walk func(pid string)
	walk = func(pid string) {
		tasks, _ := filepath.Glob("/proc/" + pid + "/task/*/children")
		for _, f := range tasks {
			b, _ := os.ReadFile(f)
			for _, c := range strings.Fields(string(b)) {
				env, _ := os.ReadFile("/proc/" + c + "/environ")
				for _, kv := range strings.Split(string(env), "\x00") {
					if strings.HasPrefix(kv, socketHelperEnv) {
						n, _ := strconv.Atoi(c)
						found = append(found, n)
						break
					}
				}
				walk(c)
			}
		}
	}
	walk(strconv.Itoa(os.Getpid()))
	return found
}
