package jail

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

// rtHarness exercises cinit_rt.c's functions directly: it is linked with
// the run-time alone, with the flags gencinit.sh uses, and prints one line
// per check ("ok name" or "FAIL name: detail"). A crash (a read past a
// string's precision, a vfork child that breaks its parent's frame) ends
// the program early, which the test reports.
const rtHarness = `
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
typedef long ssize_t;
int snprintf(char *, size_t, const char *, ...);
ssize_t write(int, const void *, size_t);
size_t strlen(const char *);
int strcmp(const char *, const char *);
long syscall(long, ...);
void *malloc(size_t);
void *calloc(size_t, size_t);
void free(void *);
void *memmove(void *, const void *, size_t);
int vfork(void);
int waitpid(int, int *, int);
int *__errno_location(void);
char *strerror(int);
__attribute__((noreturn)) void _exit(int);

static int failed;
static void say(const char *name, int ok, const char *detail) {
	char b[512];
	int n = snprintf(b, sizeof b, ok ? "ok %s\n" : "FAIL %s: %s\n", name, detail);
	write(1, b, (size_t)n < sizeof b ? (size_t)n : sizeof b - 1);
	if (!ok)
		failed = 1;
}

static void fmt(const char *name, const char *got, int gotn, const char *want, int wantn) {
	char d[300];
	snprintf(d, sizeof d, "got [%s] %d, want [%s] %d", got, gotn, want, wantn);
	say(name, strcmp(got, want) == 0 && gotn == wantn, d);
}

static int __attribute__((noinline)) deep(int n) {
	volatile char b[512];
	for (int i = 0; i < 512; i++)
		b[i] = (char)(n + i);
	return n ? deep(n - 1) + b[7] : 0;
}

static int __attribute__((noinline)) spawn_child(int *pidp) {
	volatile int a = 11, b = 22;
	int pid = vfork();
	if (pid == 0) {
		deep(40); /* clobber the stack below the parent's frame */
		*__errno_location() = 99;
		syscall(60, 7); /* exit (this thread) */
	}
	*pidp = pid;
	return a + b;
}

void ci_standalone(void) {
	char b[64];
	int n;

	b[0] = 'X';
	n = snprintf(b, 0, "abc");
	say("size 0 writes nothing", b[0] == 'X' && n == 3, "");
	n = snprintf(b, 1, "abc");
	fmt("size 1", b, n, "", 3);
	n = snprintf(b, 4, "abcdef");
	fmt("truncation", b, n, "abc", 6);
	n = snprintf(b, 8, "%20s", "x");
	fmt("width past size", b, n, "       ", 20);
	n = snprintf(b, sizeof b, "%.*s|", -1, "hello");
	fmt("negative precision", b, n, "hello|", 6);
	n = snprintf(b, sizeof b, "%.*s|", 2, "hello");
	fmt("precision", b, n, "he|", 3);
	n = snprintf(b, sizeof b, "%08x %x %u", 0xbeefu, 0u, 4294967295u);
	fmt("hex", b, n, "0000beef 0 4294967295", 21);
	n = snprintf(b, sizeof b, "%ld %d", (long)INT64_MIN, (int)INT32_MIN);
	fmt("minimums", b, n, "-9223372036854775808 -2147483648", 32);
	n = snprintf(b, sizeof b, "%s", (char *)0);
	fmt("null string", b, n, "(null)", 6);
	n = snprintf(b, sizeof b, "%zu %c%%", (size_t)-1, 'q');
	fmt("size_t", b, n, "18446744073709551615 q%", 23);
	n = snprintf(b, sizeof b, "abc%");
	fmt("trailing percent", b, n, "abc%", 4);

	/* %.*s must read at most the precision's bytes: a string that is
	 * not NUL-terminated, ending where the mapping ends. */
	long page = syscall(9, 0, 8192, 3, 0x22, -1, 0); /* mmap */
	syscall(10, page + 4096, 4096, 0); /* mprotect PROT_NONE */
	char *end = (char *)page + 4096 - 3;
	end[0] = 'a', end[1] = 'b', end[2] = 'c';
	n = snprintf(b, sizeof b, "%.*s", 3, end);
	fmt("precision bounds the read", b, n, "abc", 3);

	say("malloc(SIZE_MAX)", malloc((size_t)-1) == 0, "");
	say("malloc(SIZE_MAX-4000)", malloc((size_t)-1 - 4000) == 0, "");
	say("calloc overflow", calloc((size_t)1 << 33, (size_t)1 << 33) == 0, "");
	char *m = malloc(100000);
	say("malloc", m != 0 && ((uintptr_t)m & 15) == 0, "");
	for (int i = 0; i < 100000; i++)
		m[i] = (char)i;
	free(m);
	char mv[] = "abcdefgh";
	memmove(mv + 2, mv, 5);
	say("memmove up", strcmp(mv, "ababcdeh") == 0, mv);
	memmove(mv, mv + 2, 5);
	say("memmove down", strcmp(mv, "abcdedeh") == 0, mv);
	say("strerror", strcmp(strerror(95), "errno 95") == 0, strerror(95));

	for (int i = 0; i < 50; i++) {
		int pid = -1;
		*__errno_location() = 0;
		int r = spawn_child(&pid);
		int ws = 0;
		int w = waitpid(pid, &ws, 0x40000000 /* __WALL */);
		char d[100];
		snprintf(d, sizeof d, "r %d pid %d wait %d status %x", r, pid, w, ws);
		if (r != 33 || pid <= 0 || w != pid || ws != 0x700) {
			say("vfork", 0, d);
			break;
		}
		if (i == 49)
			say("vfork", 1, d);
	}
	write(1, "done\n", 5);
	_exit(failed);
}
`

// TestStandaloneRuntime checks cinit_rt.c's formatting, allocation and
// vfork against their C-library contracts.
func TestStandaloneRuntime(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the standalone run-time is x86-64 only")
	}
	gcc, err := exec.LookPath("gcc")
	testenv.Require(t, err == nil, "gcc is needed to build the run-time's harness")
	dir := t.TempDir()
	src := filepath.Join(dir, "harness.c")
	if err := os.WriteFile(src, []byte(rtHarness), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "harness")
	args := []string{"-std=gnu11", "-O2", "-static", "-nostdlib", "-nostartfiles", "-ffreestanding", "-fno-builtin",
		"-fno-stack-protector", "-fno-asynchronous-unwind-tables", "-fno-pie", "-no-pie",
		"-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0", "-Wall", "-Wno-unused-function",
		"-o", bin, src, "cinit_rt.c"}
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("build the harness: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	text := string(out)
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if strings.HasPrefix(line, "FAIL") {
			t.Error(line)
		}
	}
	if err != nil || !strings.HasSuffix(strings.TrimSpace(text), "done") {
		t.Fatalf("the harness ended early (%v):\n%s", err, text)
	}
}
