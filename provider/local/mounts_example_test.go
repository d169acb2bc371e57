package local_test

import (
	"context"
	"fmt"

	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

// Example_mounts binds a host directory read-write and another read-only
// into a jail sandbox (docker's -v). It needs root or user namespaces, so
// it is compiled, not run, here; provider/local's TestMountsKeptAcrossRestart
// runs the same.
func Example_mounts() {
	ctx := context.Background()
	p, err := local.New(local.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	h, err := p.Create(ctx, "build", sandbox.CreateOptions{Mounts: []sandbox.Mount{
		{Source: "/srv/src", Target: "/home/sprite/src"},
		{Source: "/srv/datasets", Target: "/data", ReadOnly: true},
	}})
	if err != nil {
		fmt.Println(err) // Invalid{mounts}: a source missing, a target the jail builds (/proc, the home)
		return
	}
	defer p.Destroy(ctx, h)
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "ls /data && make -C src"}}, sandbox.ExecOptions{})
	fmt.Println(res.ExitCode, err)
}
