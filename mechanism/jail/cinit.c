//go:build cgo

// (The build constraint is cgo's; gencinit.sh compiles this file too.)

// The jail's init in C.
//
// Started as a Go program, a sandbox's init pays the Go runtime's start-up
// and every package's init (2-4 ms and 7-11 MiB resident here, for a
// binary the size of managoat) before it can serve. This file is built
// twice. gencinit.sh links it with cinit_rt.c, a freestanding run-time,
// into a static program with no C library that the jail embeds and
// executes (the default on x86-64). And cgo links it into every binary
// that imports the package: there its constructor runs before the Go
// runtime exists, as runc's nsexec does, and when the helper variable says
// "cinit" the process never becomes a Go program. Either way it uses only
// what cinit_rt.c provides. It is used only on the path where the
// manager has already done all the privileged work (startRestricted): the
// init was born in its namespaces, pivoted into its root, with exactly
// SETUID, SETGID and KILL, no_new_privs and the Landlock ruleset. What is
// left is small enough to keep in C: check that state, load the seccomp
// program the manager assembled, and serve the control socket (proto.go).
//
// It is one thread and one epoll loop: the listener, a signalfd for
// SIGCHLD, and the connections. It closes, first thing, every descriptor
// the manager's process left open besides 0-2 and the three it was given;
// every descriptor
// it makes is close-on-exec, and a command's child marks everything but
// 0, 1 and 2 close-on-exec before exec: no workload inherits the control
// socket or anything of the host. Each command gets a session of its own
// (setsid), so neither it nor its descendants can join another command's
// process group or the init's; signals and kills go to the command's
// group and to the command itself. The init resets every signal
// disposition to the default first thing, so workloads start with the
// defaults whatever the manager inherited (nohup included).
//
// Commands are started with vfork: the loop waits for each exec. A
// workload that holds a write lease on a file the manager then executes
// can stall its own sandbox's init for the lease-break time (45 s by
// default); the manager's waits are bounded, and no other sandbox is
// affected.
//
// Keep in step with proto.go (the wire format) and cInitConfig (cinit.go).

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef CLONE_NEWUSER
#define CLONE_NEWUSER 0x10000000
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

#define CI_FD_LISTENER 3
#define CI_FD_CONFIG 4
#define CI_FD_READY 5
#define CI_FD_USERNS 6 /* with flag 4: the user namespace to join */

#define CI_MAX_PACKET (1 << 20)
#define CI_MAX_STRINGS (1 << 16)
#define CI_CONFIG_MAGIC 0x4943474du /* "MGCI" */
#define CI_CONFIG_VERSION 2u
#define CI_MAX_FILTER 4096
/* A command's open-file limit (jail.go workloadNoFile): soft, and the
 * most its hard limit is, at most the init's own. */
#define CI_NOFILE_SOFT 1024u
#define CI_NOFILE_HARD 65536u

struct ci_config {
	uint32_t magic, version, uid, gid, flags, keep0, keep1, nfilter;
	/* With flags 4, 8 or 16: the host id that owns the sandbox's user
	 * namespace (its range's first, base; 0: the host's root). */
	uint32_t owner;
};

/* A connection: awaiting its request, or bound to the process it started. */
struct ci_conn {
	int fd;
	pid_t pid; /* 0 until a process is started */
	int kill_on_close;
	int peer_closed;
	struct ci_conn *next;
};

static struct ci_config cfg;
/* struct rlimit64: what every command's RLIMIT_NOFILE is set to. */
static struct {
	uint64_t cur, max;
} nofile;
static struct sock_filter filter[CI_MAX_FILTER];
static struct ci_conn *conns;
static int pending; /* connections that have not sent their request yet */
#define CI_MAX_PENDING 1024
static int epfd = -1, sigfd = -1;
static char *packet; /* CI_MAX_PACKET bytes, one request at a time */

/* Sentinels for epoll: the listener and the signalfd are not connections. */
static int tag_listener, tag_signal;

static void ci_fail(const char *fmt, ...) {
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	char line[600];
	int n = snprintf(line, sizeof line, "error: %s\n", msg);
	if (n > (int)sizeof line - 1)
		n = sizeof line - 1;
	if (write(CI_FD_READY, line, n) < 0) { /* nobody to tell */
	}
	dprintf(2, "managoat jail init: %s", line);
	_exit(1);
}

static int read_full(int fd, void *buf, size_t n) {
	char *p = buf;
	while (n > 0) {
		ssize_t r = read(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= r;
	}
	return 0;
}

static void read_config(void) {
	if (read_full(CI_FD_CONFIG, &cfg, sizeof cfg) < 0)
		ci_fail("read launch config: %s", strerror(errno ? errno : EIO));
	if (cfg.magic != CI_CONFIG_MAGIC || cfg.version != CI_CONFIG_VERSION)
		ci_fail("launch config: bad magic or version");
	if (cfg.nfilter == 0 || cfg.nfilter > CI_MAX_FILTER)
		ci_fail("launch config: %u seccomp instructions", cfg.nfilter);
	if (read_full(CI_FD_CONFIG, filter, cfg.nfilter * sizeof filter[0]) < 0)
		ci_fail("read seccomp program: short");
	if (cfg.flags & (8 | 16))
		return; /* the pipe stays open: unshare_userns, hold_userns */
	char extra;
	if (read(CI_FD_CONFIG, &extra, 1) != 0)
		ci_fail("launch config: trailing bytes");
	close(CI_FD_CONFIG);
}

/* The init must have been born with exactly the kept capabilities and
 * no_new_privs (checkRestricted in Go); an init that is not restricted
 * never serves. */
static void check_restricted(void) {
	struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &hdr, d) != 0)
		ci_fail("capget: %s", strerror(errno));
	uint32_t keep[2] = {cfg.keep0, cfg.keep1};
	for (int i = 0; i < 2; i++) {
		if (d[i].permitted != keep[i] || d[i].effective != keep[i] || d[i].inheritable != 0)
			ci_fail("init born with capabilities %08x/%08x/%08x (word %d), want %08x", d[i].permitted,
				d[i].effective, d[i].inheritable, i, keep[i]);
	}
	if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1)
		ci_fail("init born without no_new_privs");
}

/* become_owner takes the host ids that own (or are to own) the
 * sandbox's user namespace, cfg.owner, before the namespace is made or
 * joined. The kernel charges the per-user counts of every process in a
 * user namespace (inotify instances and watches, pending signals, message
 * queue bytes, processes, ...) to the namespace's owner in its parent as
 * well: owned by the host's root, every sandbox used up root's quotas
 * (128 inotify instances in one made host root's inotify_init1 fail with
 * EMFILE) and the other sandboxes'. Owned by base, a uid no host user and
 * no other sandbox has, each sandbox has quotas of its own. As the
 * owner's euid the process holds every capability in the namespace
 * (joined or made); in the host's it keeps none. */
static void become_owner(void) {
	if (cfg.owner == 0)
		return;
	/* SECBIT_NO_SETUID_FIXUP (1 << 2), where the process may set it (the
	 * holder, started with every capability: its namespace is then made
	 * with them, as the host's root made it, which a host restricting
	 * unprivileged user namespaces tells apart); an init, born without
	 * CAP_SETPCAP, drops its three at the setresuid, and gets its
	 * namespace's. */
	(void)prctl(PR_SET_SECUREBITS, 1 << 2, 0, 0, 0);
	if (syscall(SYS_setgroups, 0, NULL) != 0 || syscall(SYS_setresgid, cfg.owner, cfg.owner, cfg.owner) != 0 ||
	    syscall(SYS_setresuid, cfg.owner, cfg.owner, cfg.owner) != 0)
		ci_fail("become the owner %u of the sandbox's user namespace: %s", cfg.owner, strerror(errno));
}

/* With flag 4 the manager made the sandbox's user namespace (mapping its
 * range, owned by the host's root, whose child it is) and passed it at
 * CI_FD_USERNS: the init, still the host's root, joins it (as the owner's
 * euid it holds every capability there) and becomes its root (host id
 * base), instead of being cloned into a new one, which the manager could
 * not do with vfork (userns_prep.go). */
static void join_userns(void) {
	if (!(cfg.flags & 4)) {
		close(CI_FD_USERNS); /* nothing, or the memory file executed */
		return;
	}
	become_owner(); /* the owner's euid holds every capability in it */
	if (syscall(SYS_setns, CI_FD_USERNS, CLONE_NEWUSER) != 0)
		ci_fail("join the sandbox's user namespace: %s", strerror(errno));
	close(CI_FD_USERNS);
	if (syscall(SYS_setgroups, 0, NULL) != 0 || syscall(SYS_setresgid, 0, 0, 0) != 0 ||
	    syscall(SYS_setresuid, 0, 0, 0) != 0)
		ci_fail("become root of the sandbox's user namespace: %s", strerror(errno));
}

/* Flag 16: not an init. The manager wants a user namespace made ahead of a
 * sandbox's init (an image's idmapped layer is mounted with it): this
 * process makes one, says so, and exits at the end of the config pipe,
 * which the manager closes once it has mapped the namespace and holds it
 * (or by dying). It runs nothing else, and is started with vfork, unlike
 * a child cloned into a new user namespace (userns_image.go, holdUserns). */
static void hold_userns(void) {
	become_owner();
	if (syscall(SYS_unshare, CLONE_NEWUSER) != 0)
		ci_fail("make a user namespace: %s", strerror(errno));
	if (write(CI_FD_READY, "userns\n", 7) != 7)
		_exit(1);
	for (;;) {
		char c;
		ssize_t r = read(CI_FD_CONFIG, &c, 1);
		if (r == 0 || (r < 0 && errno != EINTR))
			_exit(0);
	}
}

/* With flag 8 (a sandbox on the host's root) the init makes the sandbox's
 * user namespace itself (no capability needed: it is single-threaded and
 * its root is its mount namespace's), says "userns" on the ready pipe and
 * waits on the config pipe for the manager, root of the host, to write
 * its uid_map and gid_map ('m', then the pipe's end), then becomes its
 * root (host id base). No process is made for it (userns_prep.go). */
static void unshare_userns(void) {
	if (!(cfg.flags & 8))
		return;
	become_owner();
	if (syscall(SYS_unshare, CLONE_NEWUSER) != 0)
		ci_fail("make the sandbox's user namespace: %s", strerror(errno));
	if (write(CI_FD_READY, "userns\n", 7) != 7)
		_exit(1);
	char go = 0, extra;
	if (read_full(CI_FD_CONFIG, &go, 1) < 0 || go != 'm')
		ci_fail("the manager did not map the user namespace");
	if (read(CI_FD_CONFIG, &extra, 1) != 0)
		ci_fail("launch config: trailing bytes");
	close(CI_FD_CONFIG);
	if (syscall(SYS_setgroups, 0, NULL) != 0 || syscall(SYS_setresgid, 0, 0, 0) != 0 ||
	    syscall(SYS_setresuid, 0, 0, 0) != 0)
		ci_fail("become root of the sandbox's user namespace: %s", strerror(errno));
}

/* A mapped sandbox's init (flag 2) is born root of a user namespace of
 * its own, which starts with every capability there, its bounding set
 * included (userns.go): it lowers them to the kept ones before anything
 * else, CAP_SETPCAP (which the drops need) last. They are capabilities
 * of that namespace only; the host's it never had. */
static void lower_caps(void) {
	if (!(cfg.flags & 2))
		return;
	uint32_t keep[2] = {cfg.keep0, cfg.keep1};
	for (int c = 0; c < 64; c++) {
		if (c == CAP_SETPCAP || (keep[c / 32] & (1u << (c % 32))))
			continue;
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL)
			ci_fail("drop capability %d from the bounding set: %s", c, strerror(errno));
	}
	if (!(keep[0] & (1u << CAP_SETPCAP)) && prctl(PR_CAPBSET_DROP, CAP_SETPCAP, 0, 0, 0) != 0)
		ci_fail("drop CAP_SETPCAP from the bounding set: %s", strerror(errno));
	struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2] = {{keep[0], keep[0], 0}, {keep[1], keep[1], 0}};
	if (syscall(SYS_capset, &hdr, d) != 0)
		ci_fail("capset: %s", strerror(errno));
}

static void load_seccomp(void) {
	struct sock_fprog prog = {(unsigned short)cfg.nfilter, filter};
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0)
		ci_fail("seccomp: %s", strerror(errno));
}

static void send_reply(int fd, char kind, int not_found, int32_t pid, int32_t code, int32_t sig, const char *msg) {
	char b[16 + 1024];
	memset(b, 0, 16);
	b[0] = kind;
	b[1] = not_found ? 1 : 0;
	memcpy(b + 4, &pid, 4);
	memcpy(b + 8, &code, 4);
	memcpy(b + 12, &sig, 4);
	size_t n = 16;
	if (msg) {
		size_t m = strlen(msg);
		if (m > sizeof b - 16)
			m = sizeof b - 16;
		memcpy(b + 16, msg, m);
		n += m;
	}
	if (send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* the caller left */
	}
}

static void send_error(int fd, int not_found, const char *fmt, ...) {
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	send_reply(fd, 'e', not_found, 0, 0, 0, msg);
}

static void drop_conn(struct ci_conn *c) {
	if (c->pid == 0)
		pending--;
	struct ci_conn **pp = &conns;
	while (*pp && *pp != c)
		pp = &(*pp)->next;
	if (*pp)
		*pp = c->next;
	close(c->fd); /* also removes it from the epoll set */
	free(c);
}

/* A parsed spawn request; strings point into one NUL-terminated block. */
struct ci_spawn {
	char **argv, **envp, *dir, *block;
	int kill_on_close, collect;
};

static void free_spawn(struct ci_spawn *s) {
	free(s->argv);
	free(s->envp);
	free(s->block);
	memset(s, 0, sizeof *s);
}

/* parse_strings reads a u32 count then that many u32-length strings from
 * [*p, end), copying each NUL-terminated into *out. */
static int parse_strings(const char **p, const char *end, char ***vec, char **out, uint32_t *total) {
	uint32_t n;
	if (end - *p < 4)
		return -1;
	memcpy(&n, *p, 4);
	*p += 4;
	if (n > CI_MAX_STRINGS || *total + n > CI_MAX_STRINGS || n > (uint32_t)(end - *p) / 4)
		return -1;
	*total += n;
	char **v = calloc(n + 1, sizeof *v);
	if (!v)
		return -1;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t len;
		if (end - *p < 4) {
			free(v);
			return -1;
		}
		memcpy(&len, *p, 4);
		*p += 4;
		if (len > (uint32_t)(end - *p) || memchr(*p, 0, len)) {
			free(v);
			return -1;
		}
		memcpy(*out, *p, len);
		(*out)[len] = 0;
		v[i] = *out;
		*out += len + 1;
		*p += len;
	}
	*vec = v;
	return 0;
}

static int parse_spawn(const char *b, size_t n, struct ci_spawn *s) {
	memset(s, 0, sizeof *s);
	const char *p = b + 8, *end = b + n;
	s->kill_on_close = (b[1] & 1) != 0;
	s->collect = (b[1] & 2) != 0;
	/* Every string fits in n bytes plus one NUL each; the count of strings
	 * is at most n/4. */
	s->block = malloc(n + n / 4 + 2);
	if (!s->block)
		return -1;
	char *out = s->block;
	uint32_t total = 0;
	if (parse_strings(&p, end, &s->argv, &out, &total) < 0)
		goto bad;
	if (parse_strings(&p, end, &s->envp, &out, &total) < 0)
		goto bad;
	uint32_t len;
	if (end - p < 4)
		goto bad;
	memcpy(&len, p, 4);
	p += 4;
	if (len != (uint32_t)(end - p) || memchr(p, 0, len))
		goto bad;
	memcpy(out, p, len);
	out[len] = 0;
	s->dir = out;
	return 0;
bad:
	free_spawn(s);
	return -1;
}

/* executable is 0 when p names a regular-enough file with an execute bit,
 * else an errno (EACCES for a directory or no execute bit). */
static int executable(const char *p) {
	struct stat st;
	if (stat(p, &st) != 0)
		return errno;
	if (S_ISDIR(st.st_mode) || (st.st_mode & 0111) == 0)
		return EACCES;
	return 0;
}

/* look_path resolves argv[0] as the Go init's lookPath does: a name with
 * a slash is taken relative to dir, any other is searched in the PATH of
 * the command's environment (relative entries relative to dir). */
static int look_path(const struct ci_spawn *s, char *out, size_t outlen, char *err, size_t errlen) {
	const char *file = s->argv[0];
	if (strchr(file, '/')) {
		int n = file[0] == '/' ? snprintf(out, outlen, "%s", file) : snprintf(out, outlen, "%s/%s", s->dir, file);
		if (n < 0 || (size_t)n >= outlen) {
			snprintf(err, errlen, "executable %s: name too long", file);
			return -1;
		}
		int e = executable(out);
		if (e) {
			snprintf(err, errlen, "executable %s: %s", file, strerror(e));
			return -1;
		}
		return 0;
	}
	const char *path = "";
	for (char **e = s->envp; *e; e++)
		if (strncmp(*e, "PATH=", 5) == 0)
			path = *e + 5; /* the last one wins, as in Go */
	const char *p = path;
	for (;;) {
		const char *colon = strchr(p, ':');
		size_t dl = colon ? (size_t)(colon - p) : strlen(p);
		int n;
		if (dl == 0)
			n = snprintf(out, outlen, "%s/%s", s->dir, file);
		else if (p[0] == '/')
			n = snprintf(out, outlen, "%.*s/%s", (int)dl, p, file);
		else
			n = snprintf(out, outlen, "%s/%.*s/%s", s->dir, (int)dl, p, file);
		if (n >= 0 && (size_t)n < outlen && executable(out) == 0)
			return 0;
		if (!colon)
			break;
		p = colon + 1;
	}
	snprintf(err, errlen, "executable %s not found in PATH %s", file, path);
	return -1;
}

/* child runs between vfork and exec, on the parent's memory with the
 * parent suspended: it changes nothing the parent reads afterwards (the
 * descriptors are moved in a copy, errno is the only shared write, read
 * by the parent only when vfork failed) and makes only raw system calls
 * (no libc state, no setxid broadcast). */
static void child(const struct ci_spawn *s, const char *path, const int fds[3], int errw) {
	/* Every disposition is already the default (ci_main): only the mask,
	 * which blocks SIGCHLD for the signalfd, is reset. */
	sigset_t none;
	sigemptyset(&none);
	int fd[3] = {fds[0], fds[1], fds[2]};
	long r = syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, sizeof(long));
	/* A session of its own: as its leader the command cannot leave its
	 * process group, nor can any of its descendants join another
	 * command's (or the init's) group. */
	if (r == 0)
		r = syscall(SYS_setsid) < 0 ? -1 : 0;
	/* A terminal on stdin (a PTY session) becomes the session's
	 * controlling terminal, for job control; on anything else the call
	 * fails (ENOTTY) and changes nothing. */
	if (r == 0)
		(void)syscall(SYS_ioctl, fd[0], TIOCSCTTY, 0);
	if (r == 0 && !(cfg.flags & 1)) /* not rootless: become the workload's uid */
		r = syscall(SYS_setgroups, 0, NULL) || syscall(SYS_setgid, cfg.gid) || syscall(SYS_setuid, cfg.uid);
	if (r == 0)
		r = syscall(SYS_chdir, s->dir);
	if (r == 0)
		r = syscall(SYS_prlimit64, 0, 7 /* RLIMIT_NOFILE */, &nofile, NULL);
	for (int i = 0; r == 0 && i < 3; i++) /* above 2, so dup2 clobbers none of them */
		if (fd[i] < 3 && (fd[i] = (int)syscall(SYS_fcntl, fd[i], F_DUPFD_CLOEXEC, 3)) < 0)
			r = -1;
	for (int i = 0; r == 0 && i < 3; i++)
		if (syscall(SYS_dup2, fd[i], i) < 0)
			r = -1;
	/* Nothing but 0, 1 and 2 crosses the exec (the init's own are all
	 * close-on-exec as well). */
	if (r == 0)
		r = syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC);
	if (r == 0)
		syscall(SYS_execve, path, s->argv, s->envp);
	int e = errno;
	syscall(SYS_write, errw, &e, sizeof e);
	syscall(SYS_exit, 127);
}

static void start_process(struct ci_conn *c, struct ci_spawn *s, int fds[3]) {
	struct stat st;
	if (stat(s->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
		send_error(c->fd, 1, "working directory %s: not a directory", s->dir);
		drop_conn(c);
		return;
	}
	char path[4096], err[1024];
	if (look_path(s, path, sizeof path, err, sizeof err) < 0) {
		send_error(c->fd, 1, "%s", err);
		drop_conn(c);
		return;
	}
	int ep[2];
	if (pipe2(ep, O_CLOEXEC) != 0) {
		send_error(c->fd, 0, "start %s: pipe: %s", path, strerror(errno));
		drop_conn(c);
		return;
	}
	/* vfork: no copy of the init's page tables and no copy-on-write
	 * faults after it; the init waits only until the exec. */
	pid_t pid = vfork();
	if (pid == 0)
		child(s, path, fds, ep[1]);
	int forkerr = errno;
	close(ep[1]);
	if (pid < 0) {
		close(ep[0]);
		send_error(c->fd, 0, "start %s: fork: %s", path, strerror(forkerr));
		drop_conn(c);
		return;
	}
	int e = 0;
	ssize_t r;
	do
		r = read(ep[0], &e, sizeof e);
	while (r < 0 && errno == EINTR);
	close(ep[0]);
	if (r > 0) { /* exec failed: reap the child now, report the errno */
		while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR) {
		}
		send_error(c->fd, e == ENOENT || e == EACCES || e == ENOTDIR, "start %s: %s", path, strerror(e));
		drop_conn(c);
		return;
	}
	c->pid = pid;
	pending--;
	c->kill_on_close = s->kill_on_close;
	if (!s->collect)
		send_reply(c->fd, 's', 0, pid, 0, 0, NULL);
}

/* on_request handles the first packet of a connection. */
static void on_request(struct ci_conn *c) {
	char cbuf[CMSG_SPACE(8 * sizeof(int))];
	struct iovec iov = {packet, CI_MAX_PACKET};
	struct msghdr mh = {0};
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = cbuf;
	mh.msg_controllen = sizeof cbuf;
	ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	int fds[8], nfds = 0;
	/* A failed recvmsg leaves msg_controllen as it was: cbuf is then
	 * uninitialized and its "descriptors" are not ours to close. */
	if (n < 0)
		mh.msg_controllen = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (int i = 0; i < k && nfds < 8; i++)
			memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
	}
	if (n <= 0) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		drop_conn(c);
		return;
	}
	if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || n < 8) {
		send_error(c->fd, 0, "bad request: %s",
			   n < 8 ? "truncated packet" : (mh.msg_flags & MSG_TRUNC) ? "over the size limit" : "more than three descriptors");
	} else if (packet[0] == 'P') {
		send_reply(c->fd, 'p', 0, 0, 0, 0, NULL);
	} else if (packet[0] != 'X') {
		send_error(c->fd, 0, "bad request: kind %d before a process", packet[0]);
	} else if (nfds != 3) {
		send_error(c->fd, 0, "bad request: need argv and three descriptors");
	} else {
		struct ci_spawn s;
		if (parse_spawn(packet, n, &s) < 0) {
			send_error(c->fd, 0, "bad request: malformed spawn request");
		} else if (!s.argv[0]) {
			free_spawn(&s);
			send_error(c->fd, 0, "bad request: empty argv");
		} else {
			start_process(c, &s, fds);
			free_spawn(&s);
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			return;
		}
	}
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	drop_conn(c);
}

/* on_running handles a packet (a signal) or the hang-up of a connection
 * bound to a process. */
static void on_running(struct ci_conn *c) {
	char b[64];
	ssize_t n = recv(c->fd, b, sizeof b, MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		if (c->kill_on_close) {
			kill(-c->pid, SIGKILL);
			kill(c->pid, SIGKILL);
		}
		c->peer_closed = 1;
		epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
		return;
	}
	if (n >= 8 && b[0] == 'S') {
		uint32_t sig;
		memcpy(&sig, b + 4, 4);
		if (sig > 0 && sig <= 64) {
			kill(-c->pid, (int)sig);
			kill(c->pid, (int)sig); /* the group's leader, wherever it is */
		}
	}
}

static void on_sigchld(void) {
	struct signalfd_siginfo si;
	while (read(sigfd, &si, sizeof si) == sizeof si) {
	}
	for (;;) {
		int ws;
		pid_t pid = waitpid(-1, &ws, WNOHANG | __WALL);
		if (pid <= 0)
			return;
		for (struct ci_conn *c = conns; c; c = c->next) {
			if (c->pid != pid)
				continue;
			if (!c->peer_closed) {
				int32_t code = 0, sig = 0;
				if (WIFEXITED(ws))
					code = WEXITSTATUS(ws);
				else if (WIFSIGNALED(ws))
					sig = WTERMSIG(ws), code = 128 + sig;
				send_reply(c->fd, 'x', 0, 0, code, sig, NULL);
			}
			drop_conn(c);
			break;
		}
		/* anything else was an orphan: reaped, nobody waits for it */
	}
}

static void on_accept(void) {
	for (;;) {
		int fd = accept4(CI_FD_LISTENER, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS)
				usleep(10000); /* never spin while out of descriptors */
			return;
		}
		if (pending >= CI_MAX_PENDING) { /* never more idle clients than this */
			close(fd);
			continue;
		}
		struct ci_conn *c = calloc(1, sizeof *c);
		struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
		if (!c || epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
			free(c);
			close(fd);
			continue;
		}
		pending++;
		c->fd = fd;
		c->next = conns;
		conns = c;
	}
}

static void ci_main(void) {
	/* Defaults for every signal; SIGCHLD arrives on the signalfd. As pid 1
	 * of its pid namespace the init gets no default-action signal from
	 * inside the sandbox, and SIGKILL from the host. */
	struct sigaction dfl;
	memset(&dfl, 0, sizeof dfl);
	dfl.sa_handler = SIG_DFL;
	for (int sig = 1; sig < 65; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			sigaction(sig, &dfl, NULL);
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_SETMASK, &chld, NULL);
	/* Whatever else the manager's process held without close-on-exec (a
	 * descriptor its own parent left it, say) is not the sandbox's: a
	 * directory descriptor would let a workload read the host. */
	if (syscall(SYS_close_range, CI_FD_USERNS + 1, ~0U, 0) != 0)
		for (int fd = CI_FD_USERNS + 1; fd < 65536; fd++)
			close(fd);

	read_config();
	if (syscall(SYS_prlimit64, 0, 7 /* RLIMIT_NOFILE */, NULL, &nofile) != 0)
		ci_fail("getrlimit: %s", strerror(errno));
	if (nofile.max > CI_NOFILE_HARD)
		nofile.max = CI_NOFILE_HARD;
	nofile.cur = nofile.max < CI_NOFILE_SOFT ? nofile.max : CI_NOFILE_SOFT;
	if (cfg.flags & 16)
		hold_userns(); /* never returns */
	join_userns(); /* closes CI_FD_USERNS in any case */
	unshare_userns();
	if (chdir("/") != 0)
		ci_fail("chdir /: %s", strerror(errno));
	lower_caps();
	check_restricted();
	if (fcntl(CI_FD_LISTENER, F_SETFD, FD_CLOEXEC) != 0 || fcntl(CI_FD_READY, F_SETFD, FD_CLOEXEC) != 0)
		ci_fail("descriptors: %s", strerror(errno));
	int fl = fcntl(CI_FD_LISTENER, F_GETFL);
	if (fl < 0 || fcntl(CI_FD_LISTENER, F_SETFL, fl | O_NONBLOCK) != 0)
		ci_fail("listener: %s", strerror(errno));
	packet = malloc(CI_MAX_PACKET);
	sigfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	epfd = epoll_create1(EPOLL_CLOEXEC);
	if (!packet || sigfd < 0 || epfd < 0)
		ci_fail("set up: %s", strerror(errno));
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &tag_listener};
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, CI_FD_LISTENER, &ev) != 0)
		ci_fail("epoll: %s", strerror(errno));
	ev.data.ptr = &tag_signal;
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, sigfd, &ev) != 0)
		ci_fail("epoll: %s", strerror(errno));
	load_seccomp(); /* last: from here on the deny-list holds */
	if (write(CI_FD_READY, "ready\n", 6) != 6)
		_exit(1);
	close(CI_FD_READY);

	struct epoll_event evs[64];
	for (;;) {
		int n = epoll_wait(epfd, evs, 64, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			_exit(1);
		}
		/* SIGCHLD first, so an exit is matched before its connection's
		 * hang-up is taken for an abandonment. */
		for (int i = 0; i < n; i++)
			if (evs[i].data.ptr == &tag_signal)
				on_sigchld();
		for (int i = 0; i < n; i++) {
			void *p = evs[i].data.ptr;
			if (p == &tag_signal)
				continue;
			if (p == &tag_listener) {
				on_accept();
				continue;
			}
			struct ci_conn *c = p;
			int live = 0; /* the connection may have been dropped above */
			for (struct ci_conn *k = conns; k; k = k->next)
				if (k == c) {
					live = 1;
					break;
				}
			if (!live)
				continue;
			if (c->pid == 0)
				on_request(c);
			else if (!c->peer_closed)
				on_running(c);
		}
	}
}

#ifdef CI_STANDALONE
/* The standalone init (cinit_rt.c's entry point). */
void ci_standalone(void) {
	ci_main();
	_exit(1);
}
#else
__attribute__((constructor, used)) static void managoat_jail_cinit(void) {
	const char *mode = getenv("MANAGOAT_JAIL_HELPER");
	if (mode && strcmp(mode, "cinit") == 0) {
		ci_main();
		_exit(1);
	}
}
#endif
