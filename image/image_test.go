package image_test

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/managoat/managoat/image"
	"github.com/managoat/managoat/image/imagetest"
	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/sandbox"
)

// newStore opens a store in a fresh directory; pulls go over a transport
// closed at the test's end.
func newStore(t *testing.T) (*image.Store, image.PullOptions) {
	t.Helper()
	s, err := image.Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return s, image.PullOptions{Transport: tr}
}

var base = imagetest.Layer{
	{Name: "etc/", Type: tar.TypeDir},
	{Name: "etc/os-release", Body: "ID=test\n"},
	{Name: "a/", Type: tar.TypeDir},
	{Name: "a/keep", Body: "keep"},
	{Name: "a/gone", Body: "gone"},
	{Name: "b/", Type: tar.TypeDir},
	{Name: "b/x", Body: "x"},
	{Name: "b/sub/", Type: tar.TypeDir},
	{Name: "b/sub/y", Body: "y"},
	{Name: "replaced", Body: "file"},
	{Name: "suid", Mode: 0o4755, Body: "#!/bin/sh\n"},
	{Name: "abs", Type: tar.TypeSymlink, Linkname: "/etc/os-release"},
	{Name: "hard", Type: tar.TypeLink, Linkname: "a/keep"},
}

var top = imagetest.Layer{
	{Name: "a/.wh.gone"},
	{Name: "b/.wh..wh..opq"},
	{Name: "b/new", Body: "new"},
	{Name: "replaced/", Type: tar.TypeDir},
	{Name: "replaced/inside", Body: "dir now"},
	{Name: "c/d/e", Body: "deep, parents implied"},
}

// A multi-layer image with a whiteout and an opaque directory unpacks to
// the merged tree; its config is kept; a second pull downloads nothing.
func TestPullMergesLayers(t *testing.T) {
	reg := imagetest.Serve(t)
	cfg := v1.Config{Env: []string{"PATH=/bin", "A=1"}, WorkingDir: "/a", User: "app", Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"echo hi"}}
	ref := reg.Push(t, "merge:v1", cfg, base, top)
	s, opts := newStore(t)
	var mu sync.Mutex
	seen := map[string]image.Progress{}
	opts.Progress = func(p image.Progress) { mu.Lock(); seen[p.Layer] = p; mu.Unlock() }
	img, err := s.Pull(context.Background(), ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	r := img.Root
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(r, p))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	for p, want := range map[string]string{"a/keep": "keep", "b/new": "new", "replaced/inside": "dir now", "c/d/e": "deep, parents implied", "etc/os-release": "ID=test\n"} {
		if got := read(p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"a/gone", "b/x", "b/sub", "a/.wh.gone", "b/.wh..wh..opq"} {
		if _, err := os.Lstat(filepath.Join(r, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is there after the whiteout: %v", p, err)
		}
	}
	if l, err := os.Readlink(filepath.Join(r, "abs")); err != nil || l != "/etc/os-release" {
		t.Errorf("abs -> %q, %v", l, err)
	}
	var a, h syscall.Stat_t
	syscall.Stat(filepath.Join(r, "a/keep"), &a)
	syscall.Stat(filepath.Join(r, "hard"), &h)
	if a.Ino == 0 || a.Ino != h.Ino {
		t.Errorf("hard is not a hard link of a/keep (%d, %d)", a.Ino, h.Ino)
	}
	if st, err := os.Stat(filepath.Join(r, "a/keep")); err != nil || st.ModTime().Unix() != 1700000000 {
		t.Errorf("a/keep's modification time: %v %v", st.ModTime(), err)
	}
	if st, err := os.Stat(filepath.Join(r, "suid")); err != nil || st.Mode()&os.ModeSetuid == 0 {
		t.Errorf("suid lost its mode: %v %v", st.Mode(), err)
	}
	if img.Config.WorkingDir != "/a" || img.Config.User != "app" || strings.Join(img.Config.Command(nil), " ") != "/bin/sh -c echo hi" ||
		strings.Join(img.Config.Env, " ") != "PATH=/bin A=1" {
		t.Errorf("config %+v", img.Config)
	}
	if got := strings.Join(img.Config.Command([]string{"ls"}), " "); got != "/bin/sh -c ls" {
		t.Errorf("Command(ls) = %q", got)
	}
	if len(seen) != 2 {
		t.Errorf("progress for %d layers, want 2", len(seen))
	}
	for d, p := range seen {
		if p.Done != p.Total || p.Total == 0 {
			t.Errorf("layer %s: progress %+v", d, p)
		}
		if n := reg.BlobGETs(d); n != 1 {
			t.Errorf("layer %s fetched %d times", d, n)
		}
	}
	// Again: the manifest only.
	again, err := s.Pull(context.Background(), ref, opts)
	if err != nil || again.Root != img.Root {
		t.Fatalf("second pull: %v %v", again, err)
	}
	for d := range seen {
		if n := reg.BlobGETs(d); n != 1 {
			t.Errorf("layer %s fetched %d times after a second pull", d, n)
		}
	}
	got, err := s.Get(ref)
	if err != nil || got.Digest != img.Digest {
		t.Fatalf("Get: %v %v", got, err)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].Ref != ref || list[0].Size <= 0 {
		t.Fatalf("List: %+v %v", list, err)
	}
}

// Pulls of one image at once, from one store or from two sharing a
// directory (as two processes do), download each layer once.
func TestConcurrentPullsFetchEachLayerOnce(t *testing.T) {
	reg := imagetest.Serve(t)
	big := imagetest.Layer{{Name: "big", Body: strings.Repeat("0123456789abcdef", 1<<16)}}
	ref := reg.Push(t, "conc:v1", v1.Config{}, base, big, top)
	s, opts := newStore(t)
	s2, err := image.Open(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	imgs := make([]*image.Image, 6)
	errs := make([]error, 6)
	for i := range imgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := s
			if i%2 == 1 {
				st = s2
			}
			imgs[i], errs[i] = st.Pull(context.Background(), ref, opts)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
		if imgs[i].Root != imgs[0].Root {
			t.Errorf("pull %d unpacked to %s, not %s", i, imgs[i].Root, imgs[0].Root)
		}
	}
	for _, l := range imgs[0].Layers {
		if n := reg.BlobGETs(l); n != 1 {
			t.Errorf("layer %s fetched %d times", l, n)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(s.Dir(), "roots"))
	if len(ents) != 1 {
		t.Errorf("%d roots, want 1", len(ents))
	}
}

// An unknown repository or tag is not_found naming it; a registry that
// answers 401 is denied.
func TestBadReferences(t *testing.T) {
	reg := imagetest.Serve(t)
	reg.Push(t, "there:v1", v1.Config{}, base)
	s, opts := newStore(t)
	for _, ref := range []string{reg.Host + "/nothere:v1", reg.Host + "/there:v2"} {
		_, err := s.Pull(context.Background(), ref, opts)
		if !errors.Is(err, sandbox.ErrNotFound) || sandbox.Kind(err) != "not_found" || !strings.Contains(err.Error(), ref) {
			t.Errorf("%s: %v (%s)", ref, err, sandbox.Kind(err))
		}
		if _, err := s.Get(ref); !errors.Is(err, sandbox.ErrNotFound) || !strings.Contains(err.Error(), ref) {
			t.Errorf("Get %s: %v", ref, err)
		}
	}
	if _, err := s.Pull(context.Background(), "Not A Ref", opts); sandbox.Kind(err) != "invalid" {
		t.Errorf("bad reference: %v", err)
	}
	reg.Set(func(r *imagetest.Registry) { r.Status = http.StatusUnauthorized })
	_, err := s.Pull(context.Background(), reg.Host+"/there:v1", opts)
	if sandbox.Kind(err) != "denied" {
		t.Errorf("401: %v (%s)", err, sandbox.Kind(err))
	}
}

func storeEntries(t *testing.T, s *image.Store, sub string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(s.Dir(), sub))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// A layer whose bytes do not match its digest is refused and nothing of
// it stays; so is one whose uncompressed content does not match the
// config's diff_id.
func TestWrongDigestRefusedAndDeleted(t *testing.T) {
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "tampered:v1", v1.Config{}, base)
	reg.Set(func(r *imagetest.Registry) {
		r.Tamper = func(digest string, body []byte) []byte {
			if len(body) > 2 && body[0] == 0x1f && body[1] == 0x8b { // the gzip layer
				body = append([]byte{}, body...)
				body[len(body)/2] ^= 0xff
			}
			return body
		}
	})
	s, opts := newStore(t)
	_, err := s.Pull(context.Background(), ref, opts)
	var de *image.DigestError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "layer") {
		t.Fatalf("tampered layer: %v", err)
	}
	for _, sub := range []string{"blobs/sha256", "roots", "tmp"} {
		if e := storeEntries(t, s, sub); len(e) != 0 {
			t.Errorf("%s holds %v after a refused layer", sub, e)
		}
	}
	if _, err := s.Get(ref); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Get after the refusal: %v", err)
	}
	// A tampered config is refused the same way.
	reg.Set(func(r *imagetest.Registry) {
		r.Tamper = func(digest string, body []byte) []byte {
			if len(body) > 0 && body[0] == '{' {
				b := append([]byte{}, body...)
				b[len(b)-1] = ' ' // same length, other bytes
				return b
			}
			return body
		}
	})
	if _, err := s.Pull(context.Background(), ref, opts); !errors.As(err, &de) {
		t.Fatalf("tampered config: %v", err)
	}
	if e := storeEntries(t, s, "roots"); len(e) != 0 {
		t.Errorf("roots hold %v after a refused config", e)
	}
	// The same image served right pulls.
	reg.Set(func(r *imagetest.Registry) { r.Tamper = nil })
	if _, err := s.Pull(context.Background(), ref, opts); err != nil {
		t.Fatal(err)
	}
}

// A pull cut off in the middle of a layer leaves nothing a sandbox could
// use (Get says not found, no root, no blob, no partial file); the next
// pull starts clean and succeeds.
func TestInterruptedPullLeavesNoHalfLayer(t *testing.T) {
	reg := imagetest.Serve(t)
	big := imagetest.Layer{{Name: "big", Body: strings.Repeat("x", 4<<20)}} // gzip makes it small; 4 KiB cut is mid-layer
	ref := reg.Push(t, "cut:v1", v1.Config{}, big)
	reg.Set(func(r *imagetest.Registry) { r.Cut = 3000 })
	s, opts := newStore(t)
	if _, err := s.Pull(context.Background(), ref, opts); err == nil {
		t.Fatal("a pull cut short succeeded")
	}
	for _, sub := range []string{"blobs/sha256", "roots", "tmp"} {
		if e := storeEntries(t, s, sub); len(e) != 0 {
			t.Errorf("%s holds %v after a cut pull", sub, e)
		}
	}
	if _, err := s.Get(ref); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Get after the cut: %v", err)
	}
	// A pull whose context ends mid-way leaves nothing either.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	reg.Set(func(r *imagetest.Registry) { r.Cut = 0 })
	if _, err := s.Pull(ctx, ref, opts); err == nil {
		t.Fatal("a cancelled pull succeeded")
	}
	img, err := s.Pull(context.Background(), ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(img.Root, "big")); err != nil || len(b) != 4<<20 {
		t.Fatalf("big: %d bytes, %v", len(b), err)
	}
}

// Remove refuses an image a sandbox uses, and removes it once released;
// Prune removes what no reference names and what cut pulls left.
func TestRemoveAndPrune(t *testing.T) {
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "rm:v1", v1.Config{}, base)
	ref2 := reg.Push(t, "rm:v2", v1.Config{}, base, top)
	s, opts := newStore(t)
	img, err := s.Pull(context.Background(), ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(context.Background(), ref2, opts); err != nil {
		t.Fatal(err)
	}
	if err := s.Use(img, "sb1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(context.Background(), ref); sandbox.Kind(err) != "invalid" || !strings.Contains(err.Error(), "sb1") {
		t.Fatalf("Remove of an image in use: %v", err)
	}
	s.Release("sb1")
	if err := s.Remove(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img.Root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("root still there: %v", err)
	}
	if err := s.Remove(context.Background(), ref); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("second Remove: %v", err)
	}
	os.Mkdir(filepath.Join(s.Dir(), "tmp", "root-leftover"), 0o755)
	res, err := s.Prune(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// base's blob is shared with rm:v2 and stays; nothing else is unused
	// but the leftover and rm:v1's manifest and config.
	if res.Partial != 1 || res.Roots != 0 || res.Blobs != 2 {
		t.Fatalf("prune: %+v", res)
	}
	if err := s.Remove(context.Background(), ref2); err != nil {
		t.Fatal(err)
	}
	if res, err = s.Prune(context.Background()); err != nil || res.Blobs != 4 { // two layers, a manifest, a config
		t.Fatalf("prune after removing all: %+v %v", res, err)
	}
	if e := storeEntries(t, s, "blobs/sha256"); len(e) != 0 {
		t.Fatalf("blobs left: %v", e)
	}
}

func TestResolveUser(t *testing.T) {
	root := t.TempDir()
	os.Mkdir(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\napp:x:1234:1300::/home/app:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nstaff:x:50:\n"), 0o644)
	for in, want := range map[string][2]int{"": {0, 0}, "root": {0, 0}, "app": {1234, 1300}, "1234": {1234, 1300}, "app:staff": {1234, 50}, "77": {77, 77}, "77:88": {77, 88}} {
		u, g, err := image.ResolveUser(root, in)
		if err != nil || u != want[0] || g != want[1] {
			t.Errorf("ResolveUser(%q) = %d:%d %v, want %v", in, u, g, err, want)
		}
	}
	for _, bad := range []string{"nobody", "app:nogroup"} {
		if _, _, err := image.ResolveUser(root, bad); sandbox.Kind(err) != "invalid" {
			t.Errorf("ResolveUser(%q): %v", bad, err)
		}
	}
}

// Commit makes a new image of a base and a directory: its root holds
// both, its symlinks are kept as links (never followed out of the
// directory), Get finds it by its ref, and Prune keeps its layers.
func TestCommit(t *testing.T) {
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "base:v1", v1.Config{Cmd: []string{"sh"}}, base, top)
	s, opts := newStore(t)
	b, err := s.Pull(context.Background(), ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, ".local/bin"), 0o755)
	os.WriteFile(filepath.Join(home, ".local/bin/tool"), []byte("#!/bin/sh\n"), 0o755)
	os.Symlink("/etc/shadow", filepath.Join(home, "shadow"))
	img, err := s.Commit(context.Background(), b, []image.CommitDir{{Src: home, Path: "/home/sprite"}}, "local/made:v1")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(img.Root, "home/sprite/.local/bin/tool")); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("tool: %v %v", st, err)
	}
	if l, err := os.Readlink(filepath.Join(img.Root, "home/sprite/shadow")); err != nil || l != "/etc/shadow" {
		t.Fatalf("shadow -> %q %v", l, err)
	}
	if got := read(t, filepath.Join(img.Root, "b/new")); got != "new" {
		t.Fatalf("base content: %q", got)
	}
	if got, err := s.Get("local/made:v1"); err != nil || got.Digest != img.Digest || got.Config.Cmd[0] != "sh" {
		t.Fatalf("Get: %+v %v", got, err)
	}
	if res, err := s.Prune(context.Background()); err != nil || res.Blobs != 0 || res.Roots != 0 {
		t.Fatalf("prune: %+v %v", res, err)
	}
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, _ := os.ReadFile(p)
	return string(b)
}

// A private registry's credentials come from the usual docker config
// ($DOCKER_CONFIG/config.json); wrong ones are denied.
func TestPrivateRegistryCredentials(t *testing.T) {
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "private:v1", v1.Config{}, base)
	reg.Set(func(r *imagetest.Registry) { r.BasicAuth = "agent:s3cret" })
	cfg := t.TempDir()
	t.Setenv("DOCKER_CONFIG", cfg)
	write := func(auth string) {
		b := `{"auths":{"` + reg.Host + `":{"auth":"` + base64.StdEncoding.EncodeToString([]byte(auth)) + `"}}}`
		if err := os.WriteFile(filepath.Join(cfg, "config.json"), []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, opts := newStore(t)
	write("agent:wrong")
	if _, err := s.Pull(context.Background(), ref, opts); sandbox.Kind(err) != "denied" {
		t.Fatalf("wrong credentials: %v (%s)", err, sandbox.Kind(err))
	}
	write("agent:s3cret")
	if _, err := s.Pull(context.Background(), ref, opts); err != nil {
		t.Fatalf("right credentials: %v", err)
	}
}

// A Prune during a pull leaves the pull's layers alone: here the pull
// found base's blob already in the store (kept by no root since rm:v1 was
// removed) and is held right after, before unpacking it.
func TestPruneDuringPull(t *testing.T) {
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "pp:v1", v1.Config{}, base)
	ref2 := reg.Push(t, "pp:v2", v1.Config{}, base, top)
	s, opts := newStore(t)
	if _, err := s.Pull(context.Background(), ref, opts); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	held, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	opts.Progress = func(p image.Progress) {
		if p.Cached {
			once.Do(func() { close(held); <-proceed })
		}
	}
	pulled := make(chan error, 1)
	go func() {
		_, err := s.Pull(context.Background(), ref2, opts)
		pulled <- err
	}()
	<-held
	pruned := make(chan error, 1)
	go func() {
		_, err := s.Prune(context.Background())
		pruned <- err
	}()
	select {
	case err := <-pruned: // it did not wait for the pull
		t.Errorf("Prune returned (%v) while a pull was midway", err)
	case <-time.After(300 * time.Millisecond): // time for an unguarded Prune to remove the blob
	}
	close(proceed)
	if err := <-pulled; err != nil {
		t.Fatalf("the pull a Prune ran during: %v", err)
	}
	if err := <-pruned; err != nil {
		t.Fatal(err)
	}
	img, err := s.Get(ref2)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range img.Layers {
		if _, err := os.Stat(filepath.Join(s.Dir(), "blobs", "sha256", strings.TrimPrefix(l, "sha256:"))); err != nil {
			t.Errorf("layer %s of the pulled image: %v", l, err)
		}
	}
}

// A commit of a sandbox mapped to a range of host ids of its own writes
// the ids it saw: base+1000 as 1000, and a host id outside its range as
// nobody (65534), so the image carries no host's range.
func TestCommitWritesTheSandboxsIDs(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "ids:v1", v1.Config{}, base)
	s, opts := newStore(t)
	b, err := s.Pull(context.Background(), ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	const idBase = 0x70010000
	home := t.TempDir()
	mine, hosts := filepath.Join(home, "mine"), filepath.Join(home, "hosts")
	for _, f := range []string{mine, hosts} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Lchown(mine, idBase+1000, idBase+1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(hosts, 0, 0); err != nil {
		t.Fatal(err)
	}
	img, err := s.Commit(context.Background(), b, []image.CommitDir{{Src: home, Path: "/home/sprite", IDBase: idBase, IDSize: 65536}}, "local/ids:v1")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint32{"mine": 1000, "hosts": 65534} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(img.Root, "home/sprite", name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != want || st.Gid != want {
			t.Errorf("%s in the committed image: %d:%d, want %d:%d", name, st.Uid, st.Gid, want, want)
		}
	}
}
