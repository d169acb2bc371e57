//go:build ignore

// The freestanding run-time of the jail's standalone C init (x86-64).
//
// cinit.c is compiled twice: into the managoat binary by cgo (its
// constructor runs when the binary is re-executed as an init), and, with
// this file and -DCI_STANDALONE, into a small static executable that the
// jail embeds (cinit_amd64.elf, made by gencinit.sh) and executes instead
// of the whole managoat binary. That executable links no C library: the
// C library's start-up (the dynamic loader, the CPU feature probe, its
// tunables) costs more than everything the init does before it serves,
// and what the init needs of it is a few dozen system calls. This file
// is that subset: the entry point, the system-call wrappers cinit.c
// calls, an allocator over mmap, and the string and formatting functions
// its messages use. Nothing here is thread-safe: the init is one thread.
//
// The C library's headers are deliberately not included: they declare
// some of these functions with attributes and transparent unions that
// would clash; the definitions here follow the x86-64 calling convention
// that cinit.c's calls use.

#include <asm/unistd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

typedef long ssize_t;

static int ci_errno;

int *__errno_location(void) { return &ci_errno; }

static long sc6(long n, long a, long b, long c, long d, long e, long f) {
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}

static long ret(long r) {
	if (r < 0 && r > -4096) {
		ci_errno = (int)-r;
		return -1;
	}
	return r;
}

#define SC(n, a, b, c, d, e, f) ret(sc6(n, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f)))

long syscall(long n, ...) {
	va_list ap;
	va_start(ap, n);
	long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
	long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
	va_end(ap);
	return SC(n, a, b, c, d, e, f);
}

__attribute__((noreturn)) void _exit(int code) {
	for (;;)
		sc6(__NR_exit_group, code, 0, 0, 0, 0, 0);
}

ssize_t read(int fd, void *b, size_t n) { return SC(__NR_read, fd, b, n, 0, 0, 0); }
ssize_t write(int fd, const void *b, size_t n) { return SC(__NR_write, fd, b, n, 0, 0, 0); }
int close(int fd) { return (int)SC(__NR_close, fd, 0, 0, 0, 0, 0); }
int chdir(const char *p) { return (int)SC(__NR_chdir, p, 0, 0, 0, 0, 0); }
int kill(int pid, int sig) { return (int)SC(__NR_kill, pid, sig, 0, 0, 0, 0); }
int pipe2(int fds[2], int flags) { return (int)SC(__NR_pipe2, fds, flags, 0, 0, 0, 0); }
int stat(const char *p, void *st) { return (int)SC(__NR_newfstatat, -100 /* AT_FDCWD */, p, st, 0, 0, 0); }
int waitpid(int pid, int *status, int opts) { return (int)SC(__NR_wait4, pid, status, opts, 0, 0, 0); }
int epoll_create1(int flags) { return (int)SC(__NR_epoll_create1, flags, 0, 0, 0, 0, 0); }
int epoll_ctl(int ep, int op, int fd, void *ev) { return (int)SC(__NR_epoll_ctl, ep, op, fd, ev, 0, 0); }
int epoll_wait(int ep, void *evs, int n, int ms) { return (int)SC(__NR_epoll_wait, ep, evs, n, ms, 0, 0); }
int signalfd(int fd, const void *mask, int flags) { return (int)SC(__NR_signalfd4, fd, mask, 8, flags, 0, 0); }
int accept4(int fd, void *addr, void *len, int flags) { return (int)SC(__NR_accept4, fd, addr, len, flags, 0, 0); }
ssize_t recvmsg(int fd, void *mh, int flags) { return SC(__NR_recvmsg, fd, mh, flags, 0, 0, 0); }
ssize_t recv(int fd, void *b, size_t n, int flags) { return SC(__NR_recvfrom, fd, b, n, flags, 0, 0); }
ssize_t send(int fd, const void *b, size_t n, int flags) { return SC(__NR_sendto, fd, b, n, flags, 0, 0); }

int fcntl(int fd, int cmd, ...) {
	va_list ap;
	va_start(ap, cmd);
	long arg = va_arg(ap, long);
	va_end(ap);
	return (int)SC(__NR_fcntl, fd, cmd, arg, 0, 0, 0);
}

int prctl(int op, ...) {
	va_list ap;
	va_start(ap, op);
	long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long), d = va_arg(ap, long);
	va_end(ap);
	return (int)SC(__NR_prctl, op, a, b, c, d, 0);
}

int usleep(unsigned us) {
	long ts[2] = {us / 1000000, (long)(us % 1000000) * 1000};
	return (int)SC(__NR_nanosleep, ts, 0, 0, 0, 0, 0);
}

/* Signal sets: the kernel's 64 bits at the start of the C library's
 * larger sigset_t, which is all the calls below pass on. */
int sigemptyset(void *set) {
	*(uint64_t *)set = 0;
	return 0;
}

int sigaddset(void *set, int sig) {
	if (sig < 1 || sig > 64) {
		ci_errno = 22; /* EINVAL */
		return -1;
	}
	*(uint64_t *)set |= 1ULL << (sig - 1);
	return 0;
}

int sigprocmask(int how, const void *set, void *old) { return (int)SC(__NR_rt_sigprocmask, how, set, old, 8, 0, 0); }

/* sigaction sets only what cinit.c asks of it: the default disposition
 * (a handler would need a restorer, which the init never installs). */
int sigaction(int sig, const void *act, void *old) {
	struct {
		void *handler;
		unsigned long flags;
		void *restorer;
		uint64_t mask;
	} k = {0};
	if (act) {
		/* The C library's struct sigaction starts with the handler. */
		k.handler = *(void *const *)act;
		if (k.handler != (void *)0) { /* SIG_DFL only */
			ci_errno = 22;
			return -1;
		}
	}
	(void)old;
	return (int)SC(__NR_rt_sigaction, sig, act ? &k : 0, 0, 8, 0, 0);
}

/* vfork must not return through a frame the child could have changed:
 * the return address is kept in a register across the call. */
__asm__(".text\n"
	".globl vfork\n"
	".type vfork,@function\n"
	"vfork:\n"
	"	pop %rdx\n"
	"	mov $" "58" ", %eax\n" /* __NR_vfork */
	"	syscall\n"
	"	push %rdx\n"
	"	mov %rax, %rdi\n"
	"	jmp ci_vfork_ret\n");

long ci_vfork_ret(long r) { return ret(r); }

/* The allocator: one anonymous mapping per block, its size in front. The
 * init allocates a few blocks per request and frees them all. */
void *malloc(size_t n) {
	size_t total = (n + 16 + 4095) & ~(size_t)4095;
	if (n > ((size_t)1 << 40))
		return 0;
	long p = sc6(__NR_mmap, 0, (long)total, 3 /* PROT_READ|PROT_WRITE */, 0x22 /* MAP_PRIVATE|MAP_ANONYMOUS */, -1, 0);
	if (p < 0 && p > -4096) {
		ci_errno = (int)-p;
		return 0;
	}
	*(size_t *)p = total;
	return (char *)p + 16;
}

void *calloc(size_t n, size_t size) {
	if (size && n > (size_t)-1 / size) {
		ci_errno = 12; /* ENOMEM */
		return 0;
	}
	return malloc(n * size); /* fresh mappings are zero */
}

void free(void *p) {
	if (!p)
		return;
	char *base = (char *)p - 16;
	sc6(__NR_munmap, (long)base, (long)*(size_t *)base, 0, 0, 0, 0);
}

void *memcpy(void *dst, const void *src, size_t n) {
	char *d = dst;
	const char *s = src;
	while (n--)
		*d++ = *s++;
	return dst;
}

void *memmove(void *dst, const void *src, size_t n) {
	char *d = dst;
	const char *s = src;
	if (d < s)
		while (n--)
			*d++ = *s++;
	else
		while (n--)
			d[n] = s[n];
	return dst;
}

void *memset(void *dst, int c, size_t n) {
	char *d = dst;
	while (n--)
		*d++ = (char)c;
	return dst;
}

int memcmp(const void *a, const void *b, size_t n) {
	const unsigned char *x = a, *y = b;
	for (; n; n--, x++, y++)
		if (*x != *y)
			return *x - *y;
	return 0;
}

void *memchr(const void *p, int c, size_t n) {
	const unsigned char *s = p;
	for (; n; n--, s++)
		if (*s == (unsigned char)c)
			return (void *)s;
	return 0;
}

size_t strlen(const char *s) {
	size_t n = 0;
	while (s[n])
		n++;
	return n;
}

char *strchr(const char *s, int c) {
	for (;; s++) {
		if (*s == (char)c)
			return (char *)s;
		if (!*s)
			return 0;
	}
}

int strncmp(const char *a, const char *b, size_t n) {
	for (; n; n--, a++, b++) {
		if (*a != *b)
			return (unsigned char)*a - (unsigned char)*b;
		if (!*a)
			return 0;
	}
	return 0;
}

int strcmp(const char *a, const char *b) { return strncmp(a, b, (size_t)-1); }

/* strerror: the names of the errors the init reports; others by number. */
char *strerror(int e) {
	static const struct {
		int e;
		const char *s;
	} names[] = {
		{1, "operation not permitted"}, {2, "no such file or directory"}, {4, "interrupted system call"},
		{5, "input/output error"}, {7, "argument list too long"}, {8, "exec format error"},
		{9, "bad file descriptor"}, {11, "resource temporarily unavailable"}, {12, "cannot allocate memory"},
		{13, "permission denied"}, {20, "not a directory"}, {21, "is a directory"}, {22, "invalid argument"},
		{23, "too many open files in system"}, {24, "too many open files"}, {26, "text file busy"},
		{36, "file name too long"}, {40, "too many levels of symbolic links"}, {105, "no buffer space available"},
	};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (names[i].e == e)
			return (char *)names[i].s;
	static char buf[32];
	char tmp[16];
	int n = 0;
	unsigned u = e < 0 ? (unsigned)-e : (unsigned)e;
	do
		tmp[n++] = (char)('0' + u % 10);
	while ((u /= 10) && n < 15);
	const char *pre = "errno ";
	size_t k = 0;
	while (*pre)
		buf[k++] = *pre++;
	while (n)
		buf[k++] = tmp[--n];
	buf[k] = 0;
	return buf;
}

/* vsnprintf: the conversions cinit.c's messages use: %s %d %u %x %c %%,
 * with a 0 flag, a width, and a precision (digits or *) for %s. */
int vsnprintf(char *out, size_t size, const char *f, va_list ap) {
	size_t n = 0;
#define PUT(ch)                           \
	do {                              \
		if (n + 1 < size)         \
			out[n] = (char)(ch); \
		n++;                      \
	} while (0)
	for (; *f; f++) {
		if (*f != '%') {
			PUT(*f);
			continue;
		}
		f++;
		int zero = 0, width = 0, prec = -1;
		if (*f == '0') {
			zero = 1;
			f++;
		}
		while (*f >= '0' && *f <= '9')
			width = width * 10 + (*f++ - '0');
		if (*f == '.') {
			f++;
			if (*f == '*') {
				prec = va_arg(ap, int);
				f++;
			} else {
				prec = 0;
				while (*f >= '0' && *f <= '9')
					prec = prec * 10 + (*f++ - '0');
			}
		}
		int lng = 0;
		while (*f == 'l' || *f == 'z') {
			lng = 1;
			f++;
		}
		char num[24];
		int len = 0;
		switch (*f) {
		case 's': {
			const char *s = va_arg(ap, const char *);
			if (!s)
				s = "(null)";
			int l = 0;
			/* Never a byte past the precision: the string need
			 * not be terminated within it. */
			while ((prec < 0 || l < prec) && s[l])
				l++;
			for (int i = l; i < width; i++)
				PUT(' ');
			for (int i = 0; i < l; i++)
				PUT(s[i]);
			continue;
		}
		case 'c':
			PUT(va_arg(ap, int));
			continue;
		case 'd': {
			long v = lng ? va_arg(ap, long) : va_arg(ap, int);
			unsigned long u = v < 0 ? -(unsigned long)v : (unsigned long)v;
			do
				num[len++] = (char)('0' + u % 10);
			while ((u /= 10));
			if (v < 0)
				num[len++] = '-';
			break;
		}
		case 'u':
		case 'x': {
			unsigned long u = lng ? va_arg(ap, unsigned long) : va_arg(ap, unsigned);
			unsigned base = *f == 'x' ? 16 : 10;
			do
				num[len++] = "0123456789abcdef"[u % base];
			while ((u /= base));
			break;
		}
		case '%':
			PUT('%');
			continue;
		default: /* not one cinit.c uses: shown as it was written */
			PUT('%');
			if (*f)
				PUT(*f);
			else
				f--;
			continue;
		}
		for (int i = len; i < width; i++)
			PUT(zero ? '0' : ' ');
		while (len)
			PUT(num[--len]);
	}
	if (size)
		out[n < size ? n : size - 1] = 0;
#undef PUT
	return (int)n;
}

int snprintf(char *out, size_t size, const char *f, ...) {
	va_list ap;
	va_start(ap, f);
	int n = vsnprintf(out, size, f, ap);
	va_end(ap);
	return n;
}

int dprintf(int fd, const char *f, ...) {
	char b[1024];
	va_list ap;
	va_start(ap, f);
	int n = vsnprintf(b, sizeof b, f, ap);
	va_end(ap);
	if (n > (int)sizeof b - 1)
		n = sizeof b - 1;
	return (int)write(fd, b, (size_t)n);
}

/* CMSG_NXTHDR's out-of-line form, should the compiler not inline it. */
struct ci_cmsghdr {
	size_t len;
	int level, type;
};

struct ci_msghdr {
	void *name;
	unsigned namelen;
	void *iov;
	size_t iovlen;
	void *control;
	size_t controllen;
	int flags;
};

struct ci_cmsghdr *__cmsg_nxthdr(struct ci_msghdr *mh, struct ci_cmsghdr *cm) {
	if (cm->len < sizeof *cm)
		return 0;
	cm = (struct ci_cmsghdr *)((unsigned char *)cm + ((cm->len + sizeof(size_t) - 1) & ~(sizeof(size_t) - 1)));
	unsigned char *end = (unsigned char *)mh->control + mh->controllen;
	if ((unsigned char *)(cm + 1) > end || (unsigned char *)cm + ((cm->len + sizeof(size_t) - 1) & ~(sizeof(size_t) - 1)) > end)
		return 0;
	return cm;
}

void ci_standalone(void);

/* The entry point: the init takes nothing from its arguments or its
 * environment (the manager gives it an empty one). */
__asm__(".text\n"
	".globl _start\n"
	"_start:\n"
	"	xor %rbp, %rbp\n"
	"	and $-16, %rsp\n"
	"	call ci_standalone\n"
	"	hlt\n");
