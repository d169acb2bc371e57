// Package etcfiles holds the files every managoat sandbox's /etc is
// generated with (the jail's root and the OCI bundles'), so that both
// mechanisms give a workload the same users, hosts and resolver.
package etcfiles

// Files are the generated /etc files of a sandbox named hostname: its
// users (root, sprite 1000:1000, nobody), its hosts and hostname, the
// sandbox's own resolver (127.0.0.53, served by the egress proxy in the
// sandbox's network namespace; with no network nothing answers there)
// and files-first lookups.
func Files(hostname string) map[string]string {
	return map[string]string{
		"passwd":        "root:x:0:0:root:/root:/bin/sh\nsprite:x:1000:1000:sprite:/home/sprite:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"group":         "root:x:0:\nsprite:x:1000:\nnogroup:x:65534:\n",
		"hosts":         "127.0.0.1\tlocalhost " + hostname + "\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"hostname":      hostname + "\n",
		"resolv.conf":   "nameserver 127.0.0.53\noptions edns0\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
	}
}
