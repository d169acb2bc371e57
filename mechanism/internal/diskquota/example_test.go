package diskquota_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/diskquota"
)

// A mechanism bounds a sandbox's home at Provision, records the Quota in
// its state, mounts it again at Start (Ensure) and releases it at Destroy.
func Example() {
	state, _ := os.MkdirTemp("", "diskquota-example-")
	defer os.RemoveAll(state)
	home := filepath.Join(state, "home")
	_ = os.Mkdir(home, 0o755)
	s := diskquota.Probe(state, false) // the workload is not in a user namespace of its own
	if !s.Available() {
		fmt.Println("no home quota here:", s.Detail != "")
		return
	}
	q, err := diskquota.Apply(context.Background(), home, 64<<20, diskquota.Options{Image: filepath.Join(state, "home.img"), UID: 1000, GID: 1000})
	if err != nil {
		log.Fatal(err)
	}
	defer q.Release(home) // unmounts, removes the image
	_ = q.Ensure(home)    // at each start: nothing to do while mounted
	fmt.Println(q.Method != "", q.Bytes)
}

// A limit too small for a file system is Invalid.
func ExampleApply_invalid() {
	_, err := diskquota.Apply(context.Background(), os.TempDir(), 4096, diskquota.Options{})
	fmt.Println(errors.Is(err, mechanism.ErrInvalid))
	// Output: true
}
