package cgroups

import (
	"os"
	"reflect"
	"testing"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"/sys/fs/cgroup":          "/sys/fs/cgroup",
		`/mnt/a\040b`:             "/mnt/a b",
		`/x\011y\012z\134w`:       "/x\ty\nz\\w",
		`/end\040`:                "/end ",
		`/short\04`:               `/short\04`,
		`/not\999octal`:           `/not\999octal`,
		`\134\134`:                `\\`,
		`/trailing\`:              `/trailing\`,
		`/mixed\040and\134\040ok`: `/mixed and\ ok`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestStandardLayoutMatchesMountinfo: where the hierarchies are at their
// conventional mount points, both ways of finding them agree.
func TestStandardLayoutMatchesMountinfo(t *testing.T) {
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skip("no /proc/self/cgroup:", err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	own := ownCgroups(cg)
	std, ok := standardLayout(stdRoot, own, wanted)
	if !ok {
		t.Skip("this host's hierarchies are not at their conventional mount points")
	}
	if got := mountinfoLayout(mi, own, wanted); !reflect.DeepEqual(std, got) {
		t.Fatalf("standard %+v, mountinfo %+v", std, got)
	}
	// A hierarchy somewhere else sends the caller to mountinfo.
	if _, ok := standardLayout(t.TempDir(), own, wanted); ok && len(own) > 0 {
		t.Fatal("found hierarchies under an empty directory")
	}
}
