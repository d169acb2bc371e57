package imagetest

import (
	"archive/tar"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

// HostFiles is a layer holding the host's programs at paths (their own
// paths) with the shared libraries ldd lists for them, and every symlink
// on the way to each (a merged-/usr /lib, the loader's link), so the
// programs run in an image made of it. Tests use it to put bash and a
// glibc program in an image beside busybox.
func HostFiles(t testing.TB, paths ...string) Layer {
	t.Helper()
	var l Layer
	seen := map[string]bool{}    // paths added
	emitted := map[string]bool{} // entries written
	var add func(p string, depth int)
	add = func(p string, depth int) {
		if depth > 16 || seen[p] {
			return
		}
		seen[p] = true
		// Each directory on the way that is a link on the host is the
		// same link in the layer.
		parts := strings.Split(strings.Trim(p, "/"), "/")
		cur := ""
		for i, el := range parts {
			cur += "/" + el
			st, err := os.Lstat(cur)
			if err != nil {
				t.Fatalf("host file %s: %v", p, err)
			}
			if st.Mode()&os.ModeSymlink != 0 {
				target, _ := os.Readlink(cur)
				if !emitted[cur] {
					emitted[cur] = true
					l = append(l, Entry{Name: strings.TrimPrefix(cur, "/"), Type: tar.TypeSymlink, Linkname: target})
				}
				abs := target
				if !filepath.IsAbs(abs) {
					abs = filepath.Join(filepath.Dir(cur), target)
				}
				add(filepath.Join(append([]string{abs}, parts[i+1:]...)...), depth+1)
				return
			}
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("host file %s: %v", p, err)
		}
		st, _ := os.Stat(p)
		if emitted[p] {
			return
		}
		emitted[p] = true
		l = append(l, Entry{Name: strings.TrimPrefix(p, "/"), Mode: int64(st.Mode().Perm()), Body: string(b)})
	}
	for _, p := range paths {
		_, err := os.Stat(p)
		testenv.Require(t, err == nil, "needs "+p+" on the host")
		add(p, 0)
		out, err := exec.Command("ldd", p).Output()
		if err != nil {
			continue // static
		}
		for _, line := range strings.Split(string(out), "\n") {
			for _, f := range strings.Fields(line) {
				if strings.HasPrefix(f, "/") {
					add(f, 0)
				}
			}
		}
	}
	return l
}

// HostTree is a layer holding the host's directory dir (regular files,
// directories and symlinks, at their own paths): a program's data, such
// as python's encodings package.
func HostTree(t testing.TB, dir string) Layer {
	t.Helper()
	var l Layer
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(p, "/")
		switch {
		case d.IsDir():
			l = append(l, Entry{Name: name + "/", Type: tar.TypeDir})
		case d.Type()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			l = append(l, Entry{Name: name, Type: tar.TypeSymlink, Linkname: target})
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			l = append(l, Entry{Name: name, Mode: 0o644, Body: string(b)})
		}
		return nil
	})
	testenv.Require(t, err == nil, "needs "+dir+" on the host")
	return l
}

// Conformance are the layers of an image the breach conformance
// (mechanism/mechanismtest) runs on: busybox, the host's bash, id, date,
// setsid and python3 with their libraries and python's encodings, and sh
// being bash (busybox's sh and setsid run busybox's own applets before
// PATH, and its date has no %N, which the freeze check stamps with).
func Conformance(t testing.TB) []Layer {
	t.Helper()
	return []Layer{
		Busybox(t),
		HostFiles(t, "/usr/bin/bash", "/usr/bin/id", "/usr/bin/date", "/usr/bin/setsid", "/usr/bin/python3"),
		HostTree(t, "/usr/lib/python3.11/encodings"),
		{{Name: "bin/sh", Type: tar.TypeSymlink, Linkname: "/usr/bin/bash"}},
	}
}
