package diskquota

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Homes made from one template are file systems of their own: each holds
// its limit, owned by its own uid, without what another wrote; the
// template is made once and stays in the directory, within bounds.
func TestLoopFromTemplate(t *testing.T) {
	needLoop(t)
	dir, tpls := t.TempDir(), filepath.Join(t.TempDir(), "templates")
	const limit = 8 << 20
	var homes []string
	for i, uid := range []int{1000, 1001} {
		sub := filepath.Join(dir, fmt.Sprint(i))
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		home, image := newHome(t, sub), filepath.Join(sub, "home.img")
		q, err := Apply(context.Background(), home, limit, Options{Method: Loop, Image: image, UID: uid, GID: uid, Templates: tpls})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = q.Release(home) })
		var st unix.Stat_t
		if err := unix.Stat(home, &st); err != nil || st.Uid != uint32(uid) {
			t.Errorf("home root owned by %d (%v), want %d", st.Uid, err, uid)
		}
		homes = append(homes, home)
	}
	if out, err := fill(filepath.Join(homes[0], "a"), 1024, 1000); err != nil {
		t.Fatalf("write: %v: %s", err, out)
	}
	if _, err := os.Stat(filepath.Join(homes[1], "a")); !os.IsNotExist(err) {
		t.Fatalf("a file written in one home is in the other: %v", err)
	}
	out, err := fill(filepath.Join(homes[1], "big"), 16<<10, 1001)
	if err == nil || !strings.Contains(out, "No space left") {
		t.Fatalf("a 16 MiB write under an 8 MiB limit: %v: %s", err, out)
	}
	ents, err := os.ReadDir(tpls)
	if err != nil || len(ents) != 1 {
		t.Fatalf("templates %v (%v), want one", ents, err)
	}
	// More sizes than maxTemplates keep maxTemplates, the newest.
	for i := range maxTemplates + 2 {
		size := int64(MinBytes) << (i + 1)
		if _, err := template(context.Background(), tpls, size); err != nil {
			t.Fatal(err)
		}
	}
	ents, _ = os.ReadDir(tpls)
	if len(ents) != maxTemplates {
		t.Errorf("%d templates kept, want %d", len(ents), maxTemplates)
	}
	last := fmt.Sprintf("ext4-%s-%d.tpl", templateFormat, int64(MinBytes)<<(maxTemplates+2))
	if _, err := os.Stat(filepath.Join(tpls, last)); err != nil {
		t.Errorf("the last template made is gone: %v", err)
	}
}
