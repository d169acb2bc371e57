package mechanismtest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
)

// checkHostMounts: a mechanism that claims host_mounts binds a host
// directory read-write and another read-only (Spec.Mounts). Seen: the
// sandbox reads both and writes the read-write one through to the host;
// no write reaches the read-only one's source, before or after the
// workload tries to remount it read-write or unmount it (its files are
// writable by anyone on the host, so only the mount can refuse); a
// symbolic link in a source that points out of it does not read the host
// file it names.
func checkHostMounts(t *testing.T, k *kit, m mechanism.Mechanism) {
	k.claims(t, m, mechanism.HostMounts)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	token := fmt.Sprintf("MOUNTED-%d", time.Now().UnixNano())
	secret := fmt.Sprintf("BESIDE-%d", time.Now().UnixNano())
	rw, ro := filepath.Join(dir, "rw"), filepath.Join(dir, "ro")
	for _, d := range []string{rw, ro} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o777)
		if err := os.WriteFile(filepath.Join(d, "f"), []byte(token+"\n"), 0o666); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(d, "f"), 0o666)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink("../secret", filepath.Join(ro, "up"))
	os.Symlink(filepath.Join(dir, "secret"), filepath.Join(ro, "abs"))
	roT := mechanism.Home + "/mt-ro"
	id := k.sandbox(t, m, "mounts", mechanism.Spec{Mounts: []mechanism.Mount{
		{Source: rw, Target: "/mnt/mt-rw"},
		{Source: ro, Target: roT, ReadOnly: true},
	}})
	c := mustSh(t, m, id, "cat /mnt/mt-rw/f "+roT+"/f && echo w > /mnt/mt-rw/new")
	if c.ExitStatus != 0 || string(c.Stdout) != token+"\n"+token+"\n" {
		t.Fatalf("the mounts are not there: exit %d %q %q", c.ExitStatus, c.Stdout, c.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(rw, "new")); err != nil || string(b) != "w\n" {
		t.Errorf("a write to the read-write mount did not reach the host: %q %v", b, err)
	}
	c = mustSh(t, m, id, "echo x > "+roT+"/f; touch "+roT+"/new; "+
		"mount -o remount,rw "+roT+"; mount -o remount,bind,rw "+roT+"; umount "+roT+"; umount -l "+roT+"; "+
		"echo y > "+roT+"/f; touch "+roT+"/new2; cat "+roT+"/up "+roT+"/abs 2>&1; true")
	if b, _ := os.ReadFile(filepath.Join(ro, "f")); string(b) != token+"\n" {
		t.Errorf("BREACHED: a write reached the read-only mount's source: %q", b)
	}
	for _, n := range []string{"new", "new2"} {
		if _, err := os.Stat(filepath.Join(ro, n)); err == nil {
			t.Errorf("BREACHED: a file was made in the read-only mount's source: %s", n)
		}
	}
	if bytes.Contains(c.Stdout, []byte(secret)) {
		t.Errorf("BREACHED: a link in a mount read the host's file beside the source: %q", c.Stdout)
	}
}
