package jail_test

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/image/imagetest"
	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
)

// probeEnv makes this test binary, re-executed as another host uid
// (hostProbe), try to signal and ptrace a pid and print what it got.
const probeEnv = "MANAGOAT_USERNS_TEST_PROBE"

func init() {
	v := os.Getenv(probeEnv)
	if v == "" {
		return
	}
	pid, _ := strconv.Atoi(v)
	res := func(err error) string {
		if err == nil {
			return "ok"
		}
		return err.Error()
	}
	runtime.LockOSThread()
	fmt.Printf("kill:%s\n", res(unix.Kill(pid, 0)))
	// PTRACE_SEIZE stops nothing; the tracee is let go when this
	// process exits.
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, 0, 0, 0)
	var perr error
	if e != 0 {
		perr = e
	}
	fmt.Printf("ptrace:%s\n", res(perr))
	os.Exit(0)
}

// hostProbe runs, as host uid:gid, a signal (0) and a ptrace attach of
// pid, and returns their outcomes ("ok" or the error).
func hostProbe(t *testing.T, uid int, pid int) (kill, ptrace string) {
	t.Helper()
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{probeEnv + "=" + strconv.Itoa(pid)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("probe as uid %d: %v: %s", uid, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "kill:"); ok {
			kill = v
		}
		if v, ok := strings.CutPrefix(l, "ptrace:"); ok {
			ptrace = v
		}
	}
	return kill, ptrace
}

// hostPidOf finds the host pid of the process whose command line is argv
// (a unique tag).
func hostPidOf(t *testing.T, argv string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ") == argv {
				return pid
			}
		}
	}
	t.Fatalf("no host process %q", argv)
	return 0
}

// statusIDs returns the Uid and Gid lines of /proc/pid/status (real,
// effective, saved, fs).
func statusIDs(t *testing.T, pid int) (uids, gids []int) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		var dst *[]int
		switch k {
		case "Uid":
			dst = &uids
		case "Gid":
			dst = &gids
		default:
			continue
		}
		for _, s := range strings.Fields(v) {
			n, _ := strconv.Atoi(s)
			*dst = append(*dst, n)
		}
	}
	return uids, gids
}

// background starts `sleep tag` in sandbox id, detached, and returns its
// host pid (killed at the test's end with the sandbox).
func background(t *testing.T, j *jail.Jail, id string) (tag string, pid int) {
	t.Helper()
	tag = fmt.Sprintf("3599.%d", time.Now().UnixNano()%1000000)
	run(t, j, id, "setsid sleep "+tag+" </dev/null >/dev/null 2>&1 &")
	return tag, hostPidOf(t, "sleep "+tag)
}

// As root, each sandbox runs in a user namespace of its own: the
// workload is uid 1000 inside and base+1000 on the host, so a host
// process of uid 1000 can neither signal nor ptrace it; its home is owned
// by the mapped uid. A sandbox with no range (IDMapDir "-", as before
// ranges existed) shows what the mapping prevents: there uid 1000 of the
// host can signal the workload.
func TestUsernsHostUID(t *testing.T) {
	testenv.RequireRoot(t)
	for _, mode := range jail.InitModes() {
		t.Run(mode, func(t *testing.T) {
			t.Setenv(jail.InitEnv, mode)
			usernsHostUID(t)
		})
	}
}

func usernsHostUID(t *testing.T) {
	j := newJail(t)
	started(t, j, "mapped", mechanism.Spec{})
	base, size, err := j.IDRange("mapped")
	if err != nil || base == 0 || size != 65536 {
		t.Fatalf("IDRange = %d, %d, %v; want a range of 65536", base, size, err)
	}
	c := run(t, j, "mapped", "id -u; id -g; cat /proc/self/uid_map /proc/self/gid_map")
	want := fmt.Sprintf("1000\n1000\n%10d %10d %10d\n%10d %10d %10d\n", 0, base, 65536, 0, base, 65536)
	if string(c.Stdout) != want {
		t.Fatalf("inside: %q (stderr %q), want %q", c.Stdout, c.Stderr, want)
	}
	_, pid := background(t, j, "mapped")
	uids, gids := statusIDs(t, pid)
	for i := range uids {
		if uids[i] != base+1000 || gids[i] != base+1000 {
			t.Fatalf("the workload's host ids: Uid %v Gid %v, want %d", uids, gids, base+1000)
		}
	}
	if u, _ := hostUsers(); u[base+1000] {
		t.Fatalf("host uid %d is a user of the host's /etc/passwd", base+1000)
	}
	home, _ := j.HostPath("mapped", mechanism.Home)
	var st unix.Stat_t
	if err := unix.Stat(home, &st); err != nil || int(st.Uid) != base+1000 || int(st.Gid) != base+1000 {
		t.Fatalf("home %s owned by %d:%d (%v), want %d", home, st.Uid, st.Gid, err, base+1000)
	}
	if uid, gid := j.OwnerOf("mapped"); uid != base+1000 || gid != base+1000 {
		t.Fatalf("OwnerOf = %d:%d", uid, gid)
	}
	kill, ptrace := hostProbe(t, 1000, pid)
	if kill == "ok" || ptrace == "ok" {
		t.Fatalf("host uid 1000 reached the workload: kill %s, ptrace %s", kill, ptrace)
	}
	t.Logf("host uid 1000 against the mapped workload (host uid %d): kill %s, ptrace %s", base+1000, kill, ptrace)

	// The same without a range: the workload is host uid 1000.
	legacy, err := jail.New(jail.Config{StateDir: t.TempDir(), IDMapDir: "-"})
	if err != nil {
		t.Fatal(err)
	}
	started(t, legacy, "legacy", mechanism.Spec{})
	if b, _, _ := legacy.IDRange("legacy"); b != 0 {
		t.Fatalf("IDMapDir \"-\" gave a range at %d", b)
	}
	_, lpid := background(t, legacy, "legacy")
	if uids, _ := statusIDs(t, lpid); uids[0] != 1000 {
		t.Fatalf("legacy workload's host uid %v", uids)
	}
	if kill, ptrace := hostProbe(t, 1000, lpid); kill != "ok" || ptrace != "ok" {
		t.Fatalf("control: host uid 1000 could not reach the unmapped workload: kill %s, ptrace %s", kill, ptrace)
	}
}

// hostUsers are the uids of the host's /etc/passwd.
func hostUsers() (map[int]bool, error) {
	b, err := os.ReadFile("/etc/passwd")
	out := map[int]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Split(l, ":"); len(f) > 2 {
			if n, err := strconv.Atoi(f[2]); err == nil {
				out[n] = true
			}
		}
	}
	return out, err
}

// Two sandboxes, of one jail or of two jails with different state
// directories, get disjoint ranges; a restart and an adoption by another
// Jail keep a sandbox's range; Destroy releases its claim, and a
// sandbox provisioned before ranges existed keeps running unmapped.
func TestUsernsRanges(t *testing.T) {
	j := newJail(t)
	other, err := jail.New(jail.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	started(t, j, "a", mechanism.Spec{})
	started(t, j, "b", mechanism.Spec{})
	started(t, other, "a", mechanism.Spec{})
	ba, _, _ := j.IDRange("a")
	bb, _, _ := j.IDRange("b")
	bo, _, _ := other.IDRange("a")
	bases := []int{ba, bb, bo}
	for i := range bases {
		for k := range i {
			if d := bases[i] - bases[k]; bases[i] == 0 || (d < 65536 && d > -65536) {
				t.Fatalf("ranges overlap: %v", bases)
			}
		}
	}
	claim := filepath.Join(jail.DefaultIDMapDir, strconv.Itoa(ba))
	if b, err := os.ReadFile(claim); err != nil || !strings.HasSuffix(string(b), "/a") {
		t.Fatalf("claim %s: %q, %v", claim, b, err)
	}
	ctx := context.Background()
	if err := j.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	again, err := jail.New(jail.Config{StateDir: filepath.Dir(filepath.Dir(claimOwner(t, claim)))})
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Start(ctx, "a"); err != nil { // adopts the running sandbox
		t.Fatal(err)
	}
	if b, _, _ := again.IDRange("a"); b != ba {
		t.Fatalf("after a restart and an adoption: range %d, was %d", b, ba)
	}
	if c := run(t, again, "a", "cat /proc/self/uid_map"); !strings.Contains(string(c.Stdout), strconv.Itoa(ba)) {
		t.Fatalf("uid_map after the restart: %q", c.Stdout)
	}
	if err := j.Destroy(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(claim); !os.IsNotExist(err) {
		t.Fatalf("claim %s after Destroy: %v", claim, err)
	}

	// Provisioned unmapped (as before ranges existed), started by a Jail
	// that maps: it runs as before.
	dir := t.TempDir()
	old, err := jail.New(jail.Config{StateDir: dir, IDMapDir: "-"})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Provision(ctx, "old", mechanism.Spec{}); err != nil {
		t.Fatal(err)
	}
	now, err := jail.New(jail.Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	started(t, now, "old", mechanism.Spec{})
	if c := run(t, now, "old", "id -u; cat /proc/self/uid_map; echo x > $HOME/f && echo WROTE"); !strings.HasPrefix(string(c.Stdout), "1000\n         0          0 4294967295\nWROTE") {
		t.Fatalf("an unmapped sandbox: %q %q", c.Stdout, c.Stderr)
	}
}

func claimOwner(t *testing.T, claim string) string {
	t.Helper()
	b, err := os.ReadFile(claim)
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "/x"
}

// treeSum is a digest of every entry under dir: path, type, mode,
// owner, size and content.
func treeSum(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %o %d:%d %d\n", strings.TrimPrefix(p, dir), st.Mode, st.Uid, st.Gid, st.Size)
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// buildDeb builds a tiny package with dpkg-deb on the host: it installs
// /usr/bin/mg-hello.
func buildDeb(t *testing.T) string {
	t.Helper()
	_, err := exec.LookPath("dpkg-deb")
	testenv.Require(t, err == nil, "needs dpkg-deb (Debian package dpkg)")
	dir := t.TempDir()
	pkg := filepath.Join(dir, "pkg")
	for _, d := range []string{"DEBIAN", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(pkg, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(pkg, "DEBIAN/control"), []byte("Package: mg-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: test <t@example.invalid>\nDescription: a test package\n"), 0o644)
	os.WriteFile(filepath.Join(pkg, "usr/bin/mg-hello"), []byte("#!/bin/sh\necho hello-from-the-package\n"), 0o755)
	deb := filepath.Join(dir, "mg-hello.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v: %s", err, out)
	}
	return deb
}

// On an image whose user is root, with a range of its own, the workload
// is root of its user namespace: the image's files are root's inside
// (an idmapped layer), it writes /usr/bin and /etc and installs a
// package with dpkg into its own layer; another sandbox on the image sees
// none of it and the image's directory is unchanged. Root there is not
// the host's: it cannot mount, load a module, read the host's root-only
// files in its home or its state directory, or kill a host process.
func TestImageRootInUserns(t *testing.T) {
	j := newJail(t)
	dir := t.TempDir()
	applets := imagetest.Layer{
		{Name: "var/", Type: tar.TypeDir}, {Name: "var/lib/", Type: tar.TypeDir}, {Name: "var/lib/dpkg/", Type: tar.TypeDir},
		{Name: "var/lib/dpkg/info/", Type: tar.TypeDir}, {Name: "var/lib/dpkg/status", Body: ""},
		{Name: "usr/", Type: tar.TypeDir}, {Name: "usr/bin/", Type: tar.TypeDir}, {Name: "mnt/", Type: tar.TypeDir},
	}
	for _, a := range []string{"dpkg", "insmod", "chown", "umount"} {
		applets = append(applets, imagetest.Entry{Name: "bin/" + a, Type: tar.TypeSymlink, Linkname: "busybox"})
	}
	img := pullTestImage(t, dir, v1.Config{}, applets)
	before := treeSum(t, img.Root)
	spec := imageSpec(t, img)
	started(t, j, "root-a", spec)
	started(t, j, "root-b", spec)
	base, _, _ := j.IDRange("root-a")
	if base == 0 {
		t.Fatal("no range")
	}
	c := run(t, j, "root-a", "id -u; stat -c %u:%g /usr/bin /etc/passwd /; grep -E '^Cap(Eff|Bnd)' /proc/self/status")
	t.Logf("inside: %s", c.Stdout)
	if !strings.HasPrefix(string(c.Stdout), "0\n0:0\n0:0\n0:0\n") {
		t.Fatalf("root's view of the image: %q %q", c.Stdout, c.Stderr)
	}
	deb := buildDeb(t)
	home, _ := j.HostPath("root-a", mechanism.Home)
	b, _ := os.ReadFile(deb)
	uid, gid := j.OwnerOf("root-a")
	if uid != base || gid != base {
		t.Fatalf("OwnerOf = %d:%d, want %d", uid, gid, base)
	}
	if err := os.WriteFile(filepath.Join(home, "mg-hello.deb"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chown(filepath.Join(home, "mg-hello.deb"), uid, gid)
	c = run(t, j, "root-a", "echo x > /usr/bin/x && echo y > /etc/y && echo WROTE; dpkg -i $HOME/mg-hello.deb && mg-hello && grep -c mg-hello /var/lib/dpkg/status")
	if o := string(c.Stdout); !strings.HasPrefix(o, "WROTE\n") || !strings.HasSuffix(o, "hello-from-the-package\n1\n") || c.ExitStatus != 0 {
		t.Fatalf("root's writes and dpkg -i: %q %q (exit %d)", c.Stdout, c.Stderr, c.ExitStatus)
	}
	// The upper layer took it, owned by the sandbox's root on the host.
	var st unix.Stat_t
	upper := filepath.Join(filepath.Dir(home), "upper")
	if err := unix.Stat(filepath.Join(upper, "usr/bin/mg-hello"), &st); err != nil || int(st.Uid) != base {
		t.Fatalf("upper layer's mg-hello: uid %d, %v; want %d", st.Uid, err, base)
	}
	c = run(t, j, "root-b", "ls /usr/bin/x /etc/y /usr/bin/mg-hello 2>&1; grep -c mg-hello /var/lib/dpkg/status; id -u")
	if strings.Contains(string(c.Stdout), "mg-hello\n") || !strings.HasSuffix(string(c.Stdout), "0\n0\n") {
		t.Fatalf("another sandbox on the image sees the first one's changes: %q", c.Stdout)
	}
	if after := treeSum(t, img.Root); after != before {
		t.Fatal("the image's directory changed")
	}

	// Root of the namespace is not the host's.
	secret := fmt.Sprintf("HOST-ROOT-SECRET-%d", time.Now().UnixNano())
	if err := os.WriteFile(filepath.Join(home, "rootonly"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(home), "hostsecret"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	sentinel := exec.Command("sleep", fmt.Sprintf("3598.%d", time.Now().UnixNano()%100000))
	if err := sentinel.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sentinel.Process.Kill(); sentinel.Wait() }()
	os.WriteFile(filepath.Join(home, "bad.ko"), []byte("not a module"), 0o644)
	script := fmt.Sprintf(`cat $HOME/rootonly $HOME/../hostsecret /home/hostsecret 2>&1; echo
for l in $(grep -o 'lowerdir=[^,]*' /proc/self/mountinfo | cut -d= -f2) %s; do echo evil > $l/etc/evil 2>&1 && echo WROTE-LOWER:$l; done
chown 0:0 $HOME/rootonly 2>&1 && echo CHOWNED
find / -xdev -name hostsecret 2>/dev/null
mount -t tmpfs none /mnt 2>&1 && echo MOUNTED
mount --bind /usr /mnt 2>&1 && echo MOUNTED
umount /proc 2>&1 && echo UNMOUNTED
insmod $HOME/bad.ko 2>&1; echo insmod:$?
echo evil > /proc/sys/kernel/hostname 2>&1 || echo NOHOSTNAME
kill -9 %d 2>&1; echo kill:$?
true`, img.Root, sentinel.Process.Pid)
	c = run(t, j, "root-a", script)
	out := string(c.Stdout)
	t.Logf("root's attempts:\n%s", out)
	for _, bad := range []string{secret, "CHOWNED", "MOUNTED", "UNMOUNTED", "Invalid module format", "insmod:0", "kill:0", "WROTE-LOWER"} {
		if strings.Contains(out, bad) {
			t.Errorf("BREACHED: %q in %q", bad, out)
		}
	}
	if !strings.Contains(out, "NOHOSTNAME") {
		t.Errorf("wrote the host name: %q", out)
	}
	if err := sentinel.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("BREACHED: the host sentinel died: %v", err)
	}
	if after := treeSum(t, img.Root); after != before {
		t.Error("BREACHED: the image's directory changed")
	}
	if b, _ := os.ReadFile(filepath.Join(home, "rootonly")); string(b) != secret {
		t.Errorf("the root-only file changed: %q", b)
	}
	var rst unix.Stat_t
	if err := unix.Stat(filepath.Join(home, "rootonly"), &rst); err != nil || rst.Uid != 0 {
		t.Errorf("the root-only file's owner changed: %d, %v", rst.Uid, err)
	}
}

// A registry that cannot be made (here under a file) leaves sandboxes
// unmapped, running as before, rather than refused.
func TestUsernsRegistryUnusable(t *testing.T) {
	testenv.RequireRoot(t)
	j, err := jail.New(jail.Config{StateDir: t.TempDir(), IDMapDir: "/dev/null/idmap"})
	if err != nil {
		t.Fatal(err)
	}
	started(t, j, "noreg", mechanism.Spec{})
	if b, _, _ := j.IDRange("noreg"); b != 0 {
		t.Fatalf("a range %d without a registry", b)
	}
	if c := run(t, j, "noreg", "id -u; cat /proc/self/uid_map"); !strings.HasPrefix(string(c.Stdout), "1000\n         0          0 4294967295") {
		t.Fatalf("%q %q", c.Stdout, c.Stderr)
	}
}

// Where an overlay cannot take an idmapped image layer (simulated: the
// probe's answer for the image's file system is a failure), an image
// whose user is root runs as before: as uid 1000 of the sandbox, which
// writes only its home and /tmp.
func TestImageRootWithoutIdmappedLayers(t *testing.T) {
	j := newJail(t)
	dir := t.TempDir()
	img := pullTestImage(t, dir, v1.Config{})
	jail.SimulateNoIdmap(t, img.Root)
	started(t, j, "noidmap", imageSpec(t, img))
	if b, _, _ := j.IDRange("noidmap"); b == 0 {
		t.Fatal("no range")
	}
	c := run(t, j, "noidmap", "id -u; for d in / /etc /usr/bin; do (echo x > $d/probe) 2>/dev/null && echo WROTE:$d; done; echo a > $HOME/f && echo HOME-OK")
	if string(c.Stdout) != "1000\nHOME-OK\n" {
		t.Fatalf("%q %q", c.Stdout, c.Stderr)
	}
}

// A home seeded before Provision (provider/local copies an image's
// /home/sprite there, which Commit may have saved from a mapped sandbox)
// is given the sandbox's ids: an inside id (1000) and another range's
// 1000 both become base+1000, root's 0 base+0; a link is changed, not
// followed.
func TestSeededHomeTakesTheRange(t *testing.T) {
	j := newJail(t)
	home := t.TempDir()
	os.Chmod(home, 0o755)
	write := func(p string, uid int) {
		if err := os.WriteFile(filepath.Join(home, p), []byte("seeded\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Lchown(filepath.Join(home, p), uid, uid)
	}
	os.Mkdir(filepath.Join(home, "d"), 0o755)
	write("a", 1000)
	write("d/b", 0x70000000+1000)
	os.Chown(filepath.Join(home, "d"), 1000, 1000)
	write("rootfile", 0)
	os.Symlink("/etc/hostname", filepath.Join(home, "l"))
	os.Lchown(filepath.Join(home, "l"), 1000, 1000)
	var host unix.Stat_t
	unix.Stat("/etc/hostname", &host)
	started(t, j, "seeded", mechanism.Spec{HomeDir: home})
	base, _, _ := j.IDRange("seeded")
	for p, want := range map[string]int{"a": base + 1000, "d": base + 1000, "d/b": base + 1000, "rootfile": base, "l": base + 1000} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(home, p), &st); err != nil || int(st.Uid) != want || int(st.Gid) != want {
			t.Errorf("%s: %d:%d (%v), want %d", p, st.Uid, st.Gid, err, want)
		}
	}
	var after unix.Stat_t
	unix.Stat("/etc/hostname", &after)
	if after.Uid != host.Uid || after.Gid != host.Gid {
		t.Fatalf("the link's target changed owner: %d:%d", after.Uid, after.Gid)
	}
	c := run(t, j, "seeded", "echo more >> $HOME/a && echo more >> $HOME/d/b && touch $HOME/d/c && cat $HOME/a")
	if string(c.Stdout) != "seeded\nmore\n" {
		t.Fatalf("%q %q", c.Stdout, c.Stderr)
	}
}

// A Provision that fails after claiming a range (here its home cannot be
// made) leaves no claim behind.
func TestFailedProvisionReleasesItsRange(t *testing.T) {
	testenv.RequireRoot(t)
	reg := t.TempDir()
	j, err := jail.New(jail.Config{StateDir: t.TempDir(), IDMapDir: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Provision(context.Background(), "nohome", mechanism.Spec{HomeDir: "/dev/null/home"}); err == nil {
		t.Fatal("provisioned with a home under /dev/null")
	}
	ents, _ := os.ReadDir(reg)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(reg, e.Name()))
		t.Errorf("claim %s left by a failed Provision: %q", e.Name(), b)
	}
	started(t, j, "ok", mechanism.Spec{})
	if ents, _ := os.ReadDir(reg); len(ents) != 1 {
		t.Fatalf("registry after one Provision: %v", ents)
	}
}

// Root of an image sandbox writes its whole root, and nothing beyond it:
// a host file the workload is given as stdin, writable by anyone, cannot
// be reopened for writing through /proc/self/fd (Landlock holds on every
// path outside the sandbox's root), though it can be read.
func TestImageRootWritesNothingBeyondItsRoot(t *testing.T) {
	j := newJail(t)
	img := pullTestImage(t, t.TempDir(), v1.Config{})
	started(t, j, "beyond", imageSpec(t, img))
	host := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(host, []byte("host content\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(host, 0o666)
	os.Chmod(filepath.Dir(host), 0o755)
	f, err := os.Open(host)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := j.Execute(context.Background(), "beyond", []string{"/bin/sh", "-c",
		"id -u; echo x > /usr/bin/inside && echo WROTE-ROOT; cat /proc/self/fd/0; (echo evil > /proc/self/fd/0) 2>&1 && echo WROTE-HOST"}, mechanism.ExecOptions{Stdin: f})
	if err != nil {
		t.Fatal(err)
	}
	out := string(c.Stdout)
	if !strings.HasPrefix(out, "0\nWROTE-ROOT\nhost content\n") || strings.Contains(out, "WROTE-HOST") {
		t.Fatalf("%q %q", out, c.Stderr)
	}
	if b, _ := os.ReadFile(host); string(b) != "host content\n" {
		t.Fatalf("BREACHED: the host file reads %q", b)
	}
	t.Logf("%s", out)
}

// The namespace made ahead of an init is an image's only: with that
// failing (simulated), a sandbox on the host's root is mapped all the
// same (its C init makes its own; the Go init is born in one).
func TestUsernsWithoutAHolder(t *testing.T) {
	j := newJail(t)
	jail.SimulateNoHolder(t)
	started(t, j, "noholder", mechanism.Spec{})
	base, _, _ := j.IDRange("noholder")
	c := run(t, j, "noholder", "id -u; cat /proc/self/uid_map; grep CapEff /proc/self/status")
	if want := fmt.Sprintf("1000\n%10d %10d %10d\nCapEff:\t0000000000000000\n", 0, base, 65536); string(c.Stdout) != want {
		t.Fatalf("%q %q, want %q", c.Stdout, c.Stderr, want)
	}
}

// Provisions racing in two Jails (two state directories, one registry)
// never get one range twice.
func TestUsernsRangesUnderConcurrentProvisions(t *testing.T) {
	testenv.RequireRoot(t)
	var js []*jail.Jail
	for range 2 {
		j, err := jail.New(jail.Config{StateDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		js = append(js, j)
	}
	ctx := context.Background()
	const n = 8
	errs := make(chan error, 2*n)
	for k, j := range js {
		for i := range n {
			go func() {
				id := fmt.Sprintf("c%d-%d", k, i)
				err := j.Provision(ctx, id, mechanism.Spec{})
				if err == nil {
					t.Cleanup(func() { j.Destroy(context.Background(), id) })
				}
				errs <- err
			}()
		}
	}
	for range 2 * n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	seen := map[int]string{}
	for k, j := range js {
		for i := range n {
			id := fmt.Sprintf("c%d-%d", k, i)
			b, _, err := j.IDRange(id)
			if err != nil || b == 0 {
				t.Fatalf("%s: range %d, %v", id, b, err)
			}
			if other, dup := seen[b]; dup {
				t.Fatalf("%s and %s share the range at %d", id, other, b)
			}
			seen[b] = id
		}
	}
}
