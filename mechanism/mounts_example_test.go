package mechanism_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/managoat/managoat/mechanism"
)

// ExampleResolveMounts: a Spec's mounts are checked by Validate (no
// file touched) and their sources resolved once, at Provision, by
// ResolveMounts: a symbolic link in a source is followed then, and never
// again.
func ExampleResolveMounts() {
	dir, _ := os.MkdirTemp("", "mounts-example-")
	defer os.RemoveAll(dir)
	os.Mkdir(filepath.Join(dir, "project"), 0o755)
	os.Symlink("project", filepath.Join(dir, "current"))

	spec := mechanism.Spec{Mounts: []mechanism.Mount{{Source: filepath.Join(dir, "current"), Target: "/data", ReadOnly: true}}}
	fmt.Println(spec.Validate())
	ms, err := mechanism.ResolveMounts(spec.Mounts)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(filepath.Base(ms[0].Source), ms[0].Target, ms[0].ReadOnly)

	spec.Mounts[0].Target = "/proc/self"
	fmt.Println(spec.Validate())
	// Output:
	// <nil>
	// project /data true
	// mechanism: invalid Mounts: target /proc/self is in /proc, which the mechanism builds
}
