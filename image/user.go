package image

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/managoat/managoat/sandbox"
)

func goarch() string { return runtime.GOARCH }

// ResolveUser turns an image config's User ("name", "uid", "name:group",
// "uid:gid", or empty for root) into numeric ids, reading names from the
// image's own /etc/passwd and /etc/group under root (never the host's).
// A uid without a group takes the passwd entry's group, else the uid's
// own number.
func ResolveUser(root, user string) (uid, gid int, err error) {
	if user == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	uid, gid = -1, -1
	if n, err := strconv.Atoi(u); err == nil && n >= 0 {
		uid = n
	}
	for _, f := range readDB(filepath.Join(root, "etc", "passwd")) {
		if len(f) < 4 {
			continue
		}
		if (uid < 0 && f[0] == u) || (uid >= 0 && f[2] == strconv.Itoa(uid)) {
			uid, _ = strconv.Atoi(f[2])
			if !hasGroup {
				gid, _ = strconv.Atoi(f[3])
			}
			break
		}
	}
	if uid < 0 {
		return 0, 0, sandbox.Invalid("image_user", fmt.Sprintf("user %q is not in the image's /etc/passwd", u))
	}
	if hasGroup {
		if n, err := strconv.Atoi(g); err == nil && n >= 0 {
			gid = n
		} else {
			for _, f := range readDB(filepath.Join(root, "etc", "group")) {
				if len(f) >= 3 && f[0] == g {
					gid, _ = strconv.Atoi(f[2])
				}
			}
			if gid < 0 {
				return 0, 0, sandbox.Invalid("image_user", fmt.Sprintf("group %q is not in the image's /etc/group", g))
			}
		}
	}
	if gid < 0 {
		gid = uid
	}
	return uid, gid, nil
}

// readDB reads a colon-separated database. The file is opened without
// following a final symlink out: a link in an image is read as the
// image's own file or not at all.
func readDB(p string) [][]string {
	root, err := os.OpenRoot(filepath.Dir(filepath.Dir(p)))
	if err != nil {
		return nil
	}
	defer root.Close()
	f, err := root.Open(filepath.Join("etc", filepath.Base(p)))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out
}

func hashOf(digest string) (v1.Hash, error) {
	h, err := v1.NewHash(digest)
	if err != nil {
		return h, sandbox.Invalid("digest", err.Error())
	}
	return h, nil
}
